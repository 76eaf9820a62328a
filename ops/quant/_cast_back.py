"""Dequantization: ``cast_back``, ``per_token_cast_back`` and ``unpack_from_e2m1fn_x2``.

Same names, signatures, defaults and outputs as ``tile_kernels.quant`` 1.0.0.  ``cast_back``
turns a quantized ``(data, sf)`` pair back into a contiguous bf16 (``fmt='bf16'``) or fp32
(``'fp32'``) tensor ``[tokens, hidden]``: ``decode(data) * sf`` of the element's block, one fp32
multiply rounded once to the output dtype, bit-identical to ``tile_kernels.torch.cast_back`` /
``cast_back_from_e5m6``.  Data: float8_e4m3fn, int8 packing two e2m1 values per byte (low nibble
first), or with ``x_special_fmt='e5m6'`` uint8 ``[tokens, hidden * 3 // 2]`` of packed E5M6.
Scales: fp32 row-major, fp32 column-major (``sf.stride(0) == 1``) or packed-UE8M0 int32
(column-major), shaped for ``x_block_size = (tokens per scale, channels per scale)``.

Supported: e4m3 / e2m1 with ``hidden % 64 == 0`` (as tile_kernels), e5m6 with ``hidden % 8 ==
0``; each block dimension a power of two, or at least the whole dimension (e.g. ``(1, hidden)``).

Every argument is validated before any GPU work (:class:`tilebin.runtime.ArgumentError` naming
the op, the value received, what is supported and the fix; the device is checked last).  Data
that is not contiguous or not 16-byte aligned is copied first.  The kernels run on torch's
current stream.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.compiler import is_compiling

from .._common import TRACING, aligned_input, check_cuda, fail, launcher, ptr, typed_key
from .._torch import TorchOp, traced, pair_to_public, pair_to_schema
from ._sf import input_sf

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_OUT = {"bf16": (torch.bfloat16, "bfloat16"), "fp32": (torch.float32, "float32")}
_DATA_FMT = {torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}
_INT32_MAX = 2**31 - 1
_WHOLE = 31  # shift for a block spanning its dimension: every index maps to block 0
# e2m1 code -> value; code 8 is -0.0 (sign bit set on a zero magnitude)
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_out_fmt(op: str, fmt: Any) -> tuple[torch.dtype, str]:
    if not isinstance(fmt, str) or fmt not in _OUT:
        raise fail(op, f"fmt={fmt!r} is not supported; supported: 'bf16', 'fp32' (the output dtype)")
    return _OUT[fmt]


def _block_shift(op: str, what: str, size: Any, extent: int) -> int:
    """Shift that maps an index to its block: log2 of a power-of-two block, or ``_WHOLE``."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise fail(op, f"x_block_size {what} must be a positive int, got {size!r}")
    if size & (size - 1) == 0:
        return size.bit_length() - 1
    if size >= extent:
        return _WHOLE
    raise fail(op, f"x_block_size {what}={size} is not supported for a dimension of {extent}: a block must be "
                   f"a power of two or span the whole dimension (use e.g. {1 << (size.bit_length() - 1)})")


def _check_sf(op: str, user_sf: torch.Tensor, sf: torch.Tensor, layout, tokens: int, hidden: int) -> None:
    """The kernel-orientation ``sf`` has the shape ``layout`` gives for a tokens x hidden input."""
    if tuple(sf.shape) != tuple(layout.shape(tokens, hidden)):
        m, k = layout.blocks(tokens, hidden)
        want = (m, _cdiv(k, 4)) if layout.packed_ue8m0 else (m, k)
        raise fail(op, f"x's sf has shape {tuple(user_sf.shape)} but blocks {tuple(layout.block)} of a {tokens} x "
                       f"{hidden} input need {want} ({layout.kind} layout); pass the sf the cast returned for "
                       "this x_block_size")


def _prepare_data(data: torch.Tensor) -> torch.Tensor:
    """``data`` contiguous with a 16-byte aligned pointer (a copy only when needed)."""
    if not data.is_contiguous():
        data = data.contiguous()
    if ptr(data) % 16:
        data = data.clone()
    return data


def _read_input(op: str, x: Any, x_block_size: Any, special: Optional[str]):
    """Validate a (data, sf) input; returns (data, kernel sf, layout, data fmt, tokens, hidden,
    (shift_t, shift_c))."""
    if not isinstance(x, tuple) or len(x) != 2:
        raise fail(op, f"x must be a (data, sf) tuple, got {type(x).__name__}")
    data, sf, layout = input_sf(op, x, x_block_size)
    if data.dim() != 2:
        raise fail(op, f"x's data must be 2-D [tokens, hidden], got shape {tuple(data.shape)}")
    tokens = data.size(0)
    if special == "e5m6":
        if data.dtype != torch.uint8:
            raise fail(op, f"x_special_fmt='e5m6' needs uint8 packed data, got {data.dtype}")
        if data.size(1) % 12:
            raise fail(op, f"E5M6 data has {data.size(1)} bytes per row; it must be a multiple of 12 "
                           "(hidden % 8 == 0, 8 values in 12 bytes)")
        fmt, hidden = "e5m6", data.size(1) * 2 // 3
    else:
        if data.dtype not in _DATA_FMT:
            raise fail(op, f"x's data has dtype {data.dtype}; supported: float8_e4m3fn (e4m3), int8 (packed e2m1); "
                           "uint8 is packed E5M6: pass x_special_fmt='e5m6'")
        fmt = _DATA_FMT[data.dtype]
        hidden = data.size(1) * (2 if fmt == "e2m1" else 1)
        if hidden % 64:
            raise fail(op, f"hidden={hidden} is not supported: e4m3/e2m1 cast_back needs hidden % 64 == 0")
    shifts = (_block_shift(op, "tokens per scale", x_block_size[0], tokens),
              _block_shift(op, "channels per scale", x_block_size[1], hidden))
    _check_sf(op, x[1], sf, layout, tokens, hidden)
    if tokens * hidden > _INT32_MAX:
        raise fail(op, f"the output has {tokens * hidden} elements; at most {_INT32_MAX} (32-bit indexing): "
                       "split the tokens into smaller calls")
    return data, sf, layout, fmt, tokens, hidden, shifts


class _Plan:
    """The launch of ``cast_back`` for one validated configuration (data dtype and width, scale
    layout and block, output dtype): everything but the token count and the pointers.  The checked
    path builds one and runs it; the memo (``_FAST``) keeps it for later calls, so both paths
    allocate and launch through this one piece of code."""

    __slots__ = ("hidden", "out_dtype", "name", "key", "shifts", "fn")

    def __init__(self, in_fmt: str, out_dtype: torch.dtype, out_key: str, kind: str, hidden: int,
                 shifts: tuple[int, int]) -> None:
        self.hidden = hidden
        self.out_dtype = out_dtype
        if in_fmt == "e5m6":
            self.name, self.key = "quant.cast_back_e5m6", dict(out_dtype=out_key, sf_kind=kind)
        else:
            self.name, self.key = "quant.cast_back", dict(in_fmt=in_fmt, out_dtype=out_key, sf_kind=kind)
        self.shifts = shifts
        self.fn = None  # the launcher, looked up at the first launch

    def __call__(self, data: torch.Tensor, sf: torch.Tensor, tokens: int) -> torch.Tensor:
        """The output for ``data`` and kernel-orientation ``sf`` (validated for this configuration)."""
        out = torch.empty((tokens, self.hidden), dtype=self.out_dtype, device=data.device)
        if tokens == 0:
            return out
        data, sf = _prepare_data(data), aligned_input(sf)
        fn = self.fn
        if fn is None:
            fn = self.fn = launcher(self.name, **self.key)
        fn(data, sf, out, *self.shifts)
        return out


class _Fast:
    """A memoized configuration: the checks that depend on the token count, then the plan."""

    __slots__ = ("plan", "block_t", "sf_cols", "col", "packed")

    def __init__(self, plan: _Plan, block_t: int, sf_cols: int, col: bool, packed: bool) -> None:
        self.plan, self.block_t, self.sf_cols, self.col, self.packed = plan, block_t, sf_cols, col, packed

    def __call__(self, data: torch.Tensor, sf: torch.Tensor) -> Optional[torch.Tensor]:
        """The output, or None when a check fails (the checked path then says why)."""
        tokens = data.shape[0]
        if tokens * self.plan.hidden > _INT32_MAX or sf.shape != (-(-tokens // self.block_t), self.sf_cols):
            return None
        if self.col:  # as input_sf: the kernel reads the transpose (packed UE8M0: its bytes)
            sf = sf.T.view(torch.uint8) if self.packed else sf.T
        elif sf.stride(1) != 1:
            return None
        return self.plan(data, sf, tokens)


_FAST: dict[tuple, _Fast] = {}
_FAST_MAX = 256  # memoized cast_back configurations


def cast_back(
    x: QuantTensor,
    fmt: str,
    x_block_size: tuple[int, int],
    x_special_fmt: Optional[str] = None,
) -> torch.Tensor:
    """Dequantize ``x = (data, sf)`` to a new contiguous ``[tokens, hidden]`` tensor of ``fmt``
    ('bf16' or 'fp32'); ``x_block_size = (tokens, channels)`` per scale; ``x_special_fmt``
    None (e4m3 / packed e2m1 data) or 'e5m6' (packed E5M6 uint8 data).  See the module docstring.

    A configuration whose checks passed before (data dtype, dim, width and device; sf dtype, dim,
    device and whether ``sf.stride(0) == 1``; fmt; x_block_size with its types, a power-of-two
    token block; x_special_fmt) skips them (a dict lookup): per call only the token count, sf's
    shape (and for row-major sf its last stride) and the 32-bit element limit are checked."""
    if is_compiling() and not TRACING.on:
        return traced("cast_back", x, fmt, x_block_size, x_special_fmt)
    key = None
    if type(x) is tuple and len(x) == 2:
        data, sf = x
        try:  # types too: True == 1 == 1.0 hash alike, but the checks take ints only
            key = typed_key(data.dtype, data.dim(), data.shape[-1], data.device, sf.dtype, sf.dim(), sf.stride(0) == 1,
                   sf.device, fmt, x_block_size, x_special_fmt)
            fast = _FAST.get(key)
        except (AttributeError, TypeError, IndexError):  # not tensors, an unhashable argument: the checks say
            key, fast = None, None
        if fast is not None:
            out = fast(data, sf)
            if out is not None:
                return out
    return _cast_back_checked(x, fmt, x_block_size, x_special_fmt, key)


def _cast_back_checked(x: Any, fmt: Any, x_block_size: Any, x_special_fmt: Any,
                       memo_key: Optional[tuple]) -> torch.Tensor:
    """:func:`cast_back` with every check; memoizes its configuration under ``memo_key`` (when
    given) once every check passed."""
    op = "cast_back"
    out_dtype, out_key = _check_out_fmt(op, fmt)
    if x_special_fmt not in (None, "e5m6"):
        raise fail(op, f"x_special_fmt={x_special_fmt!r} is not supported; supported: None, 'e5m6'")
    data, sf, layout, in_fmt, tokens, hidden, shifts = _read_input(op, x, x_block_size, x_special_fmt)
    check_cuda(op, data=data, sf=sf)
    plan = _Plan(in_fmt, out_dtype, out_key, layout.kind, hidden, shifts)
    out = plan(data, sf, tokens)
    block_t = x_block_size[0]
    if memo_key is not None and block_t & (block_t - 1) == 0 and len(_FAST) < _FAST_MAX:
        # a power-of-two token block: its shift does not depend on the token count
        _, k = layout.blocks(tokens, hidden)
        _FAST[memo_key] = _Fast(plan, block_t, _cdiv(k, 4) if layout.packed_ue8m0 else k, layout.col_major,
                                layout.packed_ue8m0)
    return out


def per_token_cast_back(
    x: QuantTensor,
    fmt: str,
    num_per_channels: int,
    x_special_fmt: Optional[str] = None,
) -> torch.Tensor:
    """``cast_back(x, fmt, (1, num_per_channels), x_special_fmt)``: one scale per token and group."""
    if is_compiling() and not TRACING.on:
        return traced("per_token_cast_back", x, fmt, num_per_channels, x_special_fmt)
    return cast_back(x, fmt, (1, num_per_channels), x_special_fmt=x_special_fmt)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed e2m1 bytes (int8 / uint8 ``[..., k]``, low nibble first) into ``out_dtype``
    values ``[..., 2 k]`` on ``x``'s device (torch ops, any device; code 8 gives -0.0)."""
    if is_compiling() and not TRACING.on:
        return traced("unpack_from_e2m1fn_x2", x, out_dtype)
    op = "unpack_from_e2m1fn_x2"
    if not isinstance(x, torch.Tensor):
        raise fail(op, f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.int8, torch.uint8):
        raise fail(op, f"x has dtype {x.dtype}; supported: int8, uint8 (two e2m1 values per byte)")
    if x.dim() == 0:
        raise fail(op, "x must have at least 1 dimension (the packed one, doubled in the output)")
    if not isinstance(out_dtype, torch.dtype):
        raise fail(op, f"out_dtype must be a torch.dtype, got {out_dtype!r}")
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=x.device)
    byte = x.view(torch.uint8).to(torch.int64)
    codes = torch.stack((byte & 0xF, byte >> 4), dim=-1)
    return table[codes].reshape(*x.shape[:-1], x.shape[-1] * 2).to(out_dtype)


# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (
    TorchOp("cast_back", "(Tensor x, Tensor x_sf, str fmt, int[] x_block_size, str? x_special_fmt=None) -> Tensor",
            cast_back, lambda *a: _cast_back_checked(*a, None), pair_to_schema, pair_to_public),
    TorchOp("per_token_cast_back", "(Tensor x, Tensor x_sf, str fmt, int num_per_channels, str? x_special_fmt=None) "
                                   "-> Tensor", per_token_cast_back,
            lambda x, fmt, n, special: _cast_back_checked(x, fmt, (1, n), special, None), pair_to_schema,
            pair_to_public),
    TorchOp("unpack_from_e2m1fn_x2", "(Tensor x, ScalarType out_dtype) -> Tensor", unpack_from_e2m1fn_x2),
)


__all__ = ["cast_back", "per_token_cast_back", "unpack_from_e2m1fn_x2"]
