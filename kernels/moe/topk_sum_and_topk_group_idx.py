"""``moe.topk_sum_and_topk_group_idx``: the groups with the largest top-1 / top-2 sums, ranked.

* ``scores``: ``[num_tokens, num_groups, experts_per_group]`` float32, contiguous.
* ``group_idx``: ``[num_tokens, num_topk_groups]`` int64 (written): group indices by descending
  group score, ties by lower group (``torch.sort(descending=True, stable=True)`` of the sums;
  NaN first).  A group's score is its largest value (``num_topk_sum == 1``) or its two largest
  added in float32 (``== 2``), exactly tile_kernels' torch reference.
* scalar ``num_topk_sum`` (1 or 2, ``<= experts_per_group``); ``num_groups`` is 1..32.

No compile-time key: every size is a run-time value.  Design: a warp per token, ``WARPS``
tokens per block; lane ``g`` scans group ``g`` straight from global memory (the row is a few
hundred bytes, cached after the first touch), keys the sum (``_gating_common``), counts the
groups ranked above it with ``num_groups`` shuffles, and writes its index at its rank.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl
from ._gating_common import group_rank

WARPS = 4


def topk_sum_and_topk_group_idx():
    """PrimFunc ranking up to 32 groups of any size per token."""
    num_tokens = T.dynamic("num_tokens")
    num_groups = T.dynamic("num_groups")
    per_group = T.dynamic("experts_per_group")
    num_topk_groups = T.dynamic("num_topk_groups")

    @T.prim_func
    def main(
        scores: T.Tensor((num_tokens, num_groups, per_group), "float32"),
        group_idx: T.Tensor((num_tokens, num_topk_groups), "int64"),
        num_topk_sum: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, WARPS), threads=WARPS * 32) as bx:
            tid = T.get_thread_binding()
            lane = tid % 32
            token = bx * WARPS + tid // 32
            rank = T.alloc_var("int32", init=0)
            if token < num_tokens:  # uniform over the warp
                rank = group_rank(scores, token, lane, num_groups, per_group, num_topk_sum, True)
                if lane < num_groups and rank < num_topk_groups:
                    group_idx[token, rank] = T.Cast("int64", lane)

    return main


KERNELS = (
    KernelDecl(
        name="moe.topk_sum_and_topk_group_idx",
        factory=topk_sum_and_topk_group_idx,
        grid=({},),
        outputs=("group_idx",),
        align=4,
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="Top-k groups by intra-group top-1/top-2 sum (tile_kernels.moe.topk_sum_and_topk_group_idx).",
    ),
)

__all__ = ["KERNELS", "WARPS", "topk_sum_and_topk_group_idx"]
