"""Round-2 transpose candidates (issue 12): ``out[b] = x[b].T`` like ``transpose.batched_transpose``,
same parameters, same bits, for the two places where tile_kernels 1.0.0 is faster.

Both kernels take x ``[batch, rows, cols]`` and out ``[batch, cols, rows]`` (contiguous, data
pointers 16-byte aligned), batch, rows and cols runtime symbols, and are correct for every shape;
``tilebin.ops.transpose`` (switch ``TILEBIN_CANDIDATE_TRANSPOSE=1``) launches them only where they
are meant to be fast: ``rows % VEC == cols % VEC == 0`` (``VEC = 16 // element_size``).  Other
shapes take an element-by-element path (correct, slow).

* ``transpose._batched_transpose_direct_candidate`` (decode: grids the shipped kernel serves with
  its 2-warp ``small`` tiles).  The shipped kernel stages its tile in shared memory and writes
  each out row with a ``cp.async.bulk`` issued by one thread.  ``UBLKCP`` takes its addresses in
  uniform registers, so ptxas wraps every thread's bulk copy in a loop over the warp's distinct
  values (``R2UR.OR`` ... ``BRA.U.ANY``): 32 serial trips per warp, then ``DEPBAR`` until the
  copies have read shared memory.  At 64 x 7168 that chain, plus ``STS`` / ``BAR`` /
  ``FENCE.VIEW.ASYNC``, sits on the critical path of a kernel that moves 0.9 MB.  Here there is no
  shared memory: each thread loads its ``VEC x VEC`` block (``VEC`` 16-byte loads), transposes it
  in registers (the shipped permutes) and stores its ``VEC`` out rows straight from registers.
  The lanes of a quarter-warp hold consecutive row blocks of one column, so each 16-byte store
  instruction still writes 4 out rows x 128 contiguous bytes (full lines).  2 warps per block
  (tile ``8 VEC x 8 VEC``: 64 x 64 bf16), no barrier, no bulk copy.
* ``transpose._batched_transpose_tile16k_candidate`` (large bf16 and fp8).  Among the shipped
  variants only fp32 matches the peer (118.8 vs 118.1 us at 8192 x 7168); it has the smallest tile
  (16 KB, 64 bytes per thread, 6 blocks of 8 warps per SM, 38 registers).  bf16 (32 KB tiles, 128
  bytes per thread, 4 blocks) and fp8 (64 KB, 256 bytes, 2 blocks) trail by 5 and 7 %, the larger
  the tile the more.  This kernel gives bf16 and fp8 fp32's shape: each thread owns ``VEC`` rows
  x 4 columns (64 bytes: ``VEC`` loads of 8 bytes (bf16) or 4 bytes (fp8), 4 out rows of 16 bytes),
  tile ``16 VEC x 64`` (128 x 64 bf16, 256 x 64 fp8: 16 KB, out rows of 256 bytes), 8 warps,
  6 blocks per SM.  Lanes: ``lane % 4`` picks the row block, ``lane // 4`` the column quad, so a
  load instruction reads 4 rows x 64 (bf16) or 32 (fp8) contiguous bytes; the staged out rows are
  padded to 272 bytes, which makes the quarter-warp's two out rows fall 16 banks apart (no bank
  conflicts).  The bulk copies are issued per warp by one elected lane in a warp-uniform loop (8
  out rows per warp), not one per thread: no per-lane serialisation loop.

Measured: not yet (no GPU where written); see kernels/README.md, "transpose round 2".
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .batched_transpose import _DTYPES, LANES_C, LANES_R, _bulk_store, _load_block, _perm, _transpose_words, _view

_DIRECT_WARPS = 2  # along the columns; one warp (8 row blocks) along the rows
_T16_WARPS_R, _T16_WARPS_C = 4, 2  # tile16k: warps along rows x columns
_T16_LANES_R, _T16_LANES_C = 4, 8  # tile16k: lane % 4: row block, lane // 4: column quad
_T16_COLS = 64  # tile16k: columns per tile (out rows per tile)
_T16_PAD_WORDS = 4  # tile16k: staged out row padding (16 bytes)
_T16_MIN_BLOCKS = 6  # as the fp32 shipped variant: <= 40 registers


@T.macro
def _elementwise(x, out, bb, r0, c0, nr: int, nc: int, rows, cols):
    """``out[bb, c, r] = x[bb, r, c]`` for the ``nr x nc`` block at ``(r0, c0)``, bounds-checked."""
    for i in T.serial(nr):
        for j in T.serial(nc):
            if r0 + i < rows and c0 + j < cols:
                out[bb, c0 + j, r0 + i] = x[bb, r0 + i, c0 + j]


def batched_transpose_direct(dtype: str):
    """The decode candidate for one dtype (torch naming): register transposes, direct 16-byte stores."""
    if dtype not in _DTYPES:
        raise ValueError(f"batched_transpose_direct: dtype must be one of {sorted(_DTYPES)} (got {dtype!r})")
    tl_dtype, elem_bytes = _DTYPES[dtype]
    vec = 16 // elem_bytes
    blocks_r, blocks_c = LANES_R, LANES_C * _DIRECT_WARPS
    tile_r, tile_c = blocks_r * vec, blocks_c * vec
    batch, rows, cols = T.dynamic("batch"), T.dynamic("rows"), T.dynamic("cols")
    xw_shape = (batch, rows, cols // vec * 4)
    ow_shape = (batch, cols, rows // vec * 4)

    @T.prim_func
    def main(
        x: T.Tensor((batch, rows, cols), tl_dtype),
        out: T.Tensor((batch, cols, rows), tl_dtype),
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


@T.macro
def _transpose_quads(q_in, q_out, elem_bytes: int):
    """``q_out[j, :]`` (16 bytes) = column j of the ``VEC x 4`` element block held row-wise in
    ``q_in`` (``elem_bytes`` words per row): bf16 one PRMT per word, fp8 two PRMT stages."""
    if elem_bytes == 2:
        # out row 2w+h, word m = half h of word w of x rows 2m and 2m+1
        for w in T.unroll(2):
            for m in T.unroll(4):
                q_out[2 * w, m] = _perm(q_in[2 * m, w], q_in[2 * m + 1, w], 0x5410)
                q_out[2 * w + 1, m] = _perm(q_in[2 * m, w], q_in[2 * m + 1, w], 0x7632)
    else:
        # out row t, word m = byte t of x rows 4m..4m+3
        for m in T.unroll(4):
            lo01 = _perm(q_in[4 * m, 0], q_in[4 * m + 1, 0], 0x5140)  # a0 b0 a1 b1
            hi01 = _perm(q_in[4 * m, 0], q_in[4 * m + 1, 0], 0x7362)  # a2 b2 a3 b3
            lo23 = _perm(q_in[4 * m + 2, 0], q_in[4 * m + 3, 0], 0x5140)
            hi23 = _perm(q_in[4 * m + 2, 0], q_in[4 * m + 3, 0], 0x7362)
            q_out[0, m] = _perm(lo01, lo23, 0x5410)
            q_out[1, m] = _perm(lo01, lo23, 0x7632)
            q_out[2, m] = _perm(hi01, hi23, 0x5410)
            q_out[3, m] = _perm(hi01, hi23, 0x7632)


@T.macro
def _load_quads(x, xw_shape, q_in, bb, rv, cq, vec: int, ipw: int, rows, cols, check: bool):
    """``q_in[i, :]`` = columns ``4 cq .. 4 cq + 3`` of row ``rv * vec + i`` of x (zeros past the end)."""
    for i in T.unroll(vec):
        if not check or (rv * vec + i < rows and cq * 4 < cols):
            for k in T.vectorized(ipw):
                q_in[i, k] = _view(x, xw_shape, "uint32")[bb, rv * vec + i, cq * ipw + k]
        else:
            for k in T.unroll(ipw):
                q_in[i, k] = T.uint32(0)


def batched_transpose_tile16k(dtype: str):
    """The large-size candidate for bf16 / fp8 (torch naming): 16 KB tiles of ``VEC x 4`` thread blocks."""
    if dtype not in ("bfloat16", "float8_e4m3fn"):
        raise ValueError(f"batched_transpose_tile16k: dtype must be bfloat16 or float8_e4m3fn (got {dtype!r})")
    tl_dtype, elem_bytes = _DTYPES[dtype]
    vec = 16 // elem_bytes
    ipw = elem_bytes  # 32-bit words per 4 elements of a row of x
    warps = _T16_WARPS_R * _T16_WARPS_C
    threads = 32 * warps
    blocks_r = _T16_WARPS_R * _T16_LANES_R  # row blocks of vec rows per tile
    tile_r, tile_c = blocks_r * vec, _T16_COLS
    quads_c = tile_c // 4
    seg_words = tile_r * elem_bytes // 4  # one staged out row (64 words = 256 bytes)
    out_per_warp = tile_c // warps
    batch, rows, cols = T.dynamic("batch"), T.dynamic("rows"), T.dynamic("cols")
    xw_shape = (batch, rows, cols // vec * 4)
    ow_shape = (batch, cols, rows // vec * 4)

    @T.prim_func
    def main(
        x: T.Tensor((batch, rows, cols), tl_dtype),
        out: T.Tensor((batch, cols, rows), tl_dtype),
    ):
        with T.Kernel(T.ceildiv(rows, tile_r), T.ceildiv(cols, tile_c), batch, threads=threads) as (br, bc, bb):
            T.annotate_min_blocks_per_sm(_T16_MIN_BLOCKS)
            tid = T.get_thread_binding()
            stage = T.alloc_shared((tile_c, seg_words + _T16_PAD_WORDS), "uint32")  # out tile, padded rows
            q_in = T.alloc_local((vec, ipw), "uint32")  # q_in[i, :] = x[r + i, c : c + 4]
            q_out = T.alloc_local((4, 4), "uint32")  # q_out[j, :] = out[c + j, r : r + vec]
            warp = tid // 32
            lane = tid % 32
            rl = (warp // _T16_WARPS_C) * _T16_LANES_R + lane % _T16_LANES_R  # row block within the tile
            ql = (warp % _T16_WARPS_C) * _T16_LANES_C + lane // _T16_LANES_R  # column quad within the tile
            rv = br * blocks_r + rl
            cq = bc * quads_c + ql
            if rows % vec == 0 and cols % vec == 0:
                if (br + 1) * tile_r <= rows and (bc + 1) * tile_c <= cols:
                    _load_quads(x, xw_shape, q_in, bb, rv, cq, vec, ipw, rows, cols, False)
                else:
                    _load_quads(x, xw_shape, q_in, bb, rv, cq, vec, ipw, rows, cols, True)
                _transpose_quads(q_in, q_out, elem_bytes)
                for j in T.unroll(4):
                    for k in T.vectorized(4):
                        stage[ql * 4 + j, rl * 4 + k] = q_out[j, k]
                T.fence_proxy_async()  # make the generic-proxy writes visible to the bulk copies
                T.sync_threads()
                seg_bytes = T.min(tile_r, rows - br * tile_r) * elem_bytes  # a multiple of 16
                if T.shuffle_elect(32):
                    for s in T.unroll(out_per_warp):
                        if bc * tile_c + s * warps + warp < cols:
                            _bulk_store(
                                T.address_of(_view(out, ow_shape, "uint32")[bb, bc * tile_c + s * warps + warp,
                                                                            br * seg_words]),
                                T.address_of(stage[s * warps + warp, 0]),
                                T.Cast("uint32", seg_bytes),
                            )
                    T.tma_store_arrive()
                    T.tma_store_wait(0)  # shared memory must stay until the copies have read it
            else:
                _elementwise(x, out, bb, rv * vec, cq * 4, vec, 4, rows, cols)

    return main


KERNELS = (
    KernelDecl(
        name="transpose._batched_transpose_direct_candidate",
        factory=batched_transpose_direct,
        grid=tuple({"dtype": d} for d in ("bfloat16", "float32", "float8_e4m3fn")),
        outputs=("out",),
        doc="Candidate (decode): out[b] = x[b].T, register transposes stored straight to global memory.",
    ),
    KernelDecl(
        name="transpose._batched_transpose_tile16k_candidate",
        factory=batched_transpose_tile16k,
        grid=tuple({"dtype": d} for d in ("bfloat16", "float8_e4m3fn")),
        outputs=("out",),
        doc="Candidate (large bf16/fp8): out[b] = x[b].T, 16 KB tiles, warp-uniform bulk stores.",
    ),
)

__all__ = ["KERNELS", "batched_transpose_direct", "batched_transpose_tile16k"]
