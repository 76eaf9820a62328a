"""``moe.top2_sum_gate``: score, (group-limited) stable top-k, normalise, map and mask expert routes.

Parameters, in order (``n`` tokens, ``E`` routed experts, ``K`` = ``num_topk``, ``P`` = ``K`` +
shared experts used as routed):

* ``logits`` ``[n, E]`` float32, ``bias`` ``[E]`` float32 (contiguous).
* ``mask`` ``[mask_len]`` bool, ``fix_routing_mask`` ``[fix_len]`` bool,
  ``to_physical_map`` ``[L, D]`` int32, ``logical_count`` ``[count_len]`` int32: optional
  inputs; the op passes a 1-element placeholder for an absent one and clears its ``flags`` bit.
* ``unmapped_topk_idx`` ``[n, K]`` int64 with a run-time row stride (read for fixed-routing
  tokens, written for all tokens when ``flags & HAS_UNMAPPED``).
* ``topk_idx`` ``[n, P]`` int64, ``topk_weights`` ``[n, P]`` float32 (written).
* scalars ``num_topk``, ``num_groups``, ``num_topk_groups`` (``num_groups == num_topk_groups``
  means no group limit), ``scoring`` (0 sigmoid, 1 sqrtsoftplus, 2 softmax), ``flags``
  (``HAS_*``), ``num_extra_experts``, ``routed_scaling_factor``, ``ep_rank``,
  ``num_ep_ranks``, ``tp_rank``, ``num_tp_ranks``.

Semantics (tile_kernels 1.0.0's torch reference): a token whose mask is False gets index -1
and weight 0 everywhere (and -1 in ``unmapped_topk_idx``).  Otherwise the ranking score of
expert ``e`` is ``f(logit) + bias`` (``logit + bias`` for softmax), the weight score ``f(logit)``
with ``f`` the scoring function (sigmoid, ``sqrt(softplus)`` with threshold 20, softmax over the
row).  With a group limit, only the ``num_topk_groups`` groups with the largest top-2 sums of
ranking scores stay (ties: lower group); the others rank as ``-inf``.  The ``K`` largest ranking
scores are taken in descending order, ties by lower index (NaN first, as torch sorts it);
fixed-routing tokens take ``unmapped_topk_idx``'s row instead.  Weights are the weight
scores over their sum (at least 1e-20) times ``routed_scaling_factor``; shared-expert slots
``K <= s < P`` get expert ``E + s - K`` and weight 1.  With a physical map, logical expert
``x`` becomes ``to_physical_map[x, (ep_rank + token * 23333) % logical_count[x]]`` (in 64-bit).
Last, EP/TP masking: ``r = (E + num_extra_experts) // num_ep_ranks`` experts per rank; an
index on an EP rank with ``rank % num_tp_ranks != tp_rank`` becomes -1, the others are
renumbered to this TP rank's view.  Indices that would read out of bounds (an invalid fixed
route, a zero ``logical_count``) are left as they are instead.

Design: a warp per token, ``WARPS`` per block; lane ``l`` owns experts ``j * 32 + l`` (order
keys in registers, see ``_gating_common``).  Only ``slots`` (experts ``<= 32 * slots``) is
compile-time; the op picks the smallest of ``SLOTS`` that fits (``slots = 4`` serves 65-128
experts, e.g. 108, with half the padding slots of 8).

* Every input is requested before any arithmetic: the mask, the fixed-routing flag, the whole
  logits row and the bias (addresses clamped, no predicates): one round trip.
* One uniform branch per scoring function; the scoring function's value (the logit for softmax)
  goes to a per-warp shared row and is read back for the weights (no second global read).
* Group limit with 32 experts per group (DeepSeek-V3: 256 experts, 8 groups): slot ``j`` *is*
  group ``j``; its top-2 keys are two ``redux.sync`` and a ballot (all groups in parallel), the
  sum is taken of the floats those keys stand for (``key_value``: the same sum key), and every
  lane ranks the groups from registers.  Other group sizes: ranking scores go to a per-warp
  shared row and ``group_rank`` scans group ``g`` in lane ``g``.
* Selection: ``K`` steps; the lane's best key is a max tree, the lowest index holding the warp
  max a min tree (largest key, lowest index), each then one ``redux.sync``.
* Lane ``s`` finishes output slot ``s``: routed weights are ``f`` over the float32 sum of the
  ``K`` values taken in slot order (at least 1e-20) times ``routed_scaling_factor``; with
  ``num_tp_ranks == 1`` the EP/TP renumbering is the identity and is skipped.
SASS (nvcc 13.0): slots 8: 56 registers, no spills, the 16 row/bias ``LDG``s and the two mask
``LDG.U8``s issued back to back, 16 ``REDUX`` + 8 ``VOTE`` for the group sums, ~45 instructions
per selection step; slots 4 / 2: 40 / 32 registers; shared 8 / 4 / 2 KB per block.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl
from ._gating_common import INDEX_NONE, KEY_GONE, KEY_NEG_INF, float_key, group_rank, key_value

WARPS = 4
SLOTS = (2, 4, 8)  # experts <= 64, 128, 256 (the op picks 4 for 65-128 experts: half the slots of 8)
HAS_MASK, HAS_FIX, HAS_UNMAPPED, HAS_MAP = 1, 2, 4, 8
SIGMOID, SQRTSOFTPLUS, SOFTMAX = 0, 1, 2
HASH_PRIME = 23333


def _tree(op, items):
    """``op`` folded over ``items`` as a balanced tree (short dependency chains)."""
    while len(items) > 1:
        items = [op(items[i], items[i + 1]) if i + 1 < len(items) else items[i] for i in range(0, len(items), 2)]
    return items[0]


def _lane_best(keys, slots: int):
    """The largest key of the lane's slots."""
    return _tree(T.max, [keys[j] for j in range(slots)])


def _lowest_holder(keys, slots: int, top, lane):
    """The lowest expert index of the lane holding key ``top`` (``INDEX_NONE`` if none)."""
    return _tree(T.min, [T.if_then_else(keys[j] == top, j * 32 + lane, INDEX_NONE) for j in range(slots)])


def _softplus(x):
    return T.if_then_else(x > T.float32(20.0), x, T.log1p(T.exp(x)))


def top2_sum_gate(slots: int):
    """PrimFunc routing up to ``32 * slots`` experts per token."""
    n = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_out = T.dynamic("num_physical_topk")
    mask_len = T.dynamic("mask_len")
    fix_len = T.dynamic("fix_len")
    num_logical = T.dynamic("num_logical_experts")
    num_dup = T.dynamic("num_duplicates")
    count_len = T.dynamic("count_len")
    u_rows = T.dynamic("unmapped_rows")
    u_cols = T.dynamic("unmapped_cols")
    u_stride = T.dynamic("unmapped_stride")

    @T.prim_func
    def main(
        logits: T.Tensor((n, num_experts), "float32"),
        bias: T.Tensor((num_experts,), "float32"),
        mask: T.Tensor((mask_len,), "bool"),
        fix_routing_mask: T.Tensor((fix_len,), "bool"),
        to_physical_map: T.Tensor((num_logical, num_dup), "int32"),
        logical_count: T.Tensor((count_len,), "int32"),
        unmapped_topk_idx: T.StridedTensor((u_rows, u_cols), (u_stride, 1), "int64"),
        topk_idx: T.Tensor((n, num_out), "int64"),
        topk_weights: T.Tensor((n, num_out), "float32"),
        num_topk: T.int32,
        num_groups: T.int32,
        num_topk_groups: T.int32,
        scoring: T.int32,
        flags: T.int32,
        num_extra_experts: T.int32,
        routed_scaling_factor: T.float32,
        ep_rank: T.int32,
        num_ep_ranks: T.int32,
        tp_rank: T.int32,
        num_tp_ranks: T.int32,
    ):
        with T.Kernel(T.ceildiv(n, WARPS), threads=WARPS * 32) as bx:
            tid = T.get_thread_binding()
            lane = tid % 32
            warp = tid // 32
            token = bx * WARPS + warp
            logit = T.alloc_local((slots,), "float32")
            bias_r = T.alloc_local((slots,), "float32")
            keys = T.alloc_local((slots,), "int32")
            gkey = T.alloc_local((slots,), "int32")
            wrow = T.alloc_shared((WARPS, slots * 32), "float32")  # f(logit) (softmax: the logit)
            ranking = T.alloc_shared((WARPS, slots * 32), "float32")  # group sizes other than 32 only
            mask_v = T.alloc_var("int32", init=1)
            fix_v = T.alloc_var("int32", init=0)
            row_max = T.alloc_var("float32", init=0.0)
            row_sum = T.alloc_var("float32", init=1.0)
            fval = T.alloc_var("float32", init=0.0)
            score = T.alloc_var("float32", init=0.0)
            m1 = T.alloc_var("int32", init=0)
            m2 = T.alloc_var("int32", init=0)
            mine = T.alloc_var("int32", init=KEY_GONE)
            rank = T.alloc_var("int32", init=0)
            groups_kept = T.alloc_var("uint32", init=0)
            top = T.alloc_var("int32", init=0)
            chosen = T.alloc_var("int32", init=0)
            total = T.alloc_var("float32", init=0.0)
            weight = T.alloc_var("float32", init=0.0)
            idx = T.alloc_var("int64", init=0)
            count = T.alloc_var("int64", init=1)
            per_rank = T.alloc_var("int64", init=1)
            per_dp = T.alloc_var("int64", init=1)
            dp = T.alloc_var("int64", init=0)
            if token < n:  # uniform over the warp
                # ---- every input load first (clamped addresses: valid, unpredicated)
                mask_v = T.Cast("int32", mask[T.min(token, mask_len - 1)])
                fix_v = T.Cast("int32", fix_routing_mask[T.min(token, fix_len - 1)])
                for j in T.unroll(slots):
                    logit[j] = logits[token, T.min(j * 32 + lane, num_experts - 1)]
                    bias_r[j] = bias[T.min(j * 32 + lane, num_experts - 1)]
                if (flags & HAS_MASK) != 0 and mask_v == 0:
                    if lane < num_out:
                        topk_idx[token, lane] = T.int64(-1)
                        topk_weights[token, lane] = T.float32(0.0)
                    if (flags & HAS_UNMAPPED) != 0 and lane < num_topk:
                        unmapped_topk_idx[token, lane] = T.int64(-1)
                else:
                    grouped = num_groups != num_topk_groups
                    per_group = T.truncdiv(num_experts, T.max(num_groups, 1))
                    # ---- scoring, ranking keys (the shipped kernel's float operations)
                    if scoring == SOFTMAX:
                        row_max = -T.infinity("float32")
                        for j in T.unroll(slots):
                            if j * 32 + lane < num_experts:
                                row_max = T.max(row_max, logit[j])
                        row_max = T.warp_reduce_max(row_max)
                        row_sum = T.float32(0.0)
                        for j in T.unroll(slots):
                            if j * 32 + lane < num_experts:
                                row_sum = row_sum + T.exp(logit[j] - row_max)
                        row_sum = T.warp_reduce_sum(row_sum)
                        for j in T.unroll(slots):
                            wrow[warp, j * 32 + lane] = logit[j]
                            score = logit[j] + bias_r[j]
                            keys[j] = T.if_then_else(j * 32 + lane < num_experts, float_key(score), KEY_GONE)
                            if grouped and per_group != 32 and j * 32 + lane < num_experts:
                                ranking[warp, j * 32 + lane] = score
                    elif scoring == SIGMOID:
                        for j in T.unroll(slots):
                            fval = T.sigmoid(logit[j])
                            wrow[warp, j * 32 + lane] = fval
                            score = fval + bias_r[j]
                            keys[j] = T.if_then_else(j * 32 + lane < num_experts, float_key(score), KEY_GONE)
                            if grouped and per_group != 32 and j * 32 + lane < num_experts:
                                ranking[warp, j * 32 + lane] = score
                    else:
                        for j in T.unroll(slots):
                            fval = T.sqrt(_softplus(logit[j]))
                            wrow[warp, j * 32 + lane] = fval
                            score = fval + bias_r[j]
                            keys[j] = T.if_then_else(j * 32 + lane < num_experts, float_key(score), KEY_GONE)
                            if grouped and per_group != 32 and j * 32 + lane < num_experts:
                                ranking[warp, j * 32 + lane] = score
                    T.sync_warp()
                    # ---- selection
                    if (flags & HAS_FIX) == 0 or fix_v == 0:
                        if grouped:
                            if per_group == 32:  # slot j is group j
                                for j in T.unroll(slots):
                                    m1 = T.warp_reduce_max(keys[j])
                                    m2 = T.warp_reduce_max(T.if_then_else(keys[j] == m1, KEY_GONE, keys[j]))
                                    groups_kept = T.Cast("uint32", T.ballot_sync(keys[j] == m1))
                                    if (groups_kept & (groups_kept - T.uint32(1))) != T.uint32(0):
                                        m2 = m1  # the largest key twice
                                    gkey[j] = float_key(key_value(m1) + key_value(m2))
                                mine = KEY_GONE
                                for j in T.unroll(slots):
                                    if lane == j:
                                        mine = gkey[j]
                                rank = 0
                                for j in T.unroll(slots):
                                    if j < num_groups and (gkey[j] > mine or (gkey[j] == mine and j < lane)):
                                        rank = rank + 1
                                groups_kept = T.Cast("uint32", T.ballot_sync(T.And(lane < num_groups, rank < num_topk_groups)))
                                for j in T.unroll(slots):
                                    if j * 32 + lane < num_experts and ((groups_kept >> T.uint32(j)) & T.uint32(1)) == 0:
                                        keys[j] = KEY_NEG_INF
                            else:
                                rank = group_rank(ranking, warp, lane, num_groups, per_group, 2, False)
                                groups_kept = T.Cast("uint32", T.ballot_sync(T.And(lane < num_groups, rank < num_topk_groups)))
                                for j in T.unroll(slots):
                                    if j * 32 + lane < num_experts:
                                        if ((groups_kept >> T.Cast("uint32", T.truncdiv(j * 32 + lane, per_group))) & T.uint32(1)) == 0:
                                            keys[j] = KEY_NEG_INF
                        for k in T.serial(num_topk):
                            top = T.warp_reduce_max(_lane_best(keys, slots))
                            chosen = T.warp_reduce_min(_lowest_holder(keys, slots, top, lane))
                            for j in T.unroll(slots):
                                if j * 32 + lane == chosen:
                                    keys[j] = KEY_GONE
                            if lane == k:
                                idx = T.Cast("int64", chosen)
                    elif lane < num_topk:
                        idx = unmapped_topk_idx[token, lane]
                    # ---- weights (lane s < K: routed slot s)
                    score = T.float32(0.0)
                    if lane < num_topk:
                        fval = wrow[warp, T.Cast("int32", T.min(T.max(idx, T.int64(0)), T.Cast("int64", num_experts - 1)))]
                        score = T.if_then_else(scoring == SOFTMAX, T.exp(fval - row_max) / row_sum, fval)
                    total = T.float32(0.0)
                    for k in T.serial(num_topk):
                        total = total + T.shfl_sync(score, k)
                    if total < T.float32(1e-20):  # NaN stays NaN, like torch's clamp
                        total = T.float32(1e-20)
                    if lane < num_topk:
                        weight = score / total * routed_scaling_factor
                        if (flags & HAS_UNMAPPED) != 0:
                            unmapped_topk_idx[token, lane] = idx
                    elif lane < num_out:
                        weight = T.float32(1.0)
                        idx = T.Cast("int64", num_experts + lane - num_topk)
                    if lane < num_out:
                        # ---- logical -> physical
                        if (flags & HAS_MAP) != 0 and idx >= 0 and idx < T.Cast("int64", num_logical):
                            count = T.Cast("int64", logical_count[T.Cast("int32", idx)])
                            if count > 0:
                                dp = T.truncmod(T.Cast("int64", ep_rank) + T.Cast("int64", token) * HASH_PRIME, count)
                                if dp < T.Cast("int64", num_dup):
                                    idx = T.Cast("int64", to_physical_map[T.Cast("int32", idx), T.Cast("int32", dp)])
                        # ---- EP / TP masking (the identity with one TP rank)
                        if idx >= 0 and num_tp_ranks != 1:
                            per_rank = T.Cast("int64", T.truncdiv(num_experts + num_extra_experts, num_ep_ranks))
                            per_dp = per_rank * T.Cast("int64", num_tp_ranks)
                            if T.truncmod(T.truncdiv(idx, per_rank), T.Cast("int64", num_tp_ranks)) != T.Cast("int64", tp_rank):
                                idx = T.int64(-1)
                            else:
                                idx = idx - T.Cast("int64", tp_rank) * per_rank
                                dp = T.truncdiv(idx, per_dp)
                                idx = idx - dp * per_dp + dp * per_rank
                                if idx < 0:
                                    idx = T.int64(-1)
                        topk_idx[token, lane] = idx
                        topk_weights[token, lane] = weight

    return main


KERNELS = (
    KernelDecl(
        name="moe.top2_sum_gate",
        factory=top2_sum_gate,
        grid=tuple({"slots": s} for s in SLOTS),
        outputs=("topk_idx", "topk_weights", "unmapped_topk_idx"),
        align=1,  # scalar accesses only
        pass_configs={
            "tl.disable_safe_memory_legalize": True,  # every access is guarded or clamped above
            "tl.disable_thread_storage_sync": True,  # one warp per shared row: __syncwarp by hand
            "tl.disable_warp_specialized": True,
        },
        doc="Top-2-sum grouped top-k routing with scoring, masks, physical map and EP/TP masking "
            "(tile_kernels.moe.top2_sum_gate); every input load issued first, 32-expert groups ranked from registers.",
    ),
)

__all__ = ["KERNELS", "SLOTS", "WARPS", "HAS_MASK", "HAS_FIX", "HAS_UNMAPPED", "HAS_MAP", "top2_sum_gate"]
