"""Scale-factor layouts of the quantization ops (the layouts ``tile_kernels.quant`` returns).

A cast with blocks of ``(rows, cols)`` elements per scale has ``ceil(R / rows) x
ceil(C / cols)`` scales for an ``R x C`` input.  Three layouts:

* ``row``: fp32 ``[R', C']``, row-major.
* ``col`` (``use_tma_aligned_col_major_sf``): fp32 ``[R', C']`` whose memory is column-major
  with the row count padded to a multiple of 4 (16 bytes, what TMA needs): the user sees a
  transposed view with strides ``(1, align(R', 4))``.
* ``ue8m0`` (``use_packed_ue8m0``, col-major only, power-of-two scales only): each scale is its
  8-bit exponent; four consecutive column blocks share one int32, so the user sees int32
  ``[R', ceil(C' / 4)]`` with strides ``(1, align(R', 4))``.

Kernels see the *kernel orientation*: ``row`` as is; ``col`` as fp32 ``[C', R']`` with a row
stride ``align(R', 4)``; ``ue8m0`` as uint8 ``[ceil(C' / 4), 4 * R']`` with a row stride
``align(4 R', 16)`` bytes, where byte ``4 r + c % 4`` of row ``c // 4`` is the scale of
``(r, c)``.  :meth:`SfLayout.alloc` makes kernel-side tensors, :meth:`SfLayout.finish` turns
them into what the op returns, :func:`input_sf` reads a user's ``(data, sf)`` pair back.  (The
per-block casts' kernels read and write scales in the user's orientation instead, as 4-byte words
with their strides: ``kernels/quant/per_block_cast.py``, ``per_block_cast_lossless.py``.)
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.runtime._record import record

from .._common import check_flag, fail

# the three scale-layout flags as the torch.library schemas of the quant ops write them
SCHEMA_FLAGS = "bool use_tma_aligned_col_major_sf=False, bool round_sf=False, bool use_packed_ue8m0=False"
FMT_DTYPES = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.int8}  # e2m1: two values per byte


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align(a: int, b: int) -> int:
    return _cdiv(a, b) * b


def check_fmt(op: str, fmt: Any, allowed: tuple[str, ...] = ("e4m3", "e2m1")) -> str:
    """``fmt`` if it is one of ``allowed``; :class:`ArgumentError` naming them otherwise."""
    if not isinstance(fmt, str) or fmt not in allowed:
        raise fail(op, f"fmt={fmt!r} is not supported; supported: {', '.join(map(repr, allowed))}")
    return fmt


@record
class SfLayout:
    """One scale-factor layout: block shape and storage kind (see the module docstring)."""

    block: tuple[int, int]
    col_major: bool = False
    packed_ue8m0: bool = False

    @property
    def kind(self) -> str:
        return "ue8m0" if self.packed_ue8m0 else ("col" if self.col_major else "row")

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the kernel-side tensor."""
        return torch.uint8 if self.packed_ue8m0 else torch.float32

    def blocks(self, rows: int, cols: int) -> tuple[int, int]:
        """Scale count along rows and along columns (logical, before packing)."""
        return _cdiv(rows, self.block[0]), _cdiv(cols, self.block[1])

    def shape(self, rows: int, cols: int) -> tuple[int, int]:
        """Kernel-side shape for an input of ``rows x cols`` (logical) elements."""
        m, k = self.blocks(rows, cols)
        if self.packed_ue8m0:
            m, k = m * 4, _cdiv(k, 4)
        return (k, m) if self.col_major else (m, k)

    def alloc(self, rows: int, cols: int, device: Any) -> torch.Tensor:
        """An uninitialised kernel-side tensor (col-major kinds: padded inner dim, sliced)."""
        d0, d1 = self.shape(rows, cols)
        if not self.col_major:
            return torch.empty(d0, d1, dtype=self.dtype, device=device)
        padded = _align(d1, 16 if self.packed_ue8m0 else 4)
        return torch.empty(d0, padded, dtype=self.dtype, device=device)[:, :d1]

    def finish(self, raw: torch.Tensor, rows: int) -> torch.Tensor:
        """The tensor the op returns for kernel-side ``raw`` (from :meth:`alloc`) of an input with
        ``rows`` rows: already exactly ``ceil(rows / block rows)`` scale rows, so only re-viewed."""
        if not self.col_major:
            return raw
        if self.packed_ue8m0:
            if rows == 0:
                return torch.empty(raw.shape[0], 0, dtype=torch.int32, device=raw.device).T
            return raw.view(torch.int32).T
        return raw.T


def output_layout(op: str, block: tuple[int, int], use_tma_aligned_col_major_sf: bool = False,
                  use_packed_ue8m0: bool = False, round_sf: bool = False) -> SfLayout:
    """The layout of scales an op writes; packed UE8M0 needs col-major and power-of-two scales.
    The flags must be bools (or the ints 0/1): :func:`check_flag`."""
    use_tma_aligned_col_major_sf = check_flag(op, "use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf)
    use_packed_ue8m0 = check_flag(op, "use_packed_ue8m0", use_packed_ue8m0)
    round_sf = check_flag(op, "round_sf", round_sf)
    if use_packed_ue8m0 and not use_tma_aligned_col_major_sf:
        raise fail(op, "use_packed_ue8m0=True needs use_tma_aligned_col_major_sf=True (packed UE8M0 scales are "
                       "stored column-major only)")
    if use_packed_ue8m0 and not round_sf:
        raise fail(op, "use_packed_ue8m0=True needs round_sf=True (a UE8M0 scale is a power of two)")
    return SfLayout(tuple(block), use_tma_aligned_col_major_sf, use_packed_ue8m0)


def input_sf(op: str, x: Any, x_block_size: Any) -> tuple[torch.Tensor, torch.Tensor, SfLayout]:
    """Read a quantized input ``(data, sf)``: data e4m3 or packed e2m1 (int8/uint8), sf fp32
    (row-major, or column-major when ``sf.stride(0) == 1``) or packed UE8M0 int32 (column-major).

    Returns ``(data, sf in kernel orientation, layout)``; :class:`ArgumentError` otherwise.
    """
    if not (isinstance(x, tuple) and len(x) == 2):
        raise fail(op, f"a quantized input must be a (data, sf) tuple, got {type(x).__name__}")
    data, sf = x
    if not isinstance(data, torch.Tensor) or data.dtype not in (torch.float8_e4m3fn, torch.int8, torch.uint8):
        got = data.dtype if isinstance(data, torch.Tensor) else type(data).__name__
        raise fail(op, f"quantized data has dtype {got}; supported: float8_e4m3fn, int8/uint8 (packed e2m1)")
    if not (isinstance(x_block_size, tuple) and len(x_block_size) == 2):
        raise fail(op, f"x_block_size must be a (rows, cols) tuple for a quantized input, got {x_block_size!r}")
    if not isinstance(sf, torch.Tensor) or sf.dim() != 2:
        raise fail(op, "the input's sf must be a 2-D tensor")
    if sf.stride(0) == 1:  # tile_kernels' rule (a one-column row-major sf reads as column-major too)
        if sf.dtype not in (torch.float32, torch.int32):
            raise fail(op, f"column-major input sf has dtype {sf.dtype}; supported: float32, int32 (packed UE8M0)")
        packed = sf.dtype == torch.int32
        kernel_sf = sf.T.view(torch.uint8) if packed else sf.T
        return data, kernel_sf, SfLayout(tuple(x_block_size), True, packed)
    if sf.stride(1) != 1 or sf.dtype != torch.float32:
        raise fail(op, f"row-major input sf must be float32 with stride(1) == 1, got {sf.dtype} with strides "
                       f"{tuple(sf.stride())}")
    return data, sf, SfLayout(tuple(x_block_size), False, False)
