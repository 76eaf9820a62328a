"""Argument checks of the gating ops (``_gating``): each raises an ArgumentError naming the op, the
argument, the value received, what is supported and the fix (``ops._common.fail``).  No GPU work.

The ops' OpSpecs check each tensor's type, dtype and rank first; the checks here then run in
the order the ops have always run them (:func:`check_top2` is top2_sum_gate's whole sequence),
so a call with one bad argument gets the same message as before the OpSpecs."""

from __future__ import annotations

from typing import Any

import torch

from .._common import check_float32, check_tensor, fail

_INT32_MAX = 2**31 - 1
SLOTS = (2, 8, 32)  # kernels' register slots per lane: experts <= 32 * slots
TOP2_SLOTS = (2, 4, 8)  # top2_sum_gate: experts <= 256 (4: 65-128 experts, half the padding slots of 8)
SCORING = {"sigmoid": 0, "sqrtsoftplus": 1, "softmax": 2}


def slots_for(op: str, num_experts: int, slots: tuple[int, ...] = SLOTS) -> int:
    """The fewest register slots per lane that hold ``num_experts`` (32 lanes a warp)."""
    for s in slots:
        if num_experts <= 32 * s:
            return s
    raise fail(op, f"{num_experts} experts per token are not supported (at most {32 * slots[-1]})")


def strict_int(op: str, name: str, value: Any, lo: int, hi: int = _INT32_MAX) -> int:
    """``value``, a Python int (not a bool, not an integer-like) in ``[lo, hi]``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise fail(op, f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise fail(op, f"{name}={value} is out of range; supported: {lo} <= {name} <= {hi}")
    return value


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (strides {tuple(t.stride())}); pass {name}.contiguous()")


def check_routing(op: str, num_experts: int, num_topk: Any, num_topk_groups: Any, num_groups: Any,
                  use_shared_as_routed: Any, num_shared_experts: Any) -> int:
    """Validate the routing shape; returns the number of shared experts used as routed."""
    strict_int(op, "num_topk", num_topk, 1, min(num_experts, 32))
    strict_int(op, "num_groups", num_groups, 0, num_experts)
    strict_int(op, "num_topk_groups", num_topk_groups, 0, num_groups)
    if (num_groups == 0) != (num_topk_groups == 0):
        raise fail(op, f"num_groups={num_groups} and num_topk_groups={num_topk_groups}: both must be zero "
                       "(no group limit) or both non-zero")
    if num_groups and num_experts % num_groups:
        raise fail(op, f"{num_experts} routed experts are not divisible by num_groups={num_groups}")
    if num_groups != num_topk_groups:
        if num_groups > 32:
            raise fail(op, f"num_groups={num_groups} with a group limit is not supported (at most 32: one warp "
                           "lane per group)")
        if num_experts // num_groups < 2:
            raise fail(op, f"{num_experts // num_groups} expert(s) per group cannot give a top-2 sum; "
                           "use at least 2 experts per group")
    if not isinstance(use_shared_as_routed, bool):
        raise fail(op, f"use_shared_as_routed must be a bool, got {use_shared_as_routed!r}")
    if not use_shared_as_routed:  # unused then, but still an int (a typo must not pass silently)
        strict_int(op, "num_shared_experts", num_shared_experts, 0, 32)
        return 0
    strict_int(op, "num_shared_experts", num_shared_experts, 1, 2)
    if num_topk % num_shared_experts or num_experts % (num_topk // num_shared_experts):
        raise fail(op, f"use_shared_as_routed needs num_topk % num_shared_experts == 0 and num_routed_experts % "
                       f"(num_topk // num_shared_experts) == 0 (got num_topk={num_topk}, num_shared_experts="
                       f"{num_shared_experts}, {num_experts} routed experts)")
    if num_topk + num_shared_experts > 32:
        raise fail(op, f"num_topk + num_shared_experts = {num_topk + num_shared_experts} outputs per token; "
                       "supported: at most 32")
    return num_shared_experts


def check_ranks(op: str, num_experts: int, num_extra: int, ep_rank: Any, num_ep_ranks: Any,
                tp_rank: Any, num_tp_ranks: Any, routed_scaling_factor: Any) -> float:
    strict_int(op, "num_ep_ranks", num_ep_ranks, 1)
    strict_int(op, "ep_rank", ep_rank, 0, num_ep_ranks - 1)
    strict_int(op, "num_tp_ranks", num_tp_ranks, 1)
    strict_int(op, "tp_rank", tp_rank, 0, num_tp_ranks - 1)
    if (num_experts + num_extra) // num_ep_ranks < 1:
        raise fail(op, f"{num_experts} routed + {num_extra} extra experts over num_ep_ranks={num_ep_ranks} "
                       "leaves no expert per rank; use fewer EP ranks")
    return check_float32(op, "routed_scaling_factor", routed_scaling_factor)


def check_token_mask(op: str, name: str, mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    check_tensor(op, name, mask, (torch.bool,))
    if mask.numel() != num_tokens:
        raise fail(op, f"{name} has {mask.numel()} elements (shape {tuple(mask.shape)}); want one per token "
                       f"({num_tokens})")
    check_contiguous(op, name, mask)
    return mask if mask.dim() == 1 else mask.view(-1)


def check_map(op: str, to_physical_map: Any, logical_count: Any, num_logical: int) -> int:
    """Validate the logical->physical map; returns ``num_extra_experts`` (0 without a map)."""
    if (to_physical_map is None) != (logical_count is None):
        raise fail(op, "to_physical_map and logical_count must be given together (or neither)")
    if to_physical_map is None:
        return 0
    check_tensor(op, "to_physical_map", to_physical_map, (torch.int32,), 2)
    check_tensor(op, "logical_count", logical_count, (torch.int32,), 1)
    check_contiguous(op, "to_physical_map", to_physical_map)
    check_contiguous(op, "logical_count", logical_count)
    if to_physical_map.shape[0] != num_logical or logical_count.shape[0] != num_logical or not to_physical_map.shape[1]:
        raise fail(op, f"to_physical_map {tuple(to_physical_map.shape)} and logical_count "
                       f"{tuple(logical_count.shape)} must have {num_logical} rows (routed + shared experts) "
                       "and the map at least one column")
    return to_physical_map.shape[1] - 1


def check_unmapped(op: str, unmapped: torch.Tensor, num_tokens: int, num_topk: int) -> None:
    check_tensor(op, "unmapped_topk_idx", unmapped, (torch.int64,), 2)
    if tuple(unmapped.shape) != (num_tokens, num_topk):
        raise fail(op, f"unmapped_topk_idx has shape {tuple(unmapped.shape)}; want ({num_tokens}, {num_topk})")
    if unmapped.stride(1) != 1 and num_topk > 1:
        raise fail(op, f"unmapped_topk_idx must have unit stride along topk (strides {tuple(unmapped.stride())})")


def check_scoring(op: str, scoring_func: Any) -> int:
    """The kernel's index of ``scoring_func`` (case-insensitive)."""
    scoring = SCORING.get(scoring_func) if isinstance(scoring_func, str) else None
    if scoring is None:
        scoring = SCORING.get(scoring_func.lower()) if isinstance(scoring_func, str) else None
        if scoring is None:
            raise fail(op, f"scoring_func={scoring_func!r} is not supported; supported: 'sigmoid', "
                           "'sqrtsoftplus', 'softmax'")
    return scoring


def check_top2(op: str, logits: torch.Tensor, bias: torch.Tensor, num_topk: Any, num_topk_groups: Any,
               num_groups: Any, use_shared_as_routed: Any, num_shared_experts: Any, routed_scaling_factor: Any,
               ep_rank: Any, num_ep_ranks: Any, tp_rank: Any, num_tp_ranks: Any, scoring_func: Any,
               mask: Any, fix_routing_mask: Any, to_physical_map: Any, logical_count: Any,
               unmapped_topk_idx: Any) -> None:
    """Every check of top2_sum_gate but its tensors' own type, dtype and rank (checked before) and the
    device (after), in the op's order; raises at the first that fails."""
    check_contiguous(op, "logits", logits)
    check_contiguous(op, "bias", bias)
    num_tokens, num_experts = logits.shape
    if bias.shape[0] != num_experts:
        raise fail(op, f"bias has {bias.shape[0]} elements; want one per routed expert ({num_experts})")
    slots_for(op, num_experts, TOP2_SLOTS)
    num_shared = check_routing(op, num_experts, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                               num_shared_experts)
    check_scoring(op, scoring_func)
    if mask is not None:
        check_token_mask(op, "mask", mask, num_tokens)
    if unmapped_topk_idx is not None:
        check_unmapped(op, unmapped_topk_idx, num_tokens, num_topk)
    if fix_routing_mask is not None:
        if unmapped_topk_idx is None:
            raise fail(op, "fix_routing_mask needs unmapped_topk_idx (the fixed routes are read from it)")
        check_tensor(op, "fix_routing_mask", fix_routing_mask, (torch.bool,), 1)
        check_token_mask(op, "fix_routing_mask", fix_routing_mask, num_tokens)
    num_extra = check_map(op, to_physical_map, logical_count, num_experts + num_shared)
    if num_shared > num_extra:
        raise fail(op, f"num_shared_experts={num_shared} used as routed needs at least as many extra experts in "
                       f"to_physical_map (it has {num_extra} extra columns); pass a map with "
                       f"{num_shared + 1} or more columns")
    check_ranks(op, num_experts, num_extra, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, routed_scaling_factor)


__all__ = ["SCORING", "SLOTS", "TOP2_SLOTS", "check_contiguous", "check_map", "check_ranks", "check_routing",
           "check_scoring", "check_token_mask", "check_top2", "check_unmapped", "slots_for", "strict_int"]
