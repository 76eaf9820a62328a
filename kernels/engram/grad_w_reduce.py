"""``engram.grad_w_reduce``: sum the gate backward's fused-weight partials, accumulate both weight gradients.

Parameters, in order: ``grad_w_partial`` fp32 ``[num_blocks, hc, hidden]``, ``weight_hidden``
and ``weight_embed`` bf16 ``[hc, hidden]``, ``grad_weight_hidden`` and ``grad_weight_embed``
fp32 ``[hc, hidden]`` (read and written in place); all contiguous, 16-byte aligned, every extent
a runtime symbol (``hidden % 4 == 0``, ``num_blocks * hc * hidden < 2**31``; any
``num_blocks >= 0``, so any SM count).  Per element::

    s = sum_p grad_w_partial[p, h, i]                 (fp32, fixed order: see below)
    grad_weight_hidden[h, i] += s * float(weight_embed[h, i])     (product and sum rounded apart)
    grad_weight_embed[h, i]  += s * float(weight_hidden[h, i])

Summation order (deterministic, independent of the GPU): ``R = 16`` row groups each add the rows
``p = g, g + R, g + 2R, ...`` in order starting from ``+0``, then the ``R`` group sums are added
in group order.

Design: a block is ``R`` groups x 8 lanes (128 threads, 32 columns, 2 KB of shared memory; 8
blocks fit per SM, so the 896 blocks of 4 x 7168 sit 6-7 per SM and the 512 of 4 x 4096 3-4).
A thread's rows are one int32 vector index stepped by a run-time row stride; its ``UNROLL``
16-byte loads go straight into registers and are *unconditional* (a row past the thread's last
re-reads that row, or a vector of row 0 when it has none, and is not added): predicated loads
would need 9 live predicates between a load and its sum, more than the 7 the SM has, and ptxas
then moves the first sums (which wait for the first rows) ahead of the last loads.  So every
load of a thread is issued before its first sum (~5 SASS instructions per row: ``ISETP``,
``SEL``, ``IADD3``, ``IMAD.WIDE``, ``LDG.E.128``), and there is no shared-memory round trip for
the rows.  The group sums meet in shared memory; warp 0 (one column per lane) adds them in group
order, applies the weights and writes.

H200, one run (device us; tokens x hidden 4001x4096/4001x7168/8001x4096/8001x7168, hc 4): 6.6/8.1/6.6/8.0 (previous kernel 7.1/8.5/7.1/8.6, tile_kernels 7.2/8.3/7.0/8.3).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

R = 16  # row groups per block (part of the summation order above)
LANES = 8  # threads per row group; each owns one 16-byte vector (4 columns) of the block's columns
THREADS = R * LANES
COLS = LANES * 4  # columns per block
UNROLL = 9  # rows in flight per thread: R * UNROLL = 144 >= the SM count of every Hopper part (one pass)


def grad_w_reduce():
    """Build the PrimFunc (no compile-time parameters)."""
    num_blocks, hc, hidden = T.dynamic("num_blocks"), T.dynamic("hc_mult"), T.dynamic("hidden")
    nvec = hc * (hidden // 4)  # 16-byte vectors per partial row
    p_flat = (num_blocks * nvec * 4,)
    w_flat = (nvec * 4,)

    @T.prim_func
    def main(
        grad_w_partial: T.Tensor((num_blocks, hc, hidden), "float32"),
        weight_hidden: T.Tensor((hc, hidden), "bfloat16"),
        weight_embed: T.Tensor((hc, hidden), "bfloat16"),
        grad_weight_hidden: T.Tensor((hc, hidden), "float32"),
        grad_weight_embed: T.Tensor((hc, hidden), "float32"),
    ):
        with T.Kernel(T.ceildiv(nvec, LANES), threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(1024 // THREADS)  # 8 blocks per SM: at most 64 registers
            tid = T.get_thread_binding()
            buf = T.alloc_local((UNROLL * 4,), "float32")
            acc = T.alloc_local((4,), "float32")
            sums = T.alloc_shared((R * COLS,), "float32")
            g = T.alloc_var("int32")
            n = T.alloc_var("int32")
            v = T.alloc_var("int32")
            step = T.alloc_var("int32")
            left = T.alloc_var("int32")
            safe = T.alloc_var("int32")
            a = T.alloc_var("int32")
            col = T.alloc_var("int32")
            s = T.alloc_var("float32")
            wh = T.alloc_var("bfloat16")
            we = T.alloc_var("bfloat16")
            gh = T.alloc_var("float32")
            ge = T.alloc_var("float32")
            g = tid // LANES
            v = bx * LANES + tid % LANES  # the thread's vector in a partial row
            n = (num_blocks + (R - 1) - g) // R  # its group's rows: g, g + R, ... < num_blocks
            if v >= nvec:
                n = 0
            safe = T.min(v, nvec - 1)  # a vector of row 0 that exists (read when the thread has no row left)
            step = R * nvec  # vectors between two rows of a group
            if n > 0:
                v = g * nvec + v  # the vector of its group's first row (of the pass)
            col = bx * COLS + tid  # the column warp 0's lane writes
            if tid < COLS and col < nvec * 4:  # the writer's operands: their latency hides under the rows'
                wh = T.Tensor(w_flat, "bfloat16", weight_hidden.data)[col]
                we = T.Tensor(w_flat, "bfloat16", weight_embed.data)[col]
                gh = T.Tensor(w_flat, "float32", grad_weight_hidden.data)[col]
                ge = T.Tensor(w_flat, "float32", grad_weight_embed.data)[col]
            for j in T.unroll(4):
                acc[j] = T.float32(0)
            for c in T.serial(T.ceildiv(num_blocks, R * UNROLL)):  # one pass up to 144 rows; block-uniform
                left = n - c * UNROLL  # rows left, this pass's included
                a = T.if_then_else(left > 0, v, safe)
                # unconditional loads (no predicate lives from a load to its sum): rows past the
                # thread's last one re-read that row (or ``safe``) and are not added
                for u in T.unroll(UNROLL):
                    for j in T.vectorized(4):
                        buf[u * 4 + j] = T.Tensor(p_flat, "float32", grad_w_partial.data)[a * 4 + j]
                    if u + 1 < left:
                        a = a + step
                for u in T.unroll(UNROLL):
                    if u < left:
                        for j in T.unroll(4):
                            acc[j] = T.ieee_add(acc[j], buf[u * 4 + j])
                if left > UNROLL:
                    v = v + UNROLL * step
            for j in T.vectorized(4):
                sums[g * COLS + (tid % LANES) * 4 + j] = acc[j]
            T.sync_threads()
            if tid < COLS and col < nvec * 4:
                s = sums[tid]
                for r in T.unroll(R - 1):
                    s = T.ieee_add(s, sums[(r + 1) * COLS + tid])
                gh = T.ieee_add(gh, T.ieee_mul(s, T.Cast("float32", we)))
                ge = T.ieee_add(ge, T.ieee_mul(s, T.Cast("float32", wh)))
                T.Tensor(w_flat, "float32", grad_weight_hidden.data)[col] = gh
                T.Tensor(w_flat, "float32", grad_weight_embed.data)[col] = ge

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
