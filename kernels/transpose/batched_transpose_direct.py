"""``transpose.batched_transpose_direct(x, out)``: ``out[b] = x[b].T`` like
``transpose.batched_transpose`` (same parameters, same bits), for decode-sized grids.

x is ``[batch, rows, cols]``, out is ``[batch, cols, rows]`` (contiguous, data pointers 16-byte
aligned), batch, rows and cols runtime symbols; one variant per ``dtype`` (bfloat16, float32,
float8_e4m3fn), each correct for every shape.  It is fast only for ``rows % VEC == cols % VEC == 0``
(``VEC = 16 // element_size``); other shapes take an element-by-element path (correct, slow).

When the op picks it: ``tilebin.ops.transpose`` launches it where rows and cols are multiples of
``VEC`` and ``transpose.batched_transpose``'s 8-warp tiles would give fewer than two blocks per SM
(where that kernel would take its 2-warp ``small`` tiles: decode token counts); every other call
keeps ``transpose.batched_transpose``.

Why: ``transpose.batched_transpose`` stages its tile in shared memory and writes each out row with
a ``cp.async.bulk`` issued by one thread.  ``UBLKCP`` takes its addresses in uniform registers, so
ptxas wraps every thread's bulk copy in a loop over the warp's distinct values (``R2UR.OR`` ...
``BRA.U.ANY``): 32 serial trips per warp, then ``DEPBAR.LE SB0`` until the copies have read shared
memory.  Together with ``STS`` + ``MEMBAR.ALL.CTA`` + ``FENCE.VIEW.ASYNC.S`` + ``BAR.SYNC`` that is
the critical path of a latency-bound kernel (64 x 7168 bf16 moves 0.9 MB); see kernels/README.md,
"transpose round 2".

Design: no shared memory.  Each thread loads its ``VEC x VEC`` block (``VEC`` 16-byte loads, all
issued first), transposes it in registers (the shipped kernel's permutes) and stores its ``VEC``
out rows straight from registers.  The lanes of a quarter-warp hold consecutive row blocks of one
column, so each 16-byte store instruction still writes 4 out rows x 128 contiguous bytes (full
lines).  2 warps per block (tile ``8 VEC x 8 VEC``: 64 x 64 bf16), no barrier, no bulk copy.
SASS (bf16): 66 registers, a full tile = 8 ``LDG.E.128``, 32 ``PRMT``, 8 ``STG.E.128``; fp32 40
registers, fp8 94.

Measured on an H200 (15:24 UTC 2026-12-02, CUPTI kernel time, L2 flushed; µs, the op before ->
with this kernel, tile_kernels 1.0.0 in brackets): decode bf16 x 7168 columns, 16 rows 2.80 ->
1.82 (refuses), 64 rows 3.07 -> 2.08 (2.2), 128 rows 3.74 -> 2.75 (3.0); 1 and 4 rows are not
multiples of ``VEC`` and keep the shipped kernel (2.1-2.3).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .batched_transpose import (_DTYPES, LANES_C, LANES_R, _elementwise, _load_block, _transpose_words, _view,
                                word_shapes)

_DIRECT_WARPS = 2  # along the columns; one warp (8 row blocks) along the rows


def batched_transpose_direct(dtype: str, rank: int = 3):
    """The kernel for one dtype (torch naming): register transposes, direct 16-byte stores.
    ``rank=2`` (``transpose.transpose_direct``): x ``[rows, cols]`` and out ``[cols, rows]``, one
    batch (the op then passes a 2-D x as it is, without a ``[1, rows, cols]`` view per call)."""
    if dtype not in _DTYPES:
        raise ValueError(f"batched_transpose_direct: dtype must be one of {sorted(_DTYPES)} (got {dtype!r})")
    if rank not in (2, 3):
        raise ValueError(f"batched_transpose_direct: rank must be 2 or 3 (got {rank!r})")
    tl_dtype, elem_bytes = _DTYPES[dtype]
    vec = 16 // elem_bytes
    blocks_r, blocks_c = LANES_R, LANES_C * _DIRECT_WARPS
    tile_r, tile_c = blocks_r * vec, blocks_c * vec
    batch, rows, cols, xw_shape, ow_shape = word_shapes(vec)
    if rank == 2:  # one batch: the word views keep their leading 1
        batch, xw_shape, ow_shape = 1, (1, *xw_shape[1:]), (1, *ow_shape[1:])

    @T.prim_func
    def main(
        x: T.Tensor((batch, rows, cols)[3 - rank:], tl_dtype),
        out: T.Tensor((batch, cols, rows)[3 - rank:], tl_dtype),
    ):
        with T.Kernel(T.ceildiv(rows, tile_r), T.ceildiv(cols, tile_c), batch, threads=32 * _DIRECT_WARPS) as (
            br, bc, bb
        ):
            tid = T.get_thread_binding()
            w_in = T.alloc_local((vec, 4), "uint32")
            w_out = T.alloc_local((vec, 4), "uint32")
            rv = br * blocks_r + tid % LANES_R  # r // vec
            cv = bc * blocks_c + tid // LANES_R  # c // vec
            if rows % vec == 0 and cols % vec == 0:
                if (br + 1) * tile_r <= rows and (bc + 1) * tile_c <= cols:
                    _load_block(x, xw_shape, w_in, bb, rv, cv, vec, rows, cols, False)
                    _transpose_words(w_in, w_out, elem_bytes)
                    for j in T.unroll(vec):
                        T.stg128(_view(out, ow_shape, "uint32")[bb, cv * vec + j, rv * 4],
                                 T.Tensor((vec,), "uint32x4", w_out.data)[j])
                else:
                    _load_block(x, xw_shape, w_in, bb, rv, cv, vec, rows, cols, True)
                    _transpose_words(w_in, w_out, elem_bytes)
                    for j in T.unroll(vec):
                        if rv * vec < rows and cv * vec + j < cols:
                            T.stg128(_view(out, ow_shape, "uint32")[bb, cv * vec + j, rv * 4],
                                     T.Tensor((vec,), "uint32x4", w_out.data)[j])
            else:
                _elementwise(x, out, bb, rv * vec, cv * vec, vec, vec, rows, cols)

    return main


def transpose_direct(dtype: str):
    """:func:`batched_transpose_direct` of 2-D x ``[rows, cols]`` and out ``[cols, rows]``."""
    return batched_transpose_direct(dtype, rank=2)


KERNELS = (
    KernelDecl(
        name="transpose.batched_transpose_direct",
        factory=batched_transpose_direct,
        grid=tuple({"dtype": d} for d in ("bfloat16", "float32", "float8_e4m3fn")),
        outputs=("out",),
        doc="out[b] = x[b].T for decode-sized grids: register transposes stored straight to global memory.",
    ),
    KernelDecl(
        name="transpose.transpose_direct",
        factory=transpose_direct,
        grid=tuple({"dtype": d} for d in ("bfloat16", "float32", "float8_e4m3fn")),
        outputs=("out",),
        doc="out = x.T (2-D) for decode-sized grids: batched_transpose_direct's kernel with one batch.",
    ),
)

__all__ = ["KERNELS", "batched_transpose_direct", "transpose_direct"]
