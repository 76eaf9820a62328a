"""Speed candidate for ``moe.normalize_weight`` at top-k 2, 4, 8 and 16 (issue 12):
``moe._normalize_weight_lanes_candidate(topk_weights, denominator, normalized_weights)``, same
parameters and bits as ``moe.normalize_weight``.

The shipped kernel gives a thread a row: at top-k 8 a warp's load (and store) instruction touches
32 rows 32 bytes apart, 4 bytes of each 32-byte sector, and takes 8 of them per row; tile_kernels,
compiled for the top-k, reads a row with 16-byte vectors.  Here a row is ``TOPK`` consecutive lanes
(a warp holds ``32 / TOPK`` rows): thread ``t`` of a block owns element ``t`` of the block's
``THREADS`` consecutive elements, so every load and store of the weights is one coalesced 128-byte
line per warp.  Each lane gathers its row's ``TOPK`` values with width-``TOPK`` shuffles and sums
them itself, left to right from ``1e-20`` (the shipped kernel's order: the same float32 adds), then
divides its own element (IEEE); the row's first lane stores the denominator.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .normalize_weight import EPS

THREADS = 128
TOPKS = (2, 4, 8, 16)  # lane groups that tile a warp


def normalize_weight_lanes(topk: int):
    """The PrimFunc for rows of exactly ``topk`` weights (a divisor of 32)."""
    num_tokens = T.dynamic("num_tokens")
    rows_per_block = THREADS // topk

    @T.prim_func
    def main(
        topk_weights: T.Tensor((num_tokens, topk), "float32"),
        denominator: T.Tensor((num_tokens,), "float32"),
        normalized_weights: T.Tensor((num_tokens, topk), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_tokens, rows_per_block), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            row = bx * rows_per_block + tid // topk
            j = tid % topk
            mine = T.alloc_var("float32")
            total = T.alloc_var("float32")
            mine = T.float32(0)
            if row < num_tokens:
                mine = topk_weights[row, j]
            total = T.float32(EPS)
            for k in T.unroll(topk):  # every lane shuffles (no divergence around the shuffles)
                total = total + T.shfl_sync(mine, k, topk)
            if row < num_tokens:
                normalized_weights[row, j] = mine / total
                if j == 0:
                    denominator[row] = total

    return main


KERNELS = (
    KernelDecl(
        name="moe._normalize_weight_lanes_candidate",
        factory=normalize_weight_lanes,
        grid=tuple({"topk": k} for k in TOPKS),
        outputs=("denominator", "normalized_weights"),
        align=4,
        doc="Speed candidate for moe.normalize_weight at top-k 2/4/8/16: a row per TOPK lanes, coalesced.",
    ),
)

__all__ = ["KERNELS", "TOPKS", "normalize_weight_lanes"]
