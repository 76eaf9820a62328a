"""``transpose._batched_transpose_candidate``: a speed candidate of ``transpose.batched_transpose``
(issue 12; ``tilebin.ops.transpose`` launches it when ``TILEBIN_CANDIDATE_TRANSPOSE=1``).

Same parameters, layout and results as the shipped kernel (see its docstring for the design:
16-byte vector loads of a ``VEC x VEC`` block per thread, a register transpose, the out tile
staged in shared memory and written with 1-D bulk copies).  Two changes, both for shapes
whose grid is small or whose tiles are partial (decode sizes, e.g. 64 x 7168 bf16: the
shipped kernel took 3.3 us there, tile_kernels 2.1 us):

* ``small`` variants: 2 warps per block (tile 64 x 64 in bf16, 32 x 32 fp32, 128 x 128 fp8)
  instead of 8 (128 x 128 / 64 x 64 / 256 x 256).  At 128 x 7168 bf16 the shipped tile gives
  56 blocks on 132 SMs, the small one 224; the op picks ``small`` when the large tile would
  give fewer than two blocks per SM.
* A partial tile of an aligned shape (``rows % VEC == cols % VEC == 0``) no longer drops to
  element-wise stores: its loads are predicated (rows or columns past the end read as
  zeros) and each valid out row gets one bulk copy of its valid bytes (a multiple of 16, as
  ``cp.async.bulk`` needs, because ``rows % VEC == 0``).  Unaligned shapes keep the
  shipped kernel's paths.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .batched_transpose import (_DTYPES, _INT_OF_SIZE, _MIN_BLOCKS, LANES_C, LANES_R, _bulk_store, _transpose_words,
                                _view)

_WARPS = {False: (2, 4), True: (1, 2)}  # small -> (WARPS_R, WARPS_C)


@T.macro
def _load_block(x, xw_shape, w_in, bb, rv, cv, vec: int, rows, cols, check: bool):
    """``w_in[i, :]`` = the 16-byte vector ``cv`` of row ``rv * vec + i`` of x (zeros past the end)."""
    for i in T.unroll(vec):
        if not check or (rv * vec + i < rows and cv < cols // vec):
            for k in T.vectorized(4):
                w_in[i, k] = _view(x, xw_shape, "uint32")[bb, rv * vec + i, cv * 4 + k]
        else:
            for k in T.unroll(4):
                w_in[i, k] = T.uint32(0)


def batched_transpose_candidate(dtype: str, small: bool):
    """Build the PrimFunc for one dtype (torch naming) and tile size."""
    if dtype not in _DTYPES:
        raise ValueError(f"batched_transpose_candidate: dtype must be one of {sorted(_DTYPES)} (got {dtype!r})")
    tl_dtype, elem_bytes = _DTYPES[dtype]
    warps_r, warps_c = _WARPS[small]
    vec = 16 // elem_bytes
    blocks_r, blocks_c = warps_r * LANES_R, warps_c * LANES_C  # thread blocks per tile
    tile_r, tile_c = blocks_r * vec, blocks_c * vec
    threads = 32 * warps_r * warps_c
    seg_words = tile_r * elem_bytes // 4  # one staged out row: the tile's rows of x, in words
    per_word = 4 // elem_bytes
    int_dtype = _INT_OF_SIZE[elem_bytes]
    batch, rows, cols = T.dynamic("batch"), T.dynamic("rows"), T.dynamic("cols")
    xw_shape = (batch, rows, cols // vec * 4)
    ow_shape = (batch, cols, rows // vec * 4)

    @T.prim_func
    def main(
        x: T.Tensor((batch, rows, cols), tl_dtype),
        out: T.Tensor((batch, cols, rows), tl_dtype),
    ):
        with T.Kernel(T.ceildiv(rows, tile_r), T.ceildiv(cols, tile_c), batch, threads=threads) as (br, bc, bb):
            T.annotate_min_blocks_per_sm(_MIN_BLOCKS[elem_bytes] * (4 if small else 1))
            tid = T.get_thread_binding()
            stage = T.alloc_shared((tile_c, seg_words), "uint32")  # the out tile, row-major
            w_in = T.alloc_local((vec, 4), "uint32")  # w_in[i, :] = x[r + i, c : c + vec]
            w_out = T.alloc_local((vec, 4), "uint32")  # w_out[j, :] = out[c + j, r : r + vec]
            warp = tid // 32
            lane = tid % 32
            rl = (warp // warps_c) * LANES_R + lane % LANES_R  # row block within the tile
            cl = (warp % warps_c) * LANES_C + lane // LANES_R  # column vector within the tile
            rv = br * blocks_r + rl  # r // vec
            cv = bc * blocks_c + cl  # c // vec
            aligned = rows % vec == 0 and cols % vec == 0
            full = (br + 1) * tile_r <= rows and (bc + 1) * tile_c <= cols
            if aligned:
                if full:
                    _load_block(x, xw_shape, w_in, bb, rv, cv, vec, rows, cols, False)
                else:
                    _load_block(x, xw_shape, w_in, bb, rv, cv, vec, rows, cols, True)
                _transpose_words(w_in, w_out, elem_bytes)
                for j in T.unroll(vec):
                    for k in T.vectorized(4):
                        stage[cl * vec + j, rl * 4 + k] = w_out[j, k]
                T.fence_proxy_async()  # make the generic-proxy writes visible to the bulk copy
                T.sync_threads()
                # the valid bytes of each out row of this tile: a multiple of 16 (rows % vec == 0)
                seg_bytes = T.min(tile_r, rows - br * tile_r) * elem_bytes
                for t in T.serial(T.ceildiv(tile_c, threads)):
                    if t * threads + tid < tile_c and bc * tile_c + t * threads + tid < cols:
                        _bulk_store(
                            T.address_of(_view(out, ow_shape, "uint32")[bb, bc * tile_c + t * threads + tid, br * seg_words]),
                            T.address_of(stage[t * threads + tid, 0]),
                            T.Cast("uint32", seg_bytes),
                        )
                        T.tma_store_arrive()
                        T.tma_store_wait(0)  # shared memory must stay until the copy has read it
            elif cols % vec == 0:
                # Rows of x are aligned, rows of out are not (rows % vec != 0): vector loads, the
                # same staging, then element stores along out rows.
                if cv < cols // vec:
                    _load_block(x, xw_shape, w_in, bb, rv, cv, vec, rows, cols, True)
                    _transpose_words(w_in, w_out, elem_bytes)
                    for j in T.unroll(vec):
                        for k in T.vectorized(4):
                            stage[cl * vec + j, rl * 4 + k] = w_out[j, k]
                T.sync_threads()
                for it in T.serial(tile_c * tile_r // threads):
                    t = (it * threads + tid) // tile_r  # out row within the tile
                    e = (it * threads + tid) % tile_r  # element within that row
                    if bc * tile_c + t < cols and br * tile_r + e < rows:
                        _view(out, (batch, cols, rows), int_dtype)[bb, bc * tile_c + t, br * tile_r + e] = T.Cast(
                            int_dtype, stage[t, e // per_word] >> T.Cast("uint32", (e % per_word) * (8 * elem_bytes))
                        )
            else:
                for i in T.serial(vec):
                    for j in T.serial(vec):
                        if rv * vec + i < rows and cv * vec + j < cols:
                            out[bb, cv * vec + j, rv * vec + i] = x[bb, rv * vec + i, cv * vec + j]

    return main


KERNELS = (
    KernelDecl(
        name="transpose._batched_transpose_candidate",
        factory=batched_transpose_candidate,
        grid=tuple({"dtype": d, "small": s} for d in ("bfloat16", "float32", "float8_e4m3fn") for s in (False, True)),
        outputs=("out",),
        doc="Speed candidate of transpose.batched_transpose (same contract); small: 2-warp tiles.",
    ),
)

__all__ = ["KERNELS", "batched_transpose_candidate"]
