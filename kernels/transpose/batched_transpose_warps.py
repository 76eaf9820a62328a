"""``transpose.batched_transpose_warps(x, out)``: ``out[b] = x[b].T`` like
``transpose.batched_transpose`` (same parameters, same bits), with many warps and a little per
thread; the kernel ``tilebin.ops.transpose`` launches for every grid of at least 2 blocks per SM
(of ``transpose.batched_transpose``'s 8-warp tiles) whose rows and cols are multiples of ``VEC``
(``VEC = 16 // element size``).  Decode grids take ``transpose.batched_transpose_direct``, other
shapes ``transpose.batched_transpose``.

x is ``[batch, rows, cols]``, out is ``[batch, cols, rows]`` (contiguous, data pointers 16-byte
aligned), batch, rows and cols runtime symbols; one variant per ``dtype`` (bfloat16, float32,
float8_e4m3fn), each correct for every shape but fast only for ``rows % VEC == cols % VEC == 0``
(otherwise an element-by-element path).  Partial tiles load zeros past the end and store only
whole valid 16-byte chunks (a chunk covers ``VEC`` rows of x, so it is all valid or all not).

Measured on an H200 (02:27 UTC 2026-12-03, ``bench/bench_transpose.py --cand``, CUDA events; µs,
``transpose.batched_transpose`` -> this kernel as the candidate of round 6, cubins of the variants
below byte-identical): 8192 x 7168 bf16 64.6 -> 61.7, fp32 120.4 -> 118.8, fp8 36.6 -> 33.8;
8 x 4096 x 4096 bf16 138.7 -> 134.4, fp32 264.8 -> 263.2, fp8 72.3 -> 69.6.  kernels/README.md,
"transpose round 6", has the why.

Design (worked out on paper in round 4): tile_kernels' blocks hold 16 KB per SM yet reach
full bandwidth, because 32 warps per SM overlap their load, barrier and store phases; ours hold
128 KB in 8-16 warps.  This kernel is of the many-warps class and keeps our register transpose:

* 8 warps, 256 threads.  ``V = 4 // element size`` (bf16 2, fp8 4, fp32 1): a ``V x V`` square of
  elements is ``V`` 32-bit words.  Lanes run along x's columns: lane ``l`` loads words ``l * W ..
  l * W + W - 1`` (``W`` 1, 2 or 4: 4-, 8- or 16-byte loads; a warp reads ``128 W`` contiguous
  bytes of one row) of ``4 V`` rows (4 row blocks of ``V`` rows); warp ``wr`` takes row blocks
  ``4 wr .. 4 wr + 3``.  Tile ``32 V`` rows x ``32 W V`` columns (bf16 W 2: 64 x 128, 16 KB).
* Each ``V x V`` square is transposed with the shipped permutes; an out row then holds the
  thread's 4 row blocks' words side by side: 16 bytes, one ``STS.128`` into the staged out tile
  (out rows of 8 chunks of 16 bytes, chunk = warp).  A quarter-warp writes out rows ``W V`` apart:
  the chunk index is XORed with ``(out row // (W V)) % 8`` so its 8 lanes hit 8 different bank
  groups; the reads undo it.
* One barrier, then plain coalesced 16-byte stores: 8 lanes write one out row's 128 bytes.
* Row tiles on ``blockIdx.x``, column tiles on ``blockIdx.y`` (at most 65535: 8.4 million
  columns), the batch on ``blockIdx.z`` (at most 65535; the op launches larger batches in chunks).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .batched_transpose import _DTYPES, _elementwise, _perm, _view, word_shapes

WARPS = 8
R = 4  # row blocks per thread: 4 words = one 16-byte chunk of an out row


@T.macro
def _square(win, wout, rb, wi, v: int):
    """``wout[wi, t, rb]`` = word ``t`` of the transposed ``v x v`` square held as ``win[rb, 0..v-1, wi]``."""
    if v == 1:
        wout[wi, 0, rb] = win[rb, 0, wi]
    elif v == 2:
        wout[wi, 0, rb] = _perm(win[rb, 0, wi], win[rb, 1, wi], 0x5410)
        wout[wi, 1, rb] = _perm(win[rb, 0, wi], win[rb, 1, wi], 0x7632)
    else:
        lo01 = _perm(win[rb, 0, wi], win[rb, 1, wi], 0x5140)  # a0 b0 a1 b1
        hi01 = _perm(win[rb, 0, wi], win[rb, 1, wi], 0x7362)  # a2 b2 a3 b3
        lo23 = _perm(win[rb, 2, wi], win[rb, 3, wi], 0x5140)
        hi23 = _perm(win[rb, 2, wi], win[rb, 3, wi], 0x7362)
        wout[wi, 0, rb] = _perm(lo01, lo23, 0x5410)
        wout[wi, 1, rb] = _perm(lo01, lo23, 0x7632)
        wout[wi, 2, rb] = _perm(hi01, hi23, 0x5410)
        wout[wi, 3, rb] = _perm(hi01, hi23, 0x7632)


def batched_transpose_warps(dtype: str):
    """The PrimFunc for one dtype (torch naming), with the measured words per lane and residency."""
    if dtype not in _DTYPES:
        raise ValueError(f"batched_transpose_warps: dtype must be one of {sorted(_DTYPES)} (got {dtype!r})")
    return tiled_transpose_warps(dtype, *_CONFIG[dtype])


def tiled_transpose_warps(dtype: str, w: int, min_blocks: int):
    """``w`` words per lane per row (4-, 8- or 16-byte loads), ``min_blocks`` resident blocks per SM (caps registers)."""
    tl_dtype, eb = _DTYPES[dtype]
    vec = 16 // eb
    v = 4 // eb
    tile_r, tile_c = WARPS * R * v, 32 * w * v
    threads = 32 * WARPS
    rounds = tile_c * WARPS // threads  # 16-byte chunks of the out tile per thread
    batch, rows, cols, xw_shape, ow_shape = word_shapes(vec)

    @T.prim_func
    def main(
        x: T.Tensor((batch, rows, cols), tl_dtype),
        out: T.Tensor((batch, cols, rows), tl_dtype),
    ):
        with T.Kernel(T.ceildiv(rows, tile_r), T.ceildiv(cols, tile_c), batch, threads=threads) as (br, bc, bb):
            T.annotate_min_blocks_per_sm(min_blocks)
            tid = T.get_thread_binding()
            stage = T.alloc_shared((tile_c, WARPS * 4), "uint32")  # out rows x 8 chunks of 4 words, swizzled
            win = T.alloc_local((R, v, w), "uint32")
            wout = T.alloc_local((w, v, R), "uint32")
            wr = tid // 32
            lane = tid % 32
            r0 = br * tile_r + wr * (R * v)  # the thread's first row of x
            cw = bc * (tile_c // v) + lane * w  # the thread's first word of a row of x
            if rows % vec == 0 and cols % vec == 0:
                for rb in T.unroll(R):
                    for i in T.unroll(v):
                        if r0 + rb * v + i < rows and cw < cols // v:
                            for k in T.vectorized(w):
                                win[rb, i, k] = _view(x, xw_shape, "uint32")[bb, r0 + rb * v + i, cw + k]
                        else:
                            for k in T.unroll(w):
                                win[rb, i, k] = T.uint32(0)
                for rb in T.unroll(R):
                    for wi in T.unroll(w):
                        _square(win, wout, rb, wi, v)
                for wi in T.unroll(w):
                    for t in T.unroll(v):
                        for k in T.vectorized(4):
                            stage[(lane * w + wi) * v + t, T.bitwise_xor(wr, lane % 8) * 4 + k] = wout[wi, t, k]
                for j in T.unroll(rounds):
                    c = j * (threads // WARPS) + tid // WARPS  # out row of the tile
                    ch = tid % WARPS  # its 16-byte chunk
                    if bc * tile_c + c < cols and br * tile_r + ch * (R * v) < rows:
                        for k in T.vectorized(4):
                            _view(out, ow_shape, "uint32")[bb, bc * tile_c + c, (br * tile_r + ch * (R * v)) // v + k] = \
                                stage[c, T.bitwise_xor(ch, (c // (w * v)) % 8) * 4 + k]
            else:
                _elementwise(x, out, bb, r0, cw * v, R * v, w * v, rows, cols)

    return main


# dtype -> (words per lane, blocks per SM).  Round 6 (H200) also timed bf16 (2, 6), (1, 6), (4, 4),
# fp8 (1, 6), (2, 4) and fp32 (4, 6): each within 1 % of the chosen one (kernels/README.md).
_CONFIG = {"bfloat16": (2, 4), "float8_e4m3fn": (1, 4), "float32": (4, 4)}

KERNELS = (
    KernelDecl(
        name="transpose.batched_transpose_warps",
        factory=batched_transpose_warps,
        grid=tuple({"dtype": d} for d in ("bfloat16", "float32", "float8_e4m3fn")),
        outputs=("out",),
        doc="out[b] = x[b].T with 8 warps of 4 row blocks x W words per thread, a swizzled staged tile, 16-byte stores.",
    ),
)

__all__ = ["KERNELS", "batched_transpose_warps", "tiled_transpose_warps"]
