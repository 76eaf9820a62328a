"""``engram.grad_w_reduce``: sum the gate backward's fused-weight partials, accumulate both weight gradients.

Parameters, in order: ``grad_w_partial`` fp32 ``[num_blocks, hc, hidden]``, ``weight_hidden``
and ``weight_embed`` bf16 ``[hc, hidden]``, ``grad_weight_hidden`` and ``grad_weight_embed``
fp32 ``[hc, hidden]`` (read and written in place); all contiguous, 16-byte aligned, every extent
a runtime symbol (``hidden % 4 == 0``; any ``num_blocks >= 0``, so any SM count).  Per element::

    s = sum_p grad_w_partial[p, h, i]                 (fp32, fixed order: see below)
    grad_weight_hidden[h, i] += s * float(weight_embed[h, i])     (product and sum rounded apart)
    grad_weight_embed[h, i]  += s * float(weight_hidden[h, i])

Summation order (deterministic, independent of the GPU): ``R`` row groups each add the rows
``p = g, g + R, g + 2R, ...`` in order, then the ``R`` group sums are added in group order.

Design: the ``hc * hidden`` columns are split into blocks of ``COLS`` columns; in a block of
``32 * R`` threads, lane ``l`` of row group ``g`` owns 4 consecutive columns: it copies its rows
(16-byte cp.async into private shared-memory slots, ``UNROLL`` rows each, so all of a block's
rows are in flight in one round trip for up to ``R * UNROLL = 144`` rows) and sums them in
order; the group sums meet in shared memory and row group 0, which loaded its weights and
gradients before the sum, writes.  Two blocks per SM.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

R = 16  # row groups per block
THREADS = 32 * R
COLS = 32 * 4  # columns per block
UNROLL = 9  # rows in flight per thread: R * UNROLL = 144 >= the SM count of every Hopper part (one pass)


def grad_w_reduce():
    """Build the PrimFunc (no compile-time parameters)."""
    num_blocks, hc, hidden = T.dynamic("num_blocks"), T.dynamic("hc_mult"), T.dynamic("hidden")
    ncols = hc * (hidden // 4) * 4  # the flat column count, visibly a multiple of 4
    p_vec = (num_blocks, ncols)
    w_vec = (ncols,)

    @T.prim_func
    def main(
        grad_w_partial: T.Tensor((num_blocks, hc, hidden), "float32"),
        weight_hidden: T.Tensor((hc, hidden), "bfloat16"),
        weight_embed: T.Tensor((hc, hidden), "bfloat16"),
        grad_weight_hidden: T.Tensor((hc, hidden), "float32"),
        grad_weight_embed: T.Tensor((hc, hidden), "float32"),
    ):
        with T.Kernel(T.ceildiv(ncols, COLS), threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(2)  # two blocks per SM (74 KB shared each): all 224 blocks of 4 x 7168 at once
            tid = T.get_thread_binding()
            buf = T.alloc_local((4,), "float32")
            # rows < UNROLL: private slots (a thread reads what it copied); row UNROLL: the group sums
            stg = T.alloc_shared((UNROLL + 1, THREADS * 4), "float32")
            acc = T.alloc_local((4,), "float32")
            wh = T.alloc_local((4,), "bfloat16")
            we = T.alloc_local((4,), "bfloat16")
            gh = T.alloc_local((4,), "float32")
            ge = T.alloc_local((4,), "float32")
            g = T.alloc_var("int32")
            g = tid // 32
            for j in T.unroll(4):
                acc[j] = T.float32(0)
            if g == 0 and bx * COLS + (tid % 32) * 4 < ncols:  # issued early: their latency hides under the sum
                for j in T.vectorized(4):
                    wh[j] = T.Tensor(w_vec, "bfloat16", weight_hidden.data)[bx * COLS + (tid % 32) * 4 + j]
                for j in T.vectorized(4):
                    we[j] = T.Tensor(w_vec, "bfloat16", weight_embed.data)[bx * COLS + (tid % 32) * 4 + j]
                for j in T.vectorized(4):
                    gh[j] = T.Tensor(w_vec, "float32", grad_weight_hidden.data)[bx * COLS + (tid % 32) * 4 + j]
                for j in T.vectorized(4):
                    ge[j] = T.Tensor(w_vec, "float32", grad_weight_embed.data)[bx * COLS + (tid % 32) * 4 + j]
            for c in T.serial(T.ceildiv(num_blocks, R * UNROLL)):  # one pass up to 144 rows
                for u in T.unroll(UNROLL):  # every row of the pass in flight at once
                    if bx * COLS + (tid % 32) * 4 < ncols and (c * UNROLL + u) * R + g < num_blocks:
                        T.ptx_cp_async(T.access_ptr(stg[u, tid * 4], "w", 4), T.access_ptr(T.Tensor(
                            p_vec, "float32", grad_w_partial.data)[(c * UNROLL + u) * R + g, bx * COLS + (tid % 32) * 4],
                            "r", 4), 4)
                T.ptx_commit_group()
                T.ptx_wait_group(0)
                T.sync_warp()  # a compiler fence (the wait asm has no memory clobber); uniform code
                for u in T.unroll(UNROLL):
                    if bx * COLS + (tid % 32) * 4 < ncols and (c * UNROLL + u) * R + g < num_blocks:
                        for j in T.vectorized(4):
                            buf[j] = stg[u, tid * 4 + j]
                        for j in T.unroll(4):
                            acc[j] = T.ieee_add(acc[j], buf[j])
                T.sync_warp()  # this pass's reads of stg stay before the next pass's copies
            for j in T.unroll(4):
                stg[UNROLL, tid * 4 + j] = acc[j]
            T.sync_threads()
            if g == 0 and bx * COLS + (tid % 32) * 4 < ncols:
                for j in T.unroll(4):
                    acc[j] = stg[UNROLL, (tid % 32) * 4 + j]
                for r in T.unroll(R - 1):
                    for j in T.unroll(4):
                        acc[j] = T.ieee_add(acc[j], stg[UNROLL, (r + 1) * COLS + (tid % 32) * 4 + j])
                for j in T.unroll(4):
                    gh[j] = T.ieee_add(gh[j], T.ieee_mul(acc[j], T.Cast("float32", we[j])))
                    ge[j] = T.ieee_add(ge[j], T.ieee_mul(acc[j], T.Cast("float32", wh[j])))
                for j in T.vectorized(4):
                    T.Tensor(w_vec, "float32", grad_weight_hidden.data)[bx * COLS + (tid % 32) * 4 + j] = gh[j]
                for j in T.vectorized(4):
                    T.Tensor(w_vec, "float32", grad_weight_embed.data)[bx * COLS + (tid % 32) * 4 + j] = ge[j]

    return main


KERNELS = (
    KernelDecl(
        name="engram.grad_w_reduce",
        factory=grad_w_reduce,
        grid=({},),
        outputs=("grad_weight_hidden", "grad_weight_embed"),
        # every access is guarded above; the only cross-thread exchange (the group sums) has its own barrier
        pass_configs={"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True},
        doc="s = sum_p grad_w_partial[p]; grad_weight_hidden += s * weight_embed; grad_weight_embed += s * weight_hidden.",
    ),
)

__all__ = ["KERNELS", "R", "grad_w_reduce"]
