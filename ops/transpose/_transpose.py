"""``transpose`` and ``batched_transpose``: ``out[b] = x[b].T`` on ``transpose.batched_transpose_warps``
(``transpose.batched_transpose_direct`` for decode sizes, and ``transpose.batched_transpose`` for rows
or columns that are not multiples of 16 bytes' worth of elements).  A 2-D x is launched as it is, with
no ``[1, m, n]`` view per call, on the same kernels with 2-D parameters (``transpose.transpose_direct``
and ``transpose.transpose_tiled``), but for the warps kernel (large grids, where a view costs nothing
beside the kernel).

Same names, signatures and outputs as ``tile_kernels.transpose`` 1.0.0: the result is a new
contiguous tensor ``[n, m]`` (``[b, n, m]``) of x's dtype on x's device.  Beyond tile_kernels:

* any ``m`` and ``n`` (tile_kernels needs multiples of 64).  Where ``m`` and ``n`` are multiples of
  16 bytes' worth of elements (``VEC``: 8 bf16, 4 fp32, 16 fp8): ``transpose.batched_transpose_warps``
  (many warps, 16-byte loads and stores), or, where ``transpose.batched_transpose``'s 8-warp tiles
  would give fewer than two blocks per SM (decode sizes), ``transpose.batched_transpose_direct``
  (register transposes stored straight to global memory).  Otherwise ``transpose.batched_transpose``
  (vector loads, bounds-checked element stores), with its 2-warp variants (``small``) at decode
  sizes;
* any strides: a non-contiguous x, or one whose data pointer is not 16-byte aligned (the
  kernel's vector loads need it), costs one contiguous copy first;
* an empty x (any extent 0) returns its empty output and launches nothing;
* ``b > 65535`` (the grid's z limit) launches in chunks of batches.

Dtypes: the kernel moves 1-, 2- and 4-byte elements as bits (its variants' dtypes are
float8_e4m3fn, bfloat16 and float32); every dtype in :data:`DTYPES` rides on the variant of its
element size through a same-size view, so the result is bit-exact (NaN payloads, -0, subnormals
kept).

Every argument is checked before any GPU work (:class:`tilebin.runtime.ArgumentError` naming
the op, the value and what is supported; the device last).  A row longer than the kernel's grid
covers (more than ~4 million fp32 columns) is refused with the same error, before any launch.
Kernels run on torch's current stream.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from tilebin.runtime import ArgumentError

from .._common import fail, launcher, ptr
from .._spec import OpSpec, TensorParam
from ..config import get_num_sms

_KERNEL = "transpose.batched_transpose"
_DIRECT = "transpose.batched_transpose_direct"  # decode grids of aligned rows and cols
_DIRECT_2D = "transpose.transpose_direct"  # the same for a 2-D x, which it takes as it is (no view per call)
_TILED_2D = "transpose.transpose_tiled"  # _KERNEL for a 2-D x, taken as it is
_WARPS = "transpose.batched_transpose_warps"  # every other grid of aligned rows and cols
# element size in bytes -> (the kernel variant's dtype key, the torch dtype x is viewed as)
_VARIANT_BY_SIZE = {1: ("float8_e4m3fn", torch.float8_e4m3fn), 2: ("bfloat16", torch.bfloat16),
                    4: ("float32", torch.float32)}
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.int8, torch.uint8, torch.int16, torch.int32)
_ALIGN = 16  # bytes: the kernel's 16-byte vector loads and bulk stores
_BATCH_CHUNK = 65520  # <= 65535 (grid z) and a multiple of 16: every chunk starts 16-byte aligned


def _plan(op: str, ndim: int) -> Callable[[dict], Callable[[torch.Tensor], torch.Tensor]]:
    """The launch of ``op`` (x of ``ndim`` dims, checked): allocate the output, launch (nothing
    for an empty x).  What the configuration fixes (the variant's dtype, the tile side, whether
    the columns allow the direct kernel, the launchers) is worked out here once."""
    def plan(values: dict) -> Callable[[torch.Tensor], torch.Tensor]:
        x = values["x"]
        size = x.element_size()
        key, view_dtype = _VARIANT_BY_SIZE[size]
        view = view_dtype if x.dtype != view_dtype else None
        vec, tile = _ALIGN // size, 256 // size  # tile: the 8-warp tile's side (128 bf16, 64 fp32, 256 fp8)
        # the direct and warps kernels need rows and cols multiples of vec: cols (and a batched x's
        # rows) are in the memo key, decided here; a 2-D x's rows (the token count) per call
        aligned = vec if not x.shape[-1] % vec and (ndim == 2 or not x.shape[-2] % vec) else 0
        # a 2-D x: the kernels with 2-D parameters, which take x and out as they are (no [1, m, n] views),
        # but for the warps kernel (large aligned grids, where a view's cost is nothing beside the kernel's)
        tiled, direct = (_KERNEL, _DIRECT) if ndim == 3 else (_TILED_2D, _DIRECT_2D)
        # (kernel name, small) -> launcher: direct for small aligned grids, warps for the other aligned ones
        fns = {(tiled, small): launcher(tiled, dtype=key, small=small) for small in (False, True)}
        if aligned:
            fns[direct, True] = launcher(direct, dtype=key)
            fns[_WARPS, False] = launcher(_WARPS, dtype=key)
        dtype, device = x.dtype, x.device  # part of the configuration

        def run(x: torch.Tensor) -> torch.Tensor:
            shape = x.shape
            b, r, c = shape if ndim == 3 else (1, *shape)
            out = torch.empty(b, c, r, dtype=dtype, device=device) if ndim == 3 else \
                torch.empty(c, r, dtype=dtype, device=device)
            if not (b and r and c):
                return out
            if not x.is_contiguous() or ptr(x) % _ALIGN:  # a copy the vector loads can read
                x = x.clone(memory_format=torch.contiguous_format)
            out_k = out
            if view is not None:
                x, out_k = x.view(view), out.view(view)
            # decode sizes: fewer than 2 blocks per SM of 8-warp tiles (so the batch is within one chunk)
            # (a plain bool: under dynamic fake shapes a SymBool would key the launcher dict)
            small = bool(b * -(-r // tile) * -(-c // tile) < 2 * get_num_sms(device))
            name = (direct if small else _WARPS) if aligned and not r % aligned else tiled
            if ndim == 3 or name != _WARPS:
                _launch(op, name, fns[name, small], x, out_k, batched=ndim == 3)
            else:
                _launch(op, name, fns[name, small], x[None], out_k[None])
            return out

        return run

    return plan


TRANSPOSE = OpSpec("transpose", (TensorParam("x", DTYPES, 2),), "Tensor", _plan("transpose", 2))
BATCHED_TRANSPOSE = OpSpec("batched_transpose", (TensorParam("x", DTYPES, 3),), "Tensor",
                           _plan("batched_transpose", 3))
SPECS = (TRANSPOSE, BATCHED_TRANSPOSE)


def transpose(x: torch.Tensor) -> torch.Tensor:
    """``x.T`` as a new contiguous tensor: x ``[m, n]`` of a dtype in :data:`DTYPES` -> ``[n, m]``."""
    return TRANSPOSE.call(x)


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """``x[i].T`` for every i as a new contiguous tensor: x ``[b, m, n]`` -> ``[b, n, m]``."""
    return BATCHED_TRANSPOSE.call(x)


def _launch(op: str, name: str, fn: Any, x: torch.Tensor, out: torch.Tensor, batched: bool = True) -> None:
    """``fn`` (kernel ``name``) on x and out, in chunks of batches past the grid's z limit
    (``batched=False``: a 2-D x and out, one launch)."""
    batch = x.shape[0] if batched else 1
    try:
        if batch <= _BATCH_CHUNK:
            fn(x, out)
            return
        for start in range(0, batch, _BATCH_CHUNK):
            fn(x[start:start + _BATCH_CHUNK], out[start:start + _BATCH_CHUNK])
    except ArgumentError as exc:  # the grid or a size does not fit the kernel: raised before any launch
        raise fail(op, f"x of shape {tuple(x.shape)} is outside what {name} serves ({exc}); split x along "
                       "its last dim") from exc


__all__ = ["DTYPES", "batched_transpose", "transpose"]
