"""``engram._grad_w_reduce_candidate``: ``engram.grad_w_reduce`` with cheap loads and small, even blocks.

Internal (issue 8): same parameters, same outputs bit for bit as ``engram.grad_w_reduce``
(``tilebin.ops.engram.grad_w_reduce`` launches it when ``TILEBIN_CANDIDATE_GRAD_W_REDUCE=1``).
Contract as there: ``grad_w_partial`` fp32 ``[num_blocks, hc, hidden]``, ``weight_hidden`` and
``weight_embed`` bf16 ``[hc, hidden]``, ``grad_weight_hidden`` and ``grad_weight_embed`` fp32
``[hc, hidden]`` (read and written in place); contiguous, 16-byte aligned, ``hidden % 4 == 0``,
``num_blocks * hc * hidden < 2**31``, any ``num_blocks >= 0``.  The fp32 operations and their
order are the current kernel's: ``R = 16`` row groups, group ``g`` sums the rows ``g, g + R,
...`` in order starting from ``+0``, the ``R`` group sums are added in group order, then
``grad_weight_hidden += s * weight_embed`` and ``grad_weight_embed += s * weight_hidden``
(product and sum rounded apart).

Why (kernels/README.md, "Speed finding: engram.grad_w_reduce"): the current kernel rebuilt a
64-bit ``row * ncols + col`` product chain for every one of its 9 cp.async rows (~300 SASS
instructions per thread before its last copy left), and its 224 blocks of 512 threads at
4 x 7168 sat two on 92 SMs and one on the other 40.  Here a block is ``R`` groups x 8 lanes (128
threads, 32 columns, 2 KB of shared memory; 8 blocks fit per SM, so 896 blocks at 4 x 7168 sit
6-7 per SM and 512 at 4 x 4096 3-4).  A thread's rows are one int32 vector index stepped by a
run-time row stride; its ``UNROLL`` 16-byte loads go straight into registers and are
*unconditional* (a row past the thread's last re-reads that row, or a vector of row 0 when it
has none, and is not added): predicated loads needed 9 live predicates between a load and its
sum, more than the 7 the SM has, and ptxas then moved the first sums (which wait for the first
rows) ahead of the last loads.  So every load of a thread is issued before its first sum (~5
SASS instructions per row: ``ISETP``, ``SEL``, ``IADD3``, ``IMAD.WIDE``, ``LDG.E.128``), and
there is no shared-memory round trip for the rows.  The group sums meet in shared memory; warp
0 (one column per lane) adds them in group order, applies the weights and writes.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .grad_w_reduce import R

LANES = 8  # threads per row group; each owns one 16-byte vector (4 columns) of the block's columns
THREADS = R * LANES
COLS = LANES * 4  # columns per block
UNROLL = 9  # rows in flight per thread: R * UNROLL = 144 >= the SM count of every Hopper part (one pass)


def grad_w_reduce_candidate():
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
        name="engram._grad_w_reduce_candidate",
        factory=grad_w_reduce_candidate,
        grid=({},),
        outputs=("grad_weight_hidden", "grad_weight_embed"),
        # every access is guarded above; the only cross-thread exchange (the group sums) has its own barrier
        pass_configs={"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True},
        doc="engram.grad_w_reduce (speed candidate, same bits): s = sum_p grad_w_partial[p]; "
            "grad_weight_hidden += s * weight_embed; grad_weight_embed += s * weight_hidden.",
    ),
)

__all__ = ["KERNELS", "grad_w_reduce_candidate"]
