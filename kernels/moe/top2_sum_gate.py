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
keys in registers, see ``_gating_common``).  Group sums: ranking scores go to a per-warp
shared row, lane ``g`` scans group ``g``.  Selection: ``K`` steps of two ``redux.sync``.
Lane ``s`` then finishes output slot ``s`` (weights recompute ``f`` from the logit: the same
code, so the same bits).  Everything but ``slots`` (experts ``<= 32 * slots``) is run-time.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl
from ._gating_common import KEY_GONE, KEY_NEG_INF, float_key, group_rank, pick_next

WARPS = 4
SLOTS = (2, 8)  # experts <= 64, 256 (32 slots built to a 250 KB cubin: not worth shipping)
HAS_MASK, HAS_FIX, HAS_UNMAPPED, HAS_MAP = 1, 2, 4, 8
SIGMOID, SQRTSOFTPLUS, SOFTMAX = 0, 1, 2
HASH_PRIME = 23333


def _weight_score(x, scoring, row_max, row_sum):
    """The scoring function of one logit (softmax needs the row's max and sum of exps)."""
    softplus = T.if_then_else(x > T.float32(20.0), x, T.log1p(T.exp(x)))
    return T.if_then_else(
        scoring == SIGMOID, T.sigmoid(x),
        T.if_then_else(scoring == SQRTSOFTPLUS, T.sqrt(softplus), T.exp(x - row_max) / row_sum))


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
            keys = T.alloc_local((slots,), "int32")
            ranking = T.alloc_shared((WARPS, slots * 32), "float32")
            active = T.alloc_var("int32", init=1)
            fixed = T.alloc_var("int32", init=0)
            row_max = T.alloc_var("float32", init=0.0)
            row_sum = T.alloc_var("float32", init=1.0)
            chosen = T.alloc_var("int32", init=0)
            rank = T.alloc_var("int32", init=0)
            groups_kept = T.alloc_var("uint32", init=0)
            score = T.alloc_var("float32", init=0.0)
            total = T.alloc_var("float32", init=0.0)
            weight = T.alloc_var("float32", init=0.0)
            idx = T.alloc_var("int64", init=0)
            count = T.alloc_var("int64", init=1)
            per_rank = T.alloc_var("int64", init=1)
            per_dp = T.alloc_var("int64", init=1)
            dp = T.alloc_var("int64", init=0)
            if token < n:  # uniform over the warp
                if (flags & HAS_MASK) != 0:
                    if not mask[token]:
                        active = 0
                if active == 0:
                    if lane < num_out:
                        topk_idx[token, lane] = T.int64(-1)
                        topk_weights[token, lane] = T.float32(0.0)
                    if (flags & HAS_UNMAPPED) != 0 and lane < num_topk:
                        unmapped_topk_idx[token, lane] = T.int64(-1)
                else:
                    grouped = num_groups != num_topk_groups
                    per_group = T.truncdiv(num_experts, T.max(num_groups, 1))
                    # ---- load, softmax statistics, ranking keys
                    row_max = -T.infinity("float32")
                    for j in T.unroll(slots):
                        logit[j] = T.float32(0.0)
                        if j * 32 + lane < num_experts:
                            logit[j] = logits[token, j * 32 + lane]
                            row_max = T.max(row_max, logit[j])
                    if scoring == SOFTMAX:
                        row_max = T.warp_reduce_max(row_max)
                        row_sum = T.float32(0.0)
                        for j in T.unroll(slots):
                            if j * 32 + lane < num_experts:
                                row_sum = row_sum + T.exp(logit[j] - row_max)
                        row_sum = T.warp_reduce_sum(row_sum)
                    for j in T.unroll(slots):
                        keys[j] = KEY_GONE
                        if j * 32 + lane < num_experts:
                            score = T.if_then_else(
                                scoring == SOFTMAX, logit[j],
                                _weight_score(logit[j], scoring, row_max, row_sum)) + bias[j * 32 + lane]
                            keys[j] = float_key(score)
                            if grouped:
                                ranking[warp, j * 32 + lane] = score
                    if (flags & HAS_FIX) != 0:
                        if fix_routing_mask[token]:
                            fixed = 1
                    # ---- selection
                    if fixed == 0:
                        if grouped:
                            T.sync_warp()
                            rank = group_rank(ranking, warp, lane, num_groups, per_group, 2, False)
                            groups_kept = T.Cast("uint32", T.ballot_sync(T.And(lane < num_groups, rank < num_topk_groups)))
                            for j in T.unroll(slots):
                                if j * 32 + lane < num_experts:
                                    if ((groups_kept >> T.Cast("uint32", T.truncdiv(j * 32 + lane, per_group))) & T.uint32(1)) == 0:
                                        keys[j] = KEY_NEG_INF
                        for k in T.serial(num_topk):
                            chosen = pick_next(keys, slots, lane)
                            if lane == k:
                                idx = T.Cast("int64", chosen)
                    elif lane < num_topk:
                        idx = unmapped_topk_idx[token, lane]
                    # ---- weights (lane s < K: routed slot s)
                    score = T.float32(0.0)
                    if lane < num_topk:
                        score = _weight_score(
                            logits[token, T.Cast("int32", T.min(T.max(idx, T.int64(0)), T.Cast("int64", num_experts - 1)))],
                            scoring, row_max, row_sum)
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
                        # ---- EP / TP masking
                        if idx >= 0:
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
            "tl.disable_safe_memory_legalize": True,  # every access is guarded above
            "tl.disable_thread_storage_sync": True,  # one warp per shared row: __syncwarp by hand
            "tl.disable_warp_specialized": True,
        },
        doc="Top-2-sum grouped top-k routing with scoring, masks, physical map and EP/TP masking "
            "(tile_kernels.moe.top2_sum_gate).",
    ),
)

__all__ = ["KERNELS", "SLOTS", "WARPS", "HAS_MASK", "HAS_FIX", "HAS_UNMAPPED", "HAS_MAP", "top2_sum_gate"]
