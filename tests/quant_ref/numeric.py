"""Comparison helpers for quantization tests (plain torch; CPU or CUDA tensors).

``assert_equal`` is the bit-exact check every kernel output goes through; its failure message is
written for someone who never sees the GPU: how many elements differ, where the first ones are,
and both values (as numbers and as raw bits).
"""

import math

import torch

# Integer dtypes of each element size: raw bits are compared and printed through these.
_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_SHOW = 8


def _dense_flat(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as a fresh 1-D tensor with stride 1 (``contiguous()`` keeps odd strides of
    size-1 dims, e.g. a 1 x 1 column-major scale tensor, which byte views then reject)."""
    flat = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
    flat.copy_(t.reshape(-1))
    return flat


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bits of each element of ``t`` as a contiguous 1-D integer tensor."""
    flat = _dense_flat(t)
    if flat.dtype == torch.bool:
        return flat.to(torch.uint8)
    return flat.view(_BITS_DTYPE[flat.element_size()])


def _show(t: torch.Tensor, bits: torch.Tensor, flat_index: int) -> str:
    value = t.contiguous().reshape(-1)[flat_index]
    number = value.item() if not value.is_floating_point() else value.float().item()
    width = 2 * t.element_size()
    return f"{number!r} (0x{int(bits[flat_index].item()) & ((1 << (4 * width)) - 1):0{width}x})"


def describe_mismatch(x: torch.Tensor, y: torch.Tensor, name: str = "tensor", any_nan: bool = False) -> str:
    """A message listing how many elements of same-shaped ``x`` and ``y`` differ bitwise, and the
    first few (index, x value, y value); empty when they are bit-identical.  With ``any_nan`` (float
    dtypes) a NaN matches any NaN, whatever its sign and payload."""
    bx, by = _bits(x), _bits(y)
    mismatch = bx != by
    if any_nan and x.is_floating_point():
        both_nan = torch.isnan(x.contiguous().reshape(-1).float()) & torch.isnan(y.contiguous().reshape(-1).float())
        mismatch &= ~both_nan
    differ = torch.nonzero(mismatch).reshape(-1)
    if differ.numel() == 0:
        return ""
    lines = [f"{name}: {differ.numel()} of {bx.numel()} elements differ (shape {tuple(x.shape)}, {x.dtype})"]
    for flat in differ[:_SHOW].tolist():
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), x.shape))
        lines.append(f"  at {index}: got {_show(x, bx, flat)}, expected {_show(y, by, flat)}")
    if differ.numel() > _SHOW:
        lines.append(f"  ... and {differ.numel() - _SHOW} more")
    return "\n".join(lines)


def _layout_strides(t: torch.Tensor) -> tuple:
    """Strides that matter for the memory layout: those of dimensions of size 1 never do (torch
    itself gives them arbitrary values, e.g. ``(T, 1)`` column-major sf comes as ``(1, 1)`` from a
    transpose of a contiguous tensor and as ``(1, pad4(T))`` from a sliced allocation)."""
    return tuple(s if n != 1 else None for n, s in zip(t.shape, t.stride()))


def assert_equal(
    x: torch.Tensor, y: torch.Tensor, name: str = "tensor", check_stride: bool = True, any_nan: bool = False
) -> None:
    """Assert ``x`` (actual) and ``y`` (expected) are identical: dtype, shape, device, strides (only
    when non-empty, ignoring dimensions of size 1, and unless ``check_stride`` is False) and the
    raw bits of every element (so NaN payloads and -0.0 count, unless ``any_nan``: then a NaN
    matches any NaN; use it where NaN inputs are fed, as the sign and payload of a NaN result
    differ between CPU SIMD paths and the GPU).  Raises AssertionError with a readable message
    naming ``name``."""
    if x.dtype != y.dtype:
        raise AssertionError(f"{name}: dtype {x.dtype}, expected {y.dtype}")
    if x.shape != y.shape:
        raise AssertionError(f"{name}: shape {tuple(x.shape)}, expected {tuple(y.shape)}")
    if x.device != y.device:
        raise AssertionError(f"{name}: device {x.device}, expected {y.device}")
    if check_stride and x.numel() > 0 and _layout_strides(x) != _layout_strides(y):
        raise AssertionError(f"{name}: strides {x.stride()}, expected {y.stride()} (shape {tuple(x.shape)})")
    message = describe_mismatch(x, y, name, any_nan)
    if message:
        raise AssertionError(message)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """``1 - 2 <x, y> / (|x|^2 + |y|^2)`` in float64 (0 for identical tensors, 0.0 when both are
    all zero); the relative-error measure the cast-back thresholds (e4m3 1e-3, e2m1 2e-2) use."""
    x, y = x.double(), y.double()
    denominator = (x * x + y * y).sum()
    if denominator.item() == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denominator)


def check_bias(x: torch.Tensor, ref: torch.Tensor) -> None:
    """Assert the rounding in ``x`` (e.g. cast-back values) is unbiased against ``ref``: the share of
    elements below ``ref`` (ties counting half) is within ``10 / sqrt(n)`` of 1/2 (a ~10 sigma band
    for fair coin flips).  Empty tensors pass."""
    count = x.numel()
    if count == 0:
        return
    x, ref = x.double(), ref.double()
    less = int((x < ref).sum().item())
    equal = int((x == ref).sum().item())
    ratio = (less + equal / 2) / count
    allowed = 10 / math.sqrt(count)
    if abs(ratio - 0.5) >= allowed:
        raise AssertionError(
            f"biased rounding: {less} of {count} below the reference, {equal} equal, "
            f"{count - less - equal} above; below-ratio {ratio:.4f} is not within {allowed:.4f} of 0.5"
        )


def clear_unused_sf(sf: torch.Tensor, hidden: int, num_per_channels: int) -> torch.Tensor:
    """Packed-UE8M0 sf bytes as uint8 ``[rows, pad4(groups)]`` (row-major copy, ``groups =
    ceil(hidden / num_per_channels)``) with the padding bytes past ``groups`` zeroed, so two sf
    tensors can be compared whatever the padding holds.  ``sf`` itself is left unchanged."""
    groups = -(-hidden // num_per_channels)
    padded = -(-groups // 4) * 4
    dense = torch.empty(sf.shape, dtype=sf.dtype, device=sf.device)
    dense.copy_(sf)
    out = dense.reshape(-1).view(torch.uint8).reshape(-1, padded).clone()
    out[:, groups:] = 0
    return out


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill every byte of ``t``'s storage with 0xFF (NaN in fp32/bf16/fp16/e4m3, -1 in ints, -6 pairs
    in packed e2m1) and return ``t``; padding reached only through strides is poisoned too."""
    t.untyped_storage().fill_(0xFF)
    return t


def poison_like(t: torch.Tensor) -> torch.Tensor:
    """A new tensor with ``t``'s shape, strides, dtype and device, every byte 0xFF."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return poison_(out)


def assert_all_written(t: torch.Tensor, name: str = "tensor") -> None:
    """Assert no element of ``t`` still holds the all-0xFF poison pattern.  Only meaningful where that
    pattern cannot be a real result: float dtypes (it is a NaN), and uint8 / int32 UE8M0 scale
    bytes (exponent 255); raises TypeError for other dtypes (int8 packed e2m1: 0xFF is -6, -6)."""
    if t.is_floating_point():
        bits = _bits(t)
        poisoned = bits == (-1 if bits.dtype != torch.uint8 else 0xFF)
    elif t.dtype in (torch.uint8, torch.int32):
        poisoned = _bits(_dense_flat(t).view(torch.uint8)) == 0xFF
    else:
        raise TypeError(f"assert_all_written: 0xFF is a valid {t.dtype} value, cannot tell unwritten from written")
    count = int(poisoned.sum().item())
    if count:
        first = torch.nonzero(poisoned).reshape(-1)[:_SHOW].tolist()
        raise AssertionError(
            f"{name}: {count} elements/bytes were never written (still 0xFF), first flat indices {first}"
        )
