"""``moe._normalize_weight_candidate``: ``moe.normalize_weight`` with the row loads in flight together.

Internal (issue 12): same parameters, same outputs bit for bit as ``moe.normalize_weight``
(``tilebin.ops.moe.normalize_weight`` launches it when ``TILEBIN_CANDIDATE_NORMALIZE_WEIGHT=1``).

Why: the current kernel walks the row with two run-time loops (``for j < num_topk``): nvcc
unrolls them by four at most, so a thread waits for one DRAM round trip per four weights and
reads the row a second time for the division.  tile_kernels compiles for the exact top-k and
issues the whole row at once.  Here one thread still owns one row, but the first ``UNROLL``
weights are loaded by a compile-time unrolled, predicated (``j < num_topk``) sequence into
registers: one round trip for any top-k up to ``UNROLL``, no second read.  Weights past
``UNROLL`` (rare) continue with the serial loop.  The float32 operations and their order are
the current kernel's: ``s = 1e-20f; s += w[0]; s += w[1]; ...``, then ``w[j] / s`` (IEEE).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .normalize_weight import EPS, THREADS

UNROLL = 16  # weights per row held in registers (loaded together); the rest take the serial loop


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
            total = T.alloc_var("float32")
            row = bx * THREADS + tid
            if row < num_tokens:
                for j in T.unroll(UNROLL):
                    if j < num_topk:
                        w[j] = topk_weights[row, j]
                total = T.float32(EPS)
                for j in T.unroll(UNROLL):
                    if j < num_topk:
                        total = total + w[j]
                for j in T.serial(UNROLL, T.max(num_topk, UNROLL)):
                    total = total + topk_weights[row, j]
                denominator[row] = total
                for j in T.unroll(UNROLL):
                    if j < num_topk:
                        normalized_weights[row, j] = w[j] / total
                for j in T.serial(UNROLL, T.max(num_topk, UNROLL)):
                    normalized_weights[row, j] = topk_weights[row, j] / total

    return main


KERNELS = (
    KernelDecl(
        name="moe._normalize_weight_candidate",
        factory=normalize_weight_candidate,
        grid=({},),
        outputs=("denominator", "normalized_weights"),
        align=4,  # element alignment is enough: no vector accesses
        doc="Candidate of moe.normalize_weight (issue 12): same outputs, the row's weights loaded together.",
    ),
)

__all__ = ["KERNELS", "normalize_weight_candidate"]
