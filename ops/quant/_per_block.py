"""Per-block casts (``tile_kernels.quant`` 1.0.0 API): ``per_block_cast``, its sf-only and
precomputed-sf forms, and ``per_block_cast_lossless`` (e2m1 (1, 32) -> e4m3, exact).

Every op validates all arguments before touching the GPU (device last) and raises
:class:`tilebin.runtime.ArgumentError` naming the op, the value, what is supported and the fix.
Outputs are fresh tensors with tile_kernels' layouts; launches go on torch's current stream.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.compiler import is_compiling

from .._common import (TRACING, aligned_input, check_aligned, check_cuda, check_flag, check_tensor, fail, launcher, ptr,
                       typed_key)
from .._torch import TorchOp, traced, pair_to_public, pair_to_schema
from ._sf import SCHEMA_FLAGS as _FLAGS, SfLayout, check_fmt, input_sf, output_layout

BLOCKS = ((128, 128), (32, 32))
LOSSLESS_IN_BLOCK = (1, 32)
LOSSLESS_OUT_BLOCKS = ((1, 128), (32, 32), (128, 128))
HIDDEN_ALIGN = 64
_KIND = {"row": 0, "col": 1, "ue8m0": 2}
_INT32_MAX = 2**31 - 1
_IN_DTYPES = (torch.bfloat16, torch.float32)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block(op: str, name: str, value: Any, allowed: tuple) -> tuple[int, int]:
    """``value`` as one of the ``allowed`` pairs of Python ints (a tuple or list of two ints;
    bools and floats refused)."""
    block = None
    if type(value) in (tuple, list) and all(type(v) is int for v in value):
        block = tuple(value)
    if block not in allowed:
        raise fail(op, f"{name}={value!r} is not supported; supported: {', '.join(map(str, allowed))}")
    return block


def _check_rows(op: str, name: str, t: torch.Tensor, hidden: int) -> None:
    """2-D contiguous data, hidden a multiple of 64, int32 element counts, 16-byte aligned."""
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (strides {tuple(t.stride())}); call {name}.contiguous()")
    if hidden % HIDDEN_ALIGN:
        raise fail(op, f"hidden={hidden} is not a multiple of {HIDDEN_ALIGN}; supported: hidden % {HIDDEN_ALIGN} == 0 "
                       f"(e.g. 576, 2048, 7168); pad the channels")
    if t.shape[0] * hidden > _INT32_MAX:
        raise fail(op, f"{name} has {t.shape[0]} x {hidden} elements, more than 2**31 - 1; split the tokens")
    check_aligned(op, name, t)


def _byte_view(raw: torch.Tensor) -> torch.Tensor:
    """The kernel-side scale tensor as the uint8 byte view the kernels take."""
    return raw if raw.dtype == torch.uint8 else raw.view(torch.uint8)


def _check_input(op: str, x: Any) -> tuple[int, int]:
    check_tensor(op, "x", x, _IN_DTYPES, 2)
    _check_rows(op, "x", x, x.shape[1])
    return x.shape[0], x.shape[1]


def _precomputed_sf(op: str, sf: Any, layout: SfLayout, tokens: int, hidden: int) -> torch.Tensor:
    check_tensor(op, "sf", sf, (torch.float32,), 2)
    want = layout.shape(tokens, hidden)
    if tuple(sf.shape) != want:
        raise fail(op, f"sf has shape {tuple(sf.shape)}; for x of {tokens} x {hidden} and block_size {layout.block} "
                       f"it must be {want} (row-major fp32, one scale per block)")
    if sf.numel() and (not sf.is_contiguous() or ptr(sf) % 16):
        sf = sf.clone(memory_format=torch.contiguous_format)  # the kernel reads row-major, 16-byte aligned
    return sf


def _per_block(op: str, x: torch.Tensor, fmt: str, block_size: Any, col: Any, round_sf: Any, packed: Any,
               sf_only: bool = False, sf: Any = None, memo_key: tuple | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate, allocate, launch; returns (out, user-facing sf) (out is a dummy when sf_only).

    With ``memo_key``, the validated configuration is memoized under it once every check passed
    (built from the validated values, never from the raw arguments)."""
    tokens, hidden = _check_input(op, x)
    fmt = check_fmt(op, fmt)
    block = _block(op, "block_size", block_size, BLOCKS)
    col = check_flag(op, "use_tma_aligned_col_major_sf", col)
    round_sf = check_flag(op, "round_sf", round_sf)
    packed = check_flag(op, "use_packed_ue8m0", packed)
    if sf is not None and (col or packed):
        raise fail(op, f"use_tma_aligned_col_major_sf={col}, use_packed_ue8m0={packed}: precomputed scales are "
                       f"row-major fp32 only; pass both as False")
    layout = output_layout(op, block, col, packed, round_sf) if sf is None else SfLayout(block)
    if sf is not None:
        sf = _precomputed_sf(op, sf, layout, tokens, hidden)
    check_cuda(op, x=x, sf=sf)
    out_dtype = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.int8}[fmt]
    if sf_only:
        out = torch.empty((1, 16), dtype=out_dtype, device=x.device)
    else:
        out = torch.empty((tokens, hidden if fmt == "e4m3" else hidden // 2), dtype=out_dtype, device=x.device)
    raw = layout.alloc(tokens, hidden, x.device) if sf is None else sf
    if tokens:
        fn = launcher("quant.per_block_cast", in_dtype=str(x.dtype).removeprefix("torch."), fmt=fmt,
                      block=block[0], sf_only=sf_only)
        fn(x, out, _byte_view(raw), _KIND[layout.kind], int(round_sf), int(sf is not None))
    if memo_key is not None and len(_FAST) < _FAST_MAX:  # every check passed: later calls may skip them
        _FAST[memo_key] = _Fast(x, fmt, layout, round_sf)
    return out, (layout.finish(raw, tokens) if sf is None else sf)


class _Fast:
    """A validated per_block_cast configuration (all but the token count and the pointer)."""

    __slots__ = ("hidden", "out_dtype", "out_cols", "layout", "fn", "args")

    def __init__(self, x: torch.Tensor, fmt: str, layout: SfLayout, round_sf: bool) -> None:
        self.hidden = x.shape[1]
        self.out_dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.int8
        self.out_cols = self.hidden if fmt == "e4m3" else self.hidden // 2
        self.layout = layout
        self.fn = launcher("quant.per_block_cast", in_dtype=str(x.dtype).removeprefix("torch."), fmt=fmt,
                           block=layout.block[0], sf_only=False)
        self.args = (_KIND[layout.kind], int(round_sf), 0)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(out, sf)``, or None when a per-call check fails (the slow path then says why)."""
        t, h = x.shape
        if not x.is_contiguous() or x.data_ptr() & 15 or t * h > _INT32_MAX:
            return None
        out = torch.empty((t, self.out_cols), dtype=self.out_dtype, device=x.device)
        raw = self.layout.alloc(t, h, x.device)
        if t:
            self.fn(x, out, raw if raw.dtype == torch.uint8 else raw.view(torch.uint8), *self.args)
        return out, self.layout.finish(raw, t)


_FAST: dict[tuple, _Fast] = {}
_FAST_MAX = 256


def per_block_cast(x: torch.Tensor, fmt: str, block_size: tuple[int, int], use_tma_aligned_col_major_sf: bool = False,
                   round_sf: bool = False, use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast ``x`` (bf16/fp32 ``[tokens, hidden]``, contiguous, hidden % 64 == 0) to ``fmt``
    (``'e4m3'``, or ``'e2m1'`` packed two per int8 byte) with one scale per ``block_size`` block
    ((128, 128) or (32, 32)).  Returns ``(out, sf)`` laid out as tile_kernels does
    (see ``ops/quant/_sf.py``); raises ArgumentError for anything unsupported.

    A configuration seen before (dtype, hidden, device, fmt, block, flags, each with its exact
    type) skips the argument checks that do not depend on the token count or the pointer.
    """
    if is_compiling() and not TRACING.on:
        return traced("per_block_cast", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    try:
        key = typed_key(x.dtype, x.dim(), x.shape[-1], x.device, fmt, block_size, use_tma_aligned_col_major_sf,
                        round_sf, use_packed_ue8m0)
        fast = _FAST.get(key)
    except (AttributeError, TypeError, IndexError):  # not a tensor, an unhashable argument: the checks say
        key, fast = None, None
    if fast is not None:
        result = fast(x)
        if result is not None:
            return result
    return _per_block("per_block_cast", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0, memo_key=key)


def per_block_cast_with_sf_only(x: torch.Tensor, fmt: str, block_size: tuple[int, int],
                                use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                use_packed_ue8m0: bool = False) -> torch.Tensor:
    """The scales :func:`per_block_cast` would return, without writing the cast data."""
    if is_compiling() and not TRACING.on:
        return traced("per_block_cast_with_sf_only", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0)
    return _per_block("per_block_cast_with_sf_only", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0, sf_only=True)[1]


def per_block_cast_with_precomputed_sf(x: torch.Tensor, fmt: str, block_size: tuple[int, int], sf: torch.Tensor,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False) -> torch.Tensor:
    """Cast ``x`` with given row-major fp32 scales ``sf`` (``[ceil(tokens / b), ceil(hidden / b)]``):
    ``out = cast(x * (1 / sf))``.  The layout flags must be False; ``round_sf`` is ignored."""
    if is_compiling() and not TRACING.on:
        return traced("per_block_cast_with_precomputed_sf", x, fmt, block_size, sf, use_tma_aligned_col_major_sf,
                      round_sf, use_packed_ue8m0)
    return _per_block("per_block_cast_with_precomputed_sf", x, fmt, block_size, use_tma_aligned_col_major_sf,
                      round_sf, use_packed_ue8m0, sf=sf)[0]


def per_block_cast_lossless(x: tuple[torch.Tensor, torch.Tensor], fmt: str, x_block_size: tuple[int, int],
                            out_block_size: tuple[int, int], use_tma_aligned_col_major_sf: bool = False,
                            round_sf: bool = False, use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-quantize ``x = (data, sf)`` (packed e2m1 int8 ``[tokens, hidden // 2]`` with power-of-two
    (1, 32) scales in any layout) to e4m3 with power-of-two ``out_block_size`` scales ((1, 128),
    (32, 32) or (128, 128)), exactly when every input scale of an output block is within 2**11 of
    the block's largest.  ``fmt`` must be ``'e4m3'``; ``round_sf`` is implied (the scales are powers
    of two).  Returns ``(out, out_sf)``."""
    if is_compiling() and not TRACING.on:
        return traced("per_block_cast_lossless", x, fmt, x_block_size, out_block_size,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    op = "per_block_cast_lossless"
    data, x_sf, in_layout = input_sf(op, x, x_block_size)
    check_fmt(op, fmt, ("e4m3",))
    if data.dtype not in (torch.int8, torch.uint8):
        raise fail(op, f"data has dtype {data.dtype}; supported: int8/uint8 (packed e2m1); the lossless cast reads e2m1 only")
    if data.dim() != 2:
        raise fail(op, f"data must be 2-D, got shape {tuple(data.shape)}")
    in_block = _block(op, "x_block_size", x_block_size, (LOSSLESS_IN_BLOCK,))
    out_block = _block(op, "out_block_size", out_block_size, LOSSLESS_OUT_BLOCKS)
    tokens, hidden = data.shape[0], data.shape[1] * 2
    _check_rows(op, "data", data, hidden)
    want = SfLayout(in_block, in_layout.col_major, in_layout.packed_ue8m0).shape(tokens, hidden)
    if tuple(x_sf.shape) != want:
        raise fail(op, f"the input sf ({in_layout.kind} layout) has kernel-side shape {tuple(x_sf.shape)}; for data of "
                       f"{tokens} x {hidden} values and x_block_size {in_block} it must be {want}")
    layout = output_layout(op, out_block, use_tma_aligned_col_major_sf, use_packed_ue8m0, True)
    check_cuda(op, data=data, sf=x_sf)
    out = torch.empty((tokens, hidden), dtype=torch.float8_e4m3fn, device=data.device)
    raw = layout.alloc(tokens, hidden, data.device)
    if tokens:
        fn = launcher("quant.per_block_cast_lossless", block_m=out_block[0], block_k=out_block[1])
        fn(data.view(torch.int8), _byte_view(aligned_input(x_sf)), out, _byte_view(raw), _KIND[in_layout.kind],
           _KIND[layout.kind])
    return out, layout.finish(raw, tokens)


# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (
    TorchOp("per_block_cast", f"(Tensor x, str fmt, int[] block_size, {_FLAGS}) -> (Tensor, Tensor)", per_block_cast,
            fake=lambda *a: _per_block("per_block_cast", *a)),
    TorchOp("per_block_cast_with_sf_only", f"(Tensor x, str fmt, int[] block_size, {_FLAGS}) -> Tensor",
            per_block_cast_with_sf_only),
    TorchOp("per_block_cast_with_precomputed_sf", f"(Tensor x, str fmt, int[] block_size, Tensor sf, {_FLAGS}) -> Tensor",
            per_block_cast_with_precomputed_sf),
    TorchOp("per_block_cast_lossless", f"(Tensor x, Tensor x_sf, str fmt, int[] x_block_size, int[] out_block_size, "
                                       f"{_FLAGS}) -> (Tensor, Tensor)",
            per_block_cast_lossless, to_schema=pair_to_schema, to_public=pair_to_public),
)


__all__ = ["per_block_cast", "per_block_cast_with_sf_only", "per_block_cast_with_precomputed_sf",
           "per_block_cast_lossless"]
