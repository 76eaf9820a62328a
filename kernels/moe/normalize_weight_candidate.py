"""``moe._normalize_weight_candidate``: ``moe.normalize_weight`` with coalesced loads and stores.

Internal (issue 12): same parameters, same outputs bit for bit as ``moe.normalize_weight``
(``tilebin.ops.moe.normalize_weight`` launches it when ``TILEBIN_CANDIDATE_NORMALIZE_WEIGHT=1``).

Why: with one thread per row, every load and store instruction of a warp is strided by the row
(``4 * num_topk`` bytes): a top-8 warp access touches 32 sectors in 8 lines for 128 useful
bytes, and the shipped kernel issues ``2 * num_topk`` such loads (the division loop reads the
row again) and ``num_topk`` such stores per thread; an earlier candidate that only batched the
loads (one round trip) was not faster.  tile_kernels compiles for the exact top-k and reads a
row with ``LDG.128``s (top-k 8: 2.0 µs; top-k 9, scalar: 3.4 µs).  Here a block's 128 rows
(``128 * num_topk`` contiguous floats) are loaded by consecutive threads (each warp
instruction: 128 contiguous bytes), all loads issued before any use, and staged in shared
memory; thread ``t`` sums row ``t`` from there (``s = 1e-20f; s += w[0]; s += w[1]; ...``, the
shipped order) and the quotients ``w / s`` (IEEE) are stored again by consecutive threads from
the registers that loaded them.  Top-k above ``UNROLL`` takes the shipped per-row loops.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .normalize_weight import EPS, THREADS

UNROLL = 16  # top-k up to this many: the block's rows staged (16 floats per thread, 8 KB shared)


def normalize_weight_candidate():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")

    @T.prim_func
    def main(
        topk_weights: T.Tensor((num_tokens, num_topk), "float32"),
        denominator: T.Tensor((num_tokens,), "float32"),
        normalized_weights: T.Tensor((num_tokens, num_topk), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            w = T.alloc_local((UNROLL,), "float32")
            den = T.alloc_local((UNROLL,), "float32")
            staged = T.alloc_shared((THREADS * UNROLL,), "float32")
            sums = T.alloc_shared((THREADS,), "float32")
            total = T.alloc_var("float32")
            count = T.alloc_var("int32")
            quot = T.alloc_var("int32")
            rem = T.alloc_var("int32")
            row = bx * THREADS + tid
            if num_topk <= UNROLL:  # uniform over the grid
                count = T.min(num_tokens - bx * THREADS, THREADS) * num_topk  # this block's floats
                for i in T.unroll(UNROLL):
                    if i < num_topk:  # uniform; the address is clamped into the block's floats
                        w[i] = T.Tensor((num_tokens * num_topk,), "float32", topk_weights.data)[
                            bx * THREADS * num_topk + T.min(i * THREADS + tid, count - 1)]
                for i in T.unroll(UNROLL):
                    if i * THREADS + tid < count:
                        staged[i * THREADS + tid] = w[i]
                T.sync_threads()
                if row < num_tokens:
                    total = T.float32(EPS)
                    for j in T.serial(num_topk):
                        total = total + staged[tid * num_topk + j]
                    denominator[row] = total
                    sums[tid] = total
                T.sync_threads()
                quot = T.truncdiv(tid, num_topk)  # float i * THREADS + tid of the block is in row quot
                rem = T.truncmod(tid, num_topk)
                for i in T.unroll(UNROLL):  # every divisor read first (clamped into the block's rows)
                    if i < num_topk:  # uniform
                        den[i] = sums[T.min(quot, THREADS - 1)]
                    rem = rem + T.truncmod(THREADS, num_topk)
                    quot = quot + T.truncdiv(THREADS, num_topk) + T.if_then_else(rem >= num_topk, 1, 0)
                    rem = T.if_then_else(rem >= num_topk, rem - num_topk, rem)
                for i in T.unroll(UNROLL):
                    if i * THREADS + tid < count:
                        T.Tensor((num_tokens * num_topk,), "float32", normalized_weights.data)[
                            bx * THREADS * num_topk + i * THREADS + tid] = w[i] / den[i]
            elif row < num_tokens:  # the shipped kernel's loops
                total = T.float32(EPS)
                for j in T.serial(num_topk):
                    total = total + topk_weights[row, j]
                denominator[row] = total
                for j in T.serial(num_topk):
                    normalized_weights[row, j] = topk_weights[row, j] / total

    return main


KERNELS = (
    KernelDecl(
        name="moe._normalize_weight_candidate",
        factory=normalize_weight_candidate,
        grid=({},),
        outputs=("denominator", "normalized_weights"),
        align=4,  # element alignment is enough: no vector accesses
        # the two barriers are placed by hand; every access is guarded or clamped above
        pass_configs={"tl.disable_thread_storage_sync": True, "tl.disable_safe_memory_legalize": True},
        doc="Candidate of moe.normalize_weight (issue 12): same outputs, coalesced staged loads and stores.",
    ),
)

__all__ = ["KERNELS", "normalize_weight_candidate"]
