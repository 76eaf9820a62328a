"""Speed trial (issue 12, transpose round 5): ``out[b] = x[b].T`` by persistent warps with a
``cp.async`` ring.  Same parameters and bits as ``transpose.batched_transpose``; measured with
``bench/bench_transpose.py --cand transpose._transpose_ring_candidate``.

Why: Nsight Compute (round 4) showed the shipped kernel's fp8 gap is the tail of 3.39 waves of
long blocks, and that shortening the blocks lost more bandwidth than the tail costs, because in
that design the bytes in flight per SM are the bytes resident per SM.  Here they are decoupled:

* Work item = one warp's ``8 VEC x 4 VEC`` tile (``lane % 8`` the row block, ``lane // 8`` the
  column vector: the direct kernel's lanes).  Warps stride over the items (``gw + k * all
  warps``, row bands fastest, as the shipped kernel's blocks: the warps in flight write long runs
  of few out rows) and never synchronise with each other: no barrier, no block-wide phase.
  Round 5's first trial (column chunks fastest) was 0.61-0.78x of the shipped kernel.
* Each thread copies its own ``VEC x VEC`` block (``VEC`` 16-byte ``cp.async``, zero-fill past
  the end) into its private slot of a ``STAGES``-deep ring in shared memory, ``STAGES - 1``
  items ahead; ``cp.async.wait_group`` is the only wait.  Then 16-byte shared loads, the shipped
  register transpose and ``VEC`` 16-byte global stores (a quarter-warp writes 128 contiguous
  bytes of one out row).
* Items are fine-grained (fp8 8 KB, bf16 4 KB), so every SM runs until the last few items: no
  wave tail.  The grid is ``132 * bps`` blocks (the H200's SMs; a shipped version would take the
  SM count at run time).

Fast only for ``rows % VEC == cols % VEC == 0``; otherwise an element-by-element path (correct).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from ..mhc._ring import cp_async
from .batched_transpose import _DTYPES, LANES_C, LANES_R, _transpose_words, _view

_SMS = 132


def transpose_ring(dtype: str, stages: int, warps: int, bps: int):
    """The trial kernel: ``warps`` warps per block, ``bps`` blocks per SM, a ``stages``-deep ring."""
    tl_dtype, elem_bytes = _DTYPES[dtype]
    vec = 16 // elem_bytes
    threads = 32 * warps
    grid = _SMS * bps
    all_warps = grid * warps
    batch, rows, cols = T.dynamic("batch"), T.dynamic("rows"), T.dynamic("cols")
    xw_shape = (batch, rows, cols // vec * 4)
    ow_shape = (batch, cols, rows // vec * 4)
    item_r, item_c = LANES_R * vec, LANES_C * vec

    @T.prim_func
    def main(
        x: T.Tensor((batch, rows, cols), tl_dtype),
        out: T.Tensor((batch, cols, rows), tl_dtype),
    ):
        with T.Kernel(grid, threads=threads) as bx:
            tid = T.get_thread_binding()
            ring = T.alloc_shared((stages, vec, threads * 4), "uint32")
            w_in = T.alloc_local((vec, 4), "uint32")
            w_out = T.alloc_local((vec, 4), "uint32")
            n_r = T.alloc_var("int32")
            n_c = T.alloc_var("int32")
            mine = T.alloc_var("int32")
            item = T.alloc_var("int32")
            bb = T.alloc_var("int32")
            rv = T.alloc_var("int32")
            cv = T.alloc_var("int32")
            lane = tid % 32
            gw = bx * warps + tid // 32
            n_r = (rows + item_r - 1) // item_r
            n_c = (cols + item_c - 1) // item_c
            mine = T.if_then_else(gw < batch * n_r * n_c, (batch * n_r * n_c - gw + all_warps - 1) // all_warps, 0)
            if rows % vec == 0 and cols % vec == 0:
                for it in T.serial(mine + stages - 1):
                    T.sync_warp()  # a compiler fence: this slot's reads (stages - 1 items ago) stay before its refill
                    if it < mine:
                        item = gw + it * all_warps  # -> batch, row block, column vector (int32: items < 2**31)
                        bb = T.truncdiv(item, n_c * n_r)
                        rv = T.truncmod(item, n_r) * LANES_R + lane % LANES_R
                        cv = (T.truncdiv(item, n_r) - bb * n_c) * LANES_C + lane // LANES_R
                        for i in T.unroll(vec):
                            cp_async(ring[it % stages, i, tid * 4],
                                     _view(x, xw_shape, "uint32")[bb, rv * vec + i, cv * 4], 4,
                                     rv * vec + i < rows and cv * vec < cols)
                    T.ptx_commit_group()  # one group per iteration, possibly empty
                    if it >= stages - 1:
                        T.ptx_wait_group(stages - 1)  # item it - (stages - 1): this thread's copies landed
                        T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                        item = gw + (it - (stages - 1)) * all_warps  # -> batch, row block, column vector (int32: items < 2**31)
                        bb = T.truncdiv(item, n_c * n_r)
                        rv = T.truncmod(item, n_r) * LANES_R + lane % LANES_R
                        cv = (T.truncdiv(item, n_r) - bb * n_c) * LANES_C + lane // LANES_R
                        for i in T.unroll(vec):
                            for k in T.vectorized(4):
                                w_in[i, k] = ring[(it + 1) % stages, i, tid * 4 + k]
                        _transpose_words(w_in, w_out, elem_bytes)
                        for j in T.unroll(vec):
                            T.stg128(_view(out, ow_shape, "uint32")[bb, cv * vec + j, rv * 4],
                                     T.Tensor((vec,), "uint32x4", w_out.data)[j],
                                     rv * vec < rows and cv * vec + j < cols)
            else:
                for it in T.serial(mine):
                    item = gw + it * all_warps  # -> batch, row block, column vector (int32: items < 2**31)
                    bb = T.truncdiv(item, n_c * n_r)
                    rv = T.truncmod(item, n_r) * LANES_R + lane % LANES_R
                    cv = (T.truncdiv(item, n_r) - bb * n_c) * LANES_C + lane // LANES_R
                    for i in T.serial(vec):
                        for j in T.serial(vec):
                            if rv * vec + i < rows and cv * vec + j < cols:
                                out[bb, cv * vec + j, rv * vec + i] = x[bb, rv * vec + i, cv * vec + j]

    return main


_TRIALS = {  # dtype -> (stages, warps, blocks per SM): every one 192 KB of ring per SM
    # (bps * 32 * warps threads * stages slots of VEC x 16 B: 256 B fp8, 128 B bf16, 64 B fp32)
    "float8_e4m3fn": ((3, 4, 2), (4, 2, 3)),
    "bfloat16": ((4, 4, 3), (2, 8, 3)),
    "float32": ((4, 4, 6),),
}

KERNELS = (
    KernelDecl(
        name="transpose._transpose_ring_candidate",
        factory=transpose_ring,
        grid=tuple({"dtype": d, "stages": s, "warps": w, "bps": b} for d, cfgs in _TRIALS.items() for s, w, b in cfgs),
        outputs=("out",),
        pass_configs={"tl.disable_thread_storage_sync": True},  # private ring slots: no block barrier
        doc="Speed trial: persistent warps, per-thread cp.async ring, register transpose, 16-byte stores.",
    ),
)

__all__ = ["KERNELS", "transpose_ring"]
