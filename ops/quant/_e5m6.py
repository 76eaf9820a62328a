"""Per-token cast to E5M6: ``per_token_cast_to_e5m6``, which ``per_token_cast(x, 'e5m6', ...)`` runs.

E5M6 keeps the top 12 bits of an IEEE half (sign, 5 exponent bits, 6 mantissa bits; largest
value 65024) and packs 8 values into 3 uint32 words.  One scale per token:
``sf = max(amax, 1e-4) / 65024`` (``round_sf``: rounded up to a power of two).  Same signature,
defaults and outputs as ``tile_kernels.quant``'s E5M6 path (1.0.0), bit-identical to
``tile_kernels.torch.cast_to_e5m6``: data uint8 ``[tokens, hidden * 3 // 2]``; sf fp32
``[tokens, 1]`` (row-major, or column-major with ``use_tma_aligned_col_major_sf``), or with
``use_packed_ue8m0`` int32 ``[tokens, 1]`` column-major holding the exponent byte (the three
padding bytes are 0).

Supported: x bf16 / fp32, 2-D, ``num_per_channels == hidden``, ``hidden % 8 == 0``, at most
2**31 - 1 elements; packed UE8M0 needs ``use_tma_aligned_col_major_sf`` and ``round_sf``.  Every
argument is validated before any GPU work (:class:`tilebin.runtime.ArgumentError` worded as
``per_token_cast(fmt='e5m6')``, as the op is reached through per_token_cast; the device is
checked last).  A row stride that is not 16-byte aligned, a non-unit column stride or a
misaligned pointer costs a copy of x.  Kernels (same parameters and bits):
``quant.per_token_cast_e5m6`` for bf16, ``quant.per_token_cast_e5m6_fp32`` for fp32; they run on
torch's current stream.

Declared by :data:`E5M6` (``ops/_spec.py``): a configuration (x's dtype, hidden size and device,
num_per_channels and the flags with their types) is checked once; a later call of it checks
only the element count (which depends on the token count) and launches.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._common import ptr, check_cuda, check_flag, check_tensor, fail, kernel_meta, launcher
from .._spec import OpSpec
from ._per_token_checks import Deferred, deferred
from ._sf import SfLayout, output_layout

QuantTensor = tuple[torch.Tensor, torch.Tensor]

OP = "per_token_cast(fmt='e5m6')"  # the op as its errors name it
_KERNEL = "quant.per_token_cast_e5m6"  # bf16 input
# fp32 input: same parameters and bits as _KERNEL; tokens_per_block sized by its meta "cached_units"
_FP32_KERNEL = "quant.per_token_cast_e5m6_fp32"
_DTYPE_KEY = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
_INT32_MAX = 2**31 - 1
_FLAGS = ("use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0")


def _tokens_per_block(hidden: int) -> int:
    """Tokens sharing a 128-thread block of the bf16 kernel: each thread keeps up to 8 units of 8
    values."""
    units = hidden // 8
    return 4 if units <= 256 else (2 if units <= 512 else 1)


def _fp32_tokens_per_block(hidden: int) -> int:
    """Tokens per 128-thread block of the fp32 kernel: as many as keep every unit of a thread
    cached (``cached_units`` per thread), at least 1."""
    per_block = 128 * kernel_meta(_FP32_KERNEL, "cached_units")  # units one block keeps cached
    units = hidden // 8
    return 4 if 4 * units <= per_block else (2 if 2 * units <= per_block else 1)


def _kernel_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its rows are 16-byte aligned with unit column stride, else a copy."""
    per_vector = 16 // x.element_size()
    stride = x.stride(0)
    rows_ok = 0 <= stride <= _INT32_MAX and (x.size(0) <= 1 or (stride > 0 and stride % per_vector == 0))
    if x.stride(1) == 1 and rows_ok and ptr(x) % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _check_elements(tokens: int, hidden: int) -> None:
    if tokens * hidden > _INT32_MAX:
        raise fail(OP, f"x has {tokens * hidden} elements; at most {_INT32_MAX} (32-bit indexing): split the tokens")


def _validate(x: Any, num_per_channels: Any) -> int:
    """x's hidden size, checked with num_per_channels."""
    check_tensor(OP, "x", x, tuple(_DTYPE_KEY), 2)
    tokens, hidden = x.shape
    if isinstance(num_per_channels, bool) or not isinstance(num_per_channels, int) or num_per_channels != hidden:
        raise fail(OP, f"num_per_channels={num_per_channels!r} is not supported with fmt='e5m6': E5M6 uses one "
                       f"scale per token, pass num_per_channels=hidden ({hidden})")
    if hidden <= 0 or hidden % 8:
        raise fail(OP, f"hidden={hidden} is not supported with fmt='e5m6': it needs hidden % 8 == 0 "
                       "(8 values pack into 3 words)")
    _check_elements(tokens, hidden)
    return hidden


def check(x: Any, num_per_channels: Any, col: Any, rnd: Any, packed: Any) -> SfLayout:
    """Every check of the E5M6 cast, the device last; the layout of the scales it writes."""
    hidden = _validate(x, num_per_channels)
    col, rnd, packed = (check_flag(OP, name, v) for name, v in zip(_FLAGS, (col, rnd, packed)))
    layout = output_layout(OP, (1, hidden), col, packed, rnd)
    check_cuda(OP, x=x)
    return layout


def plan(x: torch.Tensor, col: Any, rnd: Any, packed: Any) -> Callable[..., QuantTensor]:
    """The launch of a checked configuration (x's dtype and hidden size, the flags): ``run(x, ...)``
    allocates ``(data, sf)`` and launches for x (any token count up to the element limit)."""
    hidden = x.shape[1]
    layout = output_layout(OP, (1, hidden), col, packed, rnd)
    if x.dtype == torch.float32:
        fn, per_block = launcher(_FP32_KERNEL, in_dtype="float32", sf_kind=layout.kind), _fp32_tokens_per_block(hidden)
    else:
        fn, per_block = launcher(_KERNEL, in_dtype="bfloat16", sf_kind=layout.kind), _tokens_per_block(hidden)
    cols, round_sf, alloc, finish = hidden * 3 // 2, int(rnd), layout.alloc, layout.finish

    def run(x: torch.Tensor, *_: Any) -> QuantTensor:
        tokens = x.shape[0]
        _check_elements(tokens, hidden)  # per call: the token count is not part of the configuration
        device = x.device
        out = torch.empty(tokens, cols, dtype=torch.uint8, device=device)
        raw_sf = alloc(tokens, hidden, device)
        if tokens:
            fn(_kernel_input(x), out, raw_sf, round_sf, per_block)
        return out, finish(raw_sf, tokens)

    return run


def _relations(op: str, values: dict) -> None:
    check(values["x"], values["num_per_channels"], *(values[name] for name in _FLAGS))


def _plan(values: dict) -> Callable[..., QuantTensor]:
    return plan(values["x"], *(values[name] for name in _FLAGS))


E5M6 = OpSpec(
    "per_token_cast_to_e5m6",
    (Deferred("x", tuple(_DTYPE_KEY), 2), deferred("num_per_channels", "int"),
     *(deferred(name, "bool", "False") for name in _FLAGS)),
    "(Tensor, Tensor)", _plan, relations=_relations)
SPECS = (E5M6,)


def per_token_cast_to_e5m6(
    x: torch.Tensor,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> QuantTensor:
    """Cast 2-D bf16/fp32 ``x`` to packed E5M6 with one scale per token; returns ``(data, sf)``
    (see the module docstring for layouts and rules)."""
    return E5M6.call(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


# the tilebin::<op> declaration (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (E5M6.torch_op(per_token_cast_to_e5m6),)


__all__ = ["per_token_cast_to_e5m6"]
