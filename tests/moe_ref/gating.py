"""Torch references of the gating ops (tile_kernels.moe 1.0.0 semantics): ``stable_topk``,
``topk_gate``, ``topk_sum_and_topk_group_idx``, ``top2_sum_gate``.

Ranking is ``torch.sort(descending=True, stable=True)``: larger first, equal values by lower
index, NaN first.  Integer outputs are exact; float weights follow torch's own arithmetic
(the kernels compute the same formulas, so sigmoid / sqrt-softplus scores agree bit for bit,
softmax and the weight sums up to rounding: compare weights with ``torch.allclose``'s
defaults, as tile_kernels' tests do).  Works on CPU and CUDA tensors.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

HASH_PRIME = 23333


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest values per row (descending, ties by lower index), int64."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :k].contiguous()


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    return stable_topk(scores, num_topk)


def group_scores(scores: torch.Tensor, num_topk_sum: int) -> torch.Tensor:
    """``[tokens, groups, per_group]`` -> ``[tokens, groups]``: sum of each group's largest values."""
    return scores.topk(num_topk_sum, dim=-1, sorted=False).values.sum(-1)


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    return stable_topk(group_scores(scores, num_topk_sum), num_topk_groups)


def scoring(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """The weight score of every expert (before bias)."""
    name = scoring_func.lower()
    if name == "sigmoid":
        return torch.sigmoid(logits)
    if name == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    if name == "softmax":
        return torch.softmax(logits, dim=-1)
    raise ValueError(f"unknown scoring function {scoring_func!r}")


def ranking_scores(logits: torch.Tensor, bias: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """What experts are ranked by: score + bias, or logit + bias for softmax."""
    base = logits if scoring_func.lower() == "softmax" else scoring(logits, scoring_func)
    return base + bias.unsqueeze(0)


def limit_groups(ranked: torch.Tensor, num_groups: int, num_topk_groups: int) -> torch.Tensor:
    """Experts outside the ``num_topk_groups`` best groups (top-2 sums) rank as -inf."""
    if num_groups == num_topk_groups:
        return ranked
    tokens, experts = ranked.shape
    keep = topk_sum_and_topk_group_idx(ranked.view(tokens, num_groups, experts // num_groups), 2, num_topk_groups)
    dropped = torch.ones(tokens, num_groups, dtype=torch.bool, device=ranked.device).scatter_(1, keep, False)
    dropped = dropped.repeat_interleave(experts // num_groups, dim=1)
    return ranked.masked_fill(dropped, float("-inf"))


def _physical(idx: torch.Tensor, tokens: torch.Tensor, ep_rank: int, to_physical_map: torch.Tensor,
              logical_count: torch.Tensor) -> torch.Tensor:
    valid = (idx >= 0) & (idx < to_physical_map.shape[0])
    safe = idx.clamp(0, to_physical_map.shape[0] - 1)
    count = logical_count.long()[safe]
    ok = valid & (count > 0)
    dup = (ep_rank + tokens.unsqueeze(1) * HASH_PRIME) % count.clamp(min=1)
    ok &= dup < to_physical_map.shape[1]
    mapped = to_physical_map.long()[safe, dup.clamp(max=to_physical_map.shape[1] - 1)]
    return torch.where(ok, mapped, idx)


def _ep_tp_mask(idx: torch.Tensor, per_rank: int, tp_rank: int, num_tp_ranks: int) -> torch.Tensor:
    valid = idx >= 0
    safe = idx.clamp(min=0)
    on_rank = (safe // per_rank) % num_tp_ranks == tp_rank
    local = safe - tp_rank * per_rank
    dp = local // (per_rank * num_tp_ranks)
    local = local - dp * (per_rank * num_tp_ranks) + dp * per_rank
    out = torch.where(on_rank & (local >= 0), local, torch.full_like(idx, -1))
    return torch.where(valid, out, idx)


def top2_sum_gate(
    logits: torch.Tensor, bias: torch.Tensor, num_topk: int, num_topk_groups: int, num_groups: int,
    use_shared_as_routed: bool, num_shared_experts: int, routed_scaling_factor: float,
    ep_rank: int, num_ep_ranks: int, tp_rank: int, num_tp_ranks: int, scoring_func: str,
    mask: Optional[torch.Tensor] = None, fix_routing_mask: Optional[torch.Tensor] = None,
    to_physical_map: Optional[torch.Tensor] = None, logical_count: Optional[torch.Tensor] = None,
    unmapped_topk_idx: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of ``tilebin.ops.moe.top2_sum_gate`` (writes ``unmapped_topk_idx`` in place)."""
    tokens, experts = logits.shape
    shared = num_shared_experts if use_shared_as_routed else 0
    device = logits.device
    weight_scores = scoring(logits, scoring_func)
    selected = stable_topk(limit_groups(ranking_scores(logits, bias, scoring_func), num_groups, num_topk_groups),
                           num_topk)
    idx = selected
    if fix_routing_mask is not None:
        fixed = fix_routing_mask.reshape(-1).unsqueeze(1)
        idx = torch.where(fixed, unmapped_topk_idx, selected)
    picked = weight_scores.gather(1, idx.clamp(0, experts - 1))
    total = picked.sum(-1, keepdim=True).clamp(min=1e-20)
    weights = picked / total * routed_scaling_factor
    active = torch.ones(tokens, dtype=torch.bool, device=device) if mask is None else mask.reshape(-1)
    if unmapped_topk_idx is not None:
        unmapped_topk_idx.copy_(torch.where(active.unsqueeze(1), idx, torch.full_like(idx, -1)))
    if shared:
        extra = torch.arange(experts, experts + shared, device=device).expand(tokens, shared)
        idx = torch.cat([idx, extra], dim=1)
        weights = torch.cat([weights, torch.ones(tokens, shared, device=device)], dim=1)
    num_extra = 0
    if to_physical_map is not None:
        num_extra = to_physical_map.shape[1] - 1
        idx = _physical(idx, torch.arange(tokens, device=device), ep_rank, to_physical_map, logical_count)
    idx = _ep_tp_mask(idx, (experts + num_extra) // num_ep_ranks, tp_rank, num_tp_ranks)
    idx = torch.where(active.unsqueeze(1), idx, torch.full_like(idx, -1))
    weights = torch.where(active.unsqueeze(1), weights, torch.zeros_like(weights))
    return idx.contiguous(), weights.contiguous()


def _bad_rows(ranked: torch.Tensor, num_topk: int, num_groups: int, num_topk_groups: int,
              gap: float, group_gap: float) -> torch.Tensor:
    """Rows whose selection could flip under a last-bit difference in the ranking scores."""
    tokens, experts = ranked.shape
    bad = torch.zeros(tokens, dtype=torch.bool, device=ranked.device)
    if num_groups != num_topk_groups:
        sums = group_scores(ranked.view(tokens, num_groups, experts // num_groups), 2).sort(-1, descending=True).values
        bad |= ~(sums[:, num_topk_groups - 1] - sums[:, num_topk_groups] > group_gap)
    top = limit_groups(ranked, num_groups, num_topk_groups).sort(-1, descending=True).values[:, :num_topk + 1]
    if top.shape[1] > 1:
        bad |= ~(top[:, :-1] - top[:, 1:] > gap).all(-1)
    return bad


def separated_logits(tokens: int, experts: int, bias: torch.Tensor, scoring_func: str, num_topk: int,
                     num_groups: int, num_topk_groups: int, generator: Optional[torch.Generator] = None,
                     gap: float = 2e-6, group_gap: float = 1e-6) -> torch.Tensor:
    """Random logits whose top-k (and top groups) are separated by ``gap`` (``group_gap``), so a
    kernel whose scores differ from torch's in the last bit still selects the same experts in
    the same order (tile_kernels' test draws its inputs the same way).  Redraws bad rows only."""
    logits = torch.randn(tokens, experts, device=bias.device, generator=generator)
    for _ in range(100):
        bad = _bad_rows(ranking_scores(logits, bias, scoring_func), num_topk, num_groups, num_topk_groups,
                        gap, group_gap)
        count = int(bad.sum())
        if not count:
            return logits
        logits[bad] = torch.randn(count, experts, device=bias.device, generator=generator)
    raise RuntimeError("could not draw well-separated logits")
