"""``moe.topk_sum_and_topk_group_idx``: the groups with the largest top-1 / top-2 sums, ranked.

* ``scores``: ``[num_tokens, num_groups, experts_per_group]`` float32, contiguous.
* ``group_idx``: ``[num_tokens, num_topk_groups]`` int64 (written): group indices by descending
  group score, ties by lower group (``torch.sort(descending=True, stable=True)`` of the sums;
  NaN first).  A group's score is its largest value (``num_topk_sum == 1``) or its two largest
  added in float32 (``== 2``), exactly tile_kernels' torch reference.
* scalar ``num_topk_sum`` (1 or 2, ``<= experts_per_group``); ``num_groups`` is 1..32.

No compile-time key: every size is a run-time value.  Design: a warp per token, ``WARPS``
tokens per block; lane ``g`` finds group ``g``'s key, the whole warp ranks the keys, and lane
``g`` writes its index at its rank.  Three paths, chosen uniformly per launch:

* Rows of up to ``FAST_GROUPS`` groups of exactly 32 (DeepSeek-V3: 8 x 32) stay in registers:
  lane ``l`` loads ``scores[token, g, l]`` for every group ``g`` at once (order keys, see
  ``_gating_common``; slots past the row reload its last group, so no predicates); a group's
  top-1 key is one ``redux.sync`` max, its top-2 key a second max over the other lanes, or the
  top-1 again when a ballot shows it held twice.  The sum is taken of the floats the two keys
  stand for (``key_value``: the same sum key), and every lane ranks its group from the
  (uniform) keys in registers.
* Other rows of up to ``STAGE`` floats: each warp copies its token's row into shared memory with
  coalesced loads all issued at once (a compile-time unrolled sweep with no predicates: one DRAM
  round trip), then lane ``g`` scans group ``g`` there (``group_rank``'s rotation, keys and
  comparisons, with 32-bit shared indices) and the ranks come from ``num_groups`` shuffles.
* Longer rows: ``group_rank`` straight from global memory (the row is cached after the first
  touch).

Every path keys and ranks the same sums the same way, so the outputs are the same bits.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl
from ._gating_common import KEY_GONE, float_key, group_rank, key_value

WARPS = 4
STAGE = 512  # floats of a row staged in shared memory per warp (8 KB per block); longer rows scan global memory
FAST_GROUPS = 8  # 32-expert groups up to this many: keys in registers, group top-2 by warp reductions


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
            warp = tid // 32
            token = bx * WARPS + warp
            staged = T.alloc_shared((WARPS, STAGE), "float32")
            keys = T.alloc_local((FAST_GROUPS,), "int32")
            gkey = T.alloc_local((FAST_GROUPS,), "int32")
            ties = T.alloc_var("uint32", init=0)
            rank = T.alloc_var("int32", init=0)
            key1 = T.alloc_var("int32", init=KEY_GONE)
            key2 = T.alloc_var("int32", init=KEY_GONE)
            val1 = T.alloc_var("float32", init=0.0)
            val2 = T.alloc_var("float32", init=0.0)
            cur = T.alloc_var("float32", init=0.0)
            cur_key = T.alloc_var("int32", init=0)
            group_key = T.alloc_var("int32", init=KEY_GONE)
            idx = T.alloc_var("int32", init=0)
            base = T.alloc_var("int32", init=0)
            if token < num_tokens:  # uniform over the warp
                if per_group == 32 and num_groups <= FAST_GROUPS:  # uniform: group g is lane-slot g
                    for g in T.unroll(FAST_GROUPS):  # unpredicated: slots past the row reload its last group
                        keys[g] = float_key(T.Tensor((num_tokens * num_groups * per_group,), "float32", scores.data)[
                            token * num_groups * per_group + T.min(g, num_groups - 1) * 32 + lane])
                    for g in T.unroll(FAST_GROUPS):
                        key1 = T.warp_reduce_max(keys[g])
                        if num_topk_sum == 2:
                            key2 = T.warp_reduce_max(T.if_then_else(keys[g] == key1, KEY_GONE, keys[g]))
                            ties = T.Cast("uint32", T.ballot_sync(keys[g] == key1))
                            if (ties & (ties - T.uint32(1))) != T.uint32(0):
                                key2 = key1  # the largest key twice
                            key1 = float_key(key_value(key1) + key_value(key2))
                        gkey[g] = key1
                    for g in T.unroll(FAST_GROUPS):
                        if lane == g:
                            group_key = gkey[g]
                    for g in T.unroll(FAST_GROUPS):
                        if g < num_groups and (gkey[g] > group_key or (gkey[g] == group_key and g < lane)):
                            rank = rank + 1
                elif num_groups * per_group <= STAGE:  # uniform over the grid
                    # No predicates: slots past the row load its last value (same line) and are never
                    # read; predicated loads made nvcc split the sweep into two round trips (7 predicate
                    # registers: the 8th load waited for the first store).
                    for k in T.unroll(STAGE // 32):
                        staged[warp, k * 32 + lane] = T.Tensor((num_tokens * num_groups * per_group,), "float32",
                                                               scores.data)[token * num_groups * per_group + T.min(
                                                                   k * 32 + lane, num_groups * per_group - 1)]
                    T.sync_warp()
                    if lane < num_groups:  # group_rank's scan, on the staged row with int32 indices
                        idx = T.truncmod(lane, per_group)  # the same rotation (conflict-free banks)
                        base = warp * STAGE + lane * per_group  # int32: the row fits in STAGE
                        for i in T.serial(per_group):
                            cur = T.Tensor((WARPS * STAGE,), "float32", staged.data)[base + idx]
                            cur_key = float_key(cur)
                            if cur_key > key1:
                                key2 = key1
                                val2 = val1
                                key1 = cur_key
                                val1 = cur
                            elif cur_key > key2:
                                key2 = cur_key
                                val2 = cur
                            idx = T.if_then_else(idx + 1 == per_group, 0, idx + 1)
                        group_key = float_key(T.if_then_else(num_topk_sum == 2, val1 + val2, val1))
                    for h in T.serial(num_groups):
                        cur_key = T.shfl_sync(group_key, h)
                        if cur_key > group_key or (cur_key == group_key and h < lane):
                            rank = rank + 1
                else:
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
        # every access is guarded above; each warp reads only the row it staged (its own T.sync_warp)
        pass_configs={"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True},
        doc="Top-k groups by intra-group top-1/top-2 sum (tile_kernels.moe.topk_sum_and_topk_group_idx); "
            "32-expert groups ranked from registers, other rows staged in shared memory.",
    ),
)

__all__ = ["KERNELS", "WARPS", "topk_sum_and_topk_group_idx"]
