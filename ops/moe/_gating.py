"""Gating ops of ``tilebin.ops.moe``: ``topk_gate``, ``top2_sum_gate``, ``topk_sum_and_topk_group_idx``.

Same names, signatures, defaults and outputs as ``tile_kernels.moe`` 1.0.0.  Every argument is
validated before any GPU work (:class:`~tilebin.runtime.ArgumentError` naming the op, the value
and the fix; the device is checked last), outputs are allocated with ``torch.empty`` and the
kernel is launched through the runtime's unchecked path on torch's current stream.  No op
synchronises or reads GPU data on the host.  Thread-safe.

Beyond tile_kernels (a superset; the same results wherever it accepts a call): any expert
count up to 1024 (256 for ``top2_sum_gate``; tile_kernels' wants a multiple of 4, at most 32 per
group); ``num_topk == 0`` in ``topk_gate`` returns an empty ``[num_tokens, 0]`` tensor; NaN
scores rank first, as ``torch.sort`` puts them (tile_kernels' kernels never pick them or
trap); the physical-map hash is computed in 64 bits at any token count; an invalid fixed
route or a zero ``logical_count`` leaves the index unmapped instead of reading out of bounds.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.compiler import is_compiling

from .._common import TRACING, check_float32, check_tensor, fail, launcher, memo_table, typed_key
from .._torch import TorchOp, traced
from ._gating_checks import (check_contiguous, check_map, check_ranks, check_routing, check_token_mask,
                             check_unmapped, strict_int)


__all__ = ["top2_sum_gate", "topk_gate", "topk_sum_and_topk_group_idx"]

_SLOTS = (2, 8, 32)  # kernels' register slots per lane: experts <= 32 * slots
_TOP2_SLOTS = (2, 4, 8)  # top2_sum_gate: experts <= 256 (4: 65-128 experts, half the padding slots of 8)
_SCORING = {"sigmoid": 0, "sqrtsoftplus": 1, "softmax": 2}
_HAS_MASK, _HAS_FIX, _HAS_UNMAPPED, _HAS_MAP = 1, 2, 4, 8
_LAUNCHERS: dict[tuple[str, int], Any] = {}
_PLACEHOLDERS: dict[torch.device, tuple[torch.Tensor, ...]] = {}


def _launcher(name: str, slots: int | None) -> Any:
    if TRACING.on:  # fake tensors: launcher() gives a no-op, which must not be cached
        return launcher(name) if slots is None else launcher(name, slots=slots)
    fn = _LAUNCHERS.get((name, slots))
    if fn is None:
        fn = _LAUNCHERS[(name, slots)] = launcher(name) if slots is None else launcher(name, slots=slots)
    return fn


def _slots(op: str, num_experts: int, slots: tuple[int, ...] = _SLOTS) -> int:
    for s in slots:
        if num_experts <= 32 * s:
            return s
    raise fail(op, f"{num_experts} experts per token are not supported (at most {32 * slots[-1]})")


def _on_cuda(op: str, first: torch.Tensor, **others: Optional[torch.Tensor]) -> None:
    """Every tensor on ``first``'s CUDA device (checked last, so CPU tensors reach every other check)."""
    if not first.is_cuda:
        raise fail(op, f"tensors must be on a CUDA device, got {first.device}; move them with .cuda()")
    for name, t in others.items():
        if t is not None and t.device != first.device:
            raise fail(op, f"{name} is on {t.device} but the scores are on {first.device}; put every tensor on one GPU")


def _placeholders(device: torch.device) -> tuple[torch.Tensor, ...]:
    """1-element stand-ins for absent optional inputs (never read: their flag bit is clear)."""
    p = None if TRACING.on else _PLACEHOLDERS.get(device)  # fake stand-ins are never cached
    if p is None:
        p = (
            torch.zeros(1, dtype=torch.bool, device=device),
            torch.zeros((1, 1), dtype=torch.int32, device=device),
            torch.ones(1, dtype=torch.int32, device=device),
            torch.zeros((1, 1), dtype=torch.int64, device=device),
        )
        if not TRACING.on:
            _PLACEHOLDERS[device] = p
    return p


_FAST: dict[tuple, Any] = {}  # validated configurations (see _fast_table)
_FAST_DEPS: list[Any] = [None, None]
_FAST_MAX = 256


def _fast_table() -> dict[tuple, Any]:
    """The memo of validated configurations, emptied when the launcher or the device check it
    was filled under changed (tests stub both; a stubbed device check lets CPU tensors in)."""
    return memo_table(_FAST, _FAST_DEPS, launcher, _on_cuda)


def _remember(table: dict[tuple, Any], key: Optional[tuple], value: Any) -> None:
    if key is not None and len(table) < _FAST_MAX:
        table[key] = value


# ---------------------------------------------------------------- topk_gate
def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Indices of the ``num_topk`` largest scores per token, int64 ``[num_tokens, num_topk]``.

    ``scores``: float32 ``[num_tokens, num_experts]``, contiguous, ``num_experts <= 1024``;
    ``0 <= num_topk <= num_experts``.  Descending order; equal scores by lower index (stable),
    NaN first.  Raises ArgumentError for anything else.
    """
    if is_compiling() and not TRACING.on:
        return traced("topk_gate", scores, num_topk)
    try:  # a configuration seen before: only the token-count-dependent checks (the slow path says why not)
        shape = scores.shape
        key = typed_key("topk_gate", scores.dtype, scores.device, shape[1:], num_topk)
        fast = _fast_table().get(key)
    except (AttributeError, TypeError, IndexError):
        key = fast = None
    if fast is not None and scores.is_contiguous():
        topk_idx = torch.empty((shape[0], num_topk), dtype=torch.int64, device=scores.device)
        if shape[0] and num_topk:
            fast(scores, topk_idx)
        return topk_idx
    op = "topk_gate"
    if not isinstance(scores, torch.Tensor) or scores.dtype != torch.float32 or scores.dim() != 2:
        check_tensor(op, "scores", scores, (torch.float32,), 2)
    check_contiguous(op, "scores", scores)
    num_tokens, num_experts = scores.shape
    strict_int(op, "num_topk", num_topk, 0, num_experts)
    slots = _slots(op, num_experts)
    _on_cuda(op, scores)
    topk_idx = torch.empty((num_tokens, num_topk), dtype=torch.int64, device=scores.device)
    if num_tokens and num_topk:
        fn = _launcher("moe.topk_gate", slots)
        fn(scores, topk_idx)
        _remember(_fast_table(), key, fn)
    return topk_idx


# ---------------------------------------------------------------- topk_sum_and_topk_group_idx
def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """Groups ranked by the sum of their ``num_topk_sum`` largest scores: int64 ``[num_tokens, num_topk_groups]``.

    ``scores``: float32 ``[num_tokens, num_groups, experts_per_group]``, contiguous,
    ``1 <= num_groups <= 32``; ``num_topk_sum`` 1 or 2 and ``<= experts_per_group``;
    ``0 <= num_topk_groups <= num_groups``.  Descending group score, ties by lower group.
    """
    if is_compiling() and not TRACING.on:
        return traced("topk_sum_and_topk_group_idx", scores, num_topk_sum, num_topk_groups)
    try:  # a configuration seen before: only the token-count-dependent checks (the slow path says why not)
        shape = scores.shape
        key = typed_key("topk_sum_and_topk_group_idx", scores.dtype, scores.device, shape[1:], num_topk_sum,
                        num_topk_groups)
        fast = _fast_table().get(key)
    except (AttributeError, TypeError, IndexError):
        key = fast = None
    if fast is not None and scores.is_contiguous():
        group_idx = torch.empty((shape[0], num_topk_groups), dtype=torch.int64, device=scores.device)
        if shape[0] and num_topk_groups:
            fast(scores, group_idx, num_topk_sum)
        return group_idx
    op = "topk_sum_and_topk_group_idx"
    if not isinstance(scores, torch.Tensor) or scores.dtype != torch.float32 or scores.dim() != 3:
        check_tensor(op, "scores", scores, (torch.float32,), 3)
    check_contiguous(op, "scores", scores)
    num_tokens, num_groups, per_group = scores.shape
    if not 1 <= num_groups <= 32:
        raise fail(op, f"scores has {num_groups} groups (shape {tuple(scores.shape)}); supported: 1 to 32 "
                       "(one warp lane per group)")
    strict_int(op, "num_topk_sum", num_topk_sum, 1, 2)
    if num_topk_sum > per_group:
        raise fail(op, f"num_topk_sum={num_topk_sum} exceeds the {per_group} experts per group; "
                       f"pass num_topk_sum <= {per_group}")
    strict_int(op, "num_topk_groups", num_topk_groups, 0, num_groups)
    _on_cuda(op, scores)
    group_idx = torch.empty((num_tokens, num_topk_groups), dtype=torch.int64, device=scores.device)
    if num_tokens and num_topk_groups:
        fn = _launcher("moe.topk_sum_and_topk_group_idx", None)
        fn(scores, group_idx, num_topk_sum)
        _remember(_fast_table(), key, fn)
    return group_idx


# ---------------------------------------------------------------- top2_sum_gate
class _Top2:
    """A validated top2_sum_gate configuration (all but the token count, pointers and strides).

    The memo key holds every argument but ``routed_scaling_factor``'s value (only its type is
    checked; it is converted per call) and the token-count-dependent sizes of the optional tensors.
    """

    __slots__ = ("fn", "ph", "num_out", "unit_unmapped", "head", "tail")

    def __init__(self, fn: Any, ph: tuple, num_out: int, num_topk: int, head: tuple, tail: tuple) -> None:
        self.fn, self.ph, self.num_out, self.head, self.tail = fn, ph, num_out, head, tail
        self.unit_unmapped = num_topk > 1

    def __call__(self, num_tokens: int, device: torch.device, logits: torch.Tensor, bias: torch.Tensor,
                 mask: Any, fix: Any, phys: Any, count: Any, unmapped: Any,
                 rsf: Any) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """``(topk_idx, topk_weights)``, or None when a per-call check fails (the slow path says why)."""
        if not (logits.is_contiguous() and bias.is_contiguous()) or not num_tokens:
            return None
        ph = self.ph
        if mask is None:
            mask = ph[0]
        elif mask.numel() != num_tokens or not mask.is_contiguous():
            return None
        elif mask.dim() != 1:
            mask = mask.view(-1)
        if unmapped is None:
            unmapped = ph[3]
        elif unmapped.shape[0] != num_tokens or (self.unit_unmapped and unmapped.stride(1) != 1):
            return None
        if fix is None:
            fix = ph[0]
        elif fix.numel() != num_tokens or not fix.is_contiguous():
            return None
        if phys is None:
            phys, count = ph[1], ph[2]
        elif not (phys.is_contiguous() and count.is_contiguous()):
            return None
        num_out = self.num_out
        topk_idx = torch.empty((num_tokens, num_out), dtype=torch.int64, device=device)
        topk_weights = torch.empty((num_tokens, num_out), dtype=torch.float32, device=device)
        if not (type(rsf) is float and abs(rsf) < 3.4e38):  # ints, NaN, past float32: converted as a cast does
            rsf = check_float32("top2_sum_gate", "routed_scaling_factor", rsf)
        self.fn(logits, bias, mask, fix, phys, count, unmapped, topk_idx, topk_weights, *self.head, rsf, *self.tail)
        return topk_idx, topk_weights


def top2_sum_gate(
    logits: torch.Tensor,
    bias: torch.Tensor,
    num_topk: int,
    num_topk_groups: int,
    num_groups: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    num_ep_ranks: int,
    tp_rank: int,
    num_tp_ranks: int,
    scoring_func: str,
    mask: Optional[torch.Tensor] = None,
    fix_routing_mask: Optional[torch.Tensor] = None,
    to_physical_map: Optional[torch.Tensor] = None,
    logical_count: Optional[torch.Tensor] = None,
    unmapped_topk_idx: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k expert routing with top-2-sum group limiting; returns ``(topk_idx, topk_weights)``.

    Both ``[num_tokens, num_topk + shared]`` (int64, float32).  Semantics: see
    ``kernels/moe/top2_sum_gate.py`` (tile_kernels 1.0.0's).  ``unmapped_topk_idx`` is
    written in place (and read for tokens whose ``fix_routing_mask`` is True).
    """
    if is_compiling() and not TRACING.on:
        return traced("top2_sum_gate", logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                      num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
                      scoring_func, mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx)
    try:  # a configuration seen before: only the token-count-dependent checks (the slow path says why not)
        shape = logits.shape
        device = logits.device
        key = typed_key("top2_sum_gate", logits.dtype, device, shape[1:], bias.dtype, bias.shape, bias.device,
               num_topk, num_topk_groups, num_groups,
               use_shared_as_routed, num_shared_experts, type(routed_scaling_factor), ep_rank, num_ep_ranks,
               tp_rank, num_tp_ranks, scoring_func,
               None if mask is None else (mask.dtype, mask.dim(), mask.device),
               None if fix_routing_mask is None else (fix_routing_mask.dtype, fix_routing_mask.dim(),
                                                      fix_routing_mask.device),
               None if to_physical_map is None else (to_physical_map.dtype, to_physical_map.shape,
                                                     to_physical_map.device),
               None if logical_count is None else (logical_count.dtype, logical_count.shape, logical_count.device),
               None if unmapped_topk_idx is None else (unmapped_topk_idx.dtype, unmapped_topk_idx.shape[1:],
                                                       unmapped_topk_idx.device))
        fast = _fast_table().get(key)
    except (AttributeError, TypeError, IndexError):
        key = fast = None
    if fast is not None:
        result = fast(shape[0], device, logits, bias, mask, fix_routing_mask, to_physical_map, logical_count,
                      unmapped_topk_idx, routed_scaling_factor)
        if result is not None:
            return result
    op = "top2_sum_gate"
    check_tensor(op, "logits", logits, (torch.float32,), 2)
    check_tensor(op, "bias", bias, (torch.float32,), 1)
    check_contiguous(op, "logits", logits)
    check_contiguous(op, "bias", bias)
    num_tokens, num_experts = logits.shape
    if bias.shape[0] != num_experts:
        raise fail(op, f"bias has {bias.shape[0]} elements; want one per routed expert ({num_experts})")
    slots = _slots(op, num_experts, _TOP2_SLOTS)
    num_shared = check_routing(op, num_experts, num_topk, num_topk_groups, num_groups,
                                use_shared_as_routed, num_shared_experts)
    scoring = _SCORING.get(scoring_func) if isinstance(scoring_func, str) else None
    if scoring is None:
        scoring = _SCORING.get(scoring_func.lower()) if isinstance(scoring_func, str) else None
        if scoring is None:
            raise fail(op, f"scoring_func={scoring_func!r} is not supported; supported: 'sigmoid', "
                           "'sqrtsoftplus', 'softmax'")
    flags = 0
    if mask is not None:
        mask = check_token_mask(op, "mask", mask, num_tokens)
        flags |= _HAS_MASK
    if unmapped_topk_idx is not None:
        check_unmapped(op, unmapped_topk_idx, num_tokens, num_topk)
        flags |= _HAS_UNMAPPED
    if fix_routing_mask is not None:
        if unmapped_topk_idx is None:
            raise fail(op, "fix_routing_mask needs unmapped_topk_idx (the fixed routes are read from it)")
        check_tensor(op, "fix_routing_mask", fix_routing_mask, (torch.bool,), 1)
        check_token_mask(op, "fix_routing_mask", fix_routing_mask, num_tokens)
        flags |= _HAS_FIX
    num_extra = check_map(op, to_physical_map, logical_count, num_experts + num_shared)
    if to_physical_map is not None:
        flags |= _HAS_MAP
    if num_shared > num_extra:
        raise fail(op, f"num_shared_experts={num_shared} used as routed needs at least as many extra experts in "
                       f"to_physical_map (it has {num_extra} extra columns); pass a map with "
                       f"{num_shared + 1} or more columns")
    rsf = check_ranks(op, num_experts, num_extra, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
                       routed_scaling_factor)
    _on_cuda(op, logits, bias=bias, mask=mask, fix_routing_mask=fix_routing_mask, to_physical_map=to_physical_map,
             logical_count=logical_count, unmapped_topk_idx=unmapped_topk_idx)
    device = logits.device
    num_out = num_topk + num_shared
    topk_idx = torch.empty((num_tokens, num_out), dtype=torch.int64, device=device)
    topk_weights = torch.empty((num_tokens, num_out), dtype=torch.float32, device=device)
    if num_tokens:
        ph = _placeholders(device)
        fn = _launcher("moe.top2_sum_gate", slots)
        fn(
            logits, bias,
            ph[0] if mask is None else mask,
            ph[0] if fix_routing_mask is None else fix_routing_mask,
            ph[1] if to_physical_map is None else to_physical_map,
            ph[2] if logical_count is None else logical_count,
            ph[3] if unmapped_topk_idx is None else unmapped_topk_idx,
            topk_idx, topk_weights,
            num_topk, num_groups, num_topk_groups, scoring, flags, num_extra, rsf,
            ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
        )
        _remember(_fast_table(), key, _Top2(fn, ph, num_out, num_topk, (num_topk, num_groups, num_topk_groups, scoring,
                                                                      flags, num_extra),
                                            (ep_rank, num_ep_ranks, tp_rank, num_tp_ranks)))
    return topk_idx, topk_weights


# the tilebin::<op> declarations (ops/_torch.py), registered through ops/moe/_torch_ops.py
TORCH_OPS = (
    TorchOp("topk_gate", "(Tensor scores, int num_topk) -> Tensor", topk_gate),
    TorchOp("topk_sum_and_topk_group_idx", "(Tensor scores, int num_topk_sum, int num_topk_groups) -> Tensor",
            topk_sum_and_topk_group_idx),
    TorchOp("top2_sum_gate",
            "(Tensor logits, Tensor bias, int num_topk, int num_topk_groups, int num_groups, bool use_shared_as_routed, "
            "int num_shared_experts, float routed_scaling_factor, int ep_rank, int num_ep_ranks, int tp_rank, "
            "int num_tp_ranks, str scoring_func, Tensor? mask=None, Tensor? fix_routing_mask=None, "
            "Tensor? to_physical_map=None, Tensor? logical_count=None, Tensor(a!)? unmapped_topk_idx=None) "
            "-> (Tensor, Tensor)", top2_sum_gate),
)
