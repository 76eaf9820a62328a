"""``moe._topk_sum_and_topk_group_idx_candidate``: ``moe.topk_sum_and_topk_group_idx`` scanning a staged row.

Internal (issue 12): same parameters, same outputs bit for bit as the current kernel
(``tilebin.ops.moe.topk_sum_and_topk_group_idx`` launches it when
``TILEBIN_CANDIDATE_TOPK_SUM_AND_TOPK_GROUP_IDX=1``).

Why: in the current kernel lane ``g`` walks group ``g`` straight from global memory in a
run-time loop, so every value costs a 64-bit address computation and an L1 round trip
(``LDG``), and the first touch of each group's line is a DRAM miss taken lane by lane.
tile_kernels first copies the token's row into shared memory (coalesced) and scans it there.
Here each warp copies its token's row (up to ``STAGE`` floats) into shared memory with
coalesced loads all issued at once (a compile-time unrolled sweep with no predicates: one DRAM
round trip), then runs ``group_rank``'s scan (same rotation, same keys, same comparisons) on
the shared copy with int32 indices: 32-bit shared addresses, ``LDS`` latency.  Rows longer
than ``STAGE`` take the current global-memory scan (``group_rank``).  The ranking step
(shuffles) is the current one, so the outputs are the same bits.

Rows of up to ``FAST_GROUPS`` groups of exactly 32 (DeepSeek-V3: 8 x 32) skip shared memory
and the serial scan: lane ``l`` loads ``scores[token, g, l]`` for every group ``g`` at once
(order keys in registers), a group's top-1 key is one ``redux.sync`` max; its top-2 key a
second max over the other lanes, or the top-1 again when a ballot shows it held twice.  The
sum is taken of the floats the two keys stand for: keys are exact but for the sign of zero
and NaN payloads, neither of which changes the key of the sum, so the group keys (and ranks)
are the scan's.  Every lane then ranks its group from the (uniform) keys in registers.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl
from ._gating_common import KEY_GONE, float_key, group_rank
from .topk_sum_and_topk_group_idx import WARPS

STAGE = 512  # floats of a row staged in shared memory per warp (8 KB per block); longer rows scan global memory
FAST_GROUPS = 8  # 32-expert groups up to this many: keys in registers, group top-2 by warp reductions


def _key_value(key):
    """A float32 whose order key is ``key`` (``KEY_NAN`` -> a NaN, 0 -> +0.0)."""
    return T.reinterpret(T.if_then_else(key >= 0, key, T.bitwise_or(-key, T.int32(-(2**31)))), "float32")


def topk_sum_and_topk_group_idx_candidate():
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
                            key1 = float_key(_key_value(key1) + _key_value(key2))
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
        name="moe._topk_sum_and_topk_group_idx_candidate",
        factory=topk_sum_and_topk_group_idx_candidate,
        grid=({},),
        outputs=("group_idx",),
        align=4,
        # every access is guarded above; each warp reads only the row it staged (its own T.sync_warp)
        pass_configs={"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True},
        doc="Candidate of moe.topk_sum_and_topk_group_idx (issue 12): same outputs, the row staged in shared memory.",
    ),
)

__all__ = ["KERNELS", "topk_sum_and_topk_group_idx_candidate"]
