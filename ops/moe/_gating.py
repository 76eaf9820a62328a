"""Gating ops of ``tilebin.ops.moe``: ``topk_gate``, ``top2_sum_gate``, ``topk_sum_and_topk_group_idx``.

Same names, signatures, defaults and outputs as ``tile_kernels.moe`` 1.0.0.  Each op is declared
by one :class:`~tilebin.ops._spec.OpSpec`: every argument is validated before any GPU work
(:class:`~tilebin.runtime.ArgumentError` naming the op, the value and the fix; the device is
checked last), outputs are allocated with ``torch.empty`` and the kernel is launched through
the runtime's unchecked path on torch's current stream.  A configuration seen before (the
scores' sizes but the token count, every scalar with its type, the factor by its bits, which
optional tensors are given and their sizes but the token count) replays with only the checks
that depend on the token count and strides.  No op synchronises or reads GPU data on the host.
Thread-safe.

Beyond tile_kernels (a superset; the same results wherever it accepts a call): any expert
count up to 1024 (256 for ``top2_sum_gate``; tile_kernels' wants a multiple of 4, at most 32 per
group); ``num_topk == 0`` in ``topk_gate`` returns an empty ``[num_tokens, 0]`` tensor; NaN
scores rank first, as ``torch.sort`` puts them (tile_kernels' kernels never pick them or
trap); the physical-map hash is computed in 64 bits at any token count; an invalid fixed
route or a zero ``logical_count`` leaves the index unmapped instead of reading out of bounds.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .._common import TRACING, check_float32, fail, launcher
from .._spec import FlagParam, IntParam, OpSpec, Param, TensorParam
from ._gating_checks import SCORING, TOP2_SLOTS, check_contiguous, check_top2, slots_for, strict_int

__all__ = ["top2_sum_gate", "topk_gate", "topk_sum_and_topk_group_idx"]

_F32 = (torch.float32,)
_HAS_MASK, _HAS_FIX, _HAS_UNMAPPED, _HAS_MAP = 1, 2, 4, 8
_PLACEHOLDERS: dict[torch.device, tuple[torch.Tensor, ...]] = {}
_OPTIONAL = ("mask", "fix_routing_mask", "to_physical_map", "logical_count", "unmapped_topk_idx")  # top2_sum_gate's


def _on_cuda(op: str, first: torch.Tensor, **others: Optional[torch.Tensor]) -> None:
    """Every tensor on ``first``'s CUDA device (called last in the ops' ``relations``, so CPU
    tensors reach every other check; the OpSpec's own device check then finds nothing wrong)."""
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
            torch.zeros(1, 1, dtype=torch.int32, device=device),
            torch.ones(1, dtype=torch.int32, device=device),
            torch.zeros(1, 1, dtype=torch.int64, device=device),
        )
        if not TRACING.on:
            _PLACEHOLDERS[device] = p
    return p


class _StrictInt(IntParam):
    """A Python int, bools and integer-likes refused: ``strict_int`` in the op's ``relations`` (in
    the op's order, against the tensors' sizes); keyed as an IntParam (type and value)."""

    def check(self, op: str, value: Any) -> Any:
        return value


class _StrictFlag(FlagParam):
    """A Python bool, 0 and 1 refused (checked in ``relations``); keyed as a FlagParam."""

    def check(self, op: str, value: Any) -> Any:
        return value


def _scores_contiguous(op: str, args: tuple) -> None:
    """Per call: the scores are contiguous (their strides are not in the memo key)."""
    if not args[0].is_contiguous():
        check_contiguous(op, "scores", args[0])


# ---------------------------------------------------------------- topk_gate
def _topk_relations(op: str, values: dict) -> None:
    scores = values["scores"]
    strict_int(op, "num_topk", values["num_topk"], 0, scores.shape[1])
    slots_for(op, scores.shape[1])
    _on_cuda(op, scores)


def _plan_topk(values: dict) -> Callable[..., torch.Tensor]:
    num_topk, device = values["num_topk"], values["scores"].device  # the device is part of the memo key
    fn = launcher("moe.topk_gate", slots=slots_for("topk_gate", values["scores"].shape[1]))

    def run(scores: torch.Tensor, *_: Any) -> torch.Tensor:
        num_tokens = scores.shape[0]
        topk_idx = torch.empty(num_tokens, num_topk, dtype=torch.int64, device=device)
        if num_tokens and num_topk:
            fn(scores, topk_idx)
        return topk_idx

    return run


TOPK_GATE = OpSpec("topk_gate", (TensorParam("scores", _F32, 2), _StrictInt("num_topk")), "Tensor", _plan_topk,
                   relations=_topk_relations, per_call=_scores_contiguous)


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Indices of the ``num_topk`` largest scores per token, int64 ``[num_tokens, num_topk]``.

    ``scores``: float32 ``[num_tokens, num_experts]``, contiguous, ``num_experts <= 1024``;
    ``0 <= num_topk <= num_experts``.  Descending order; equal scores by lower index (stable),
    NaN first.  Raises ArgumentError for anything else.
    """
    return TOPK_GATE.call(scores, num_topk)


# ---------------------------------------------------------------- topk_sum_and_topk_group_idx
def _group_relations(op: str, values: dict) -> None:
    scores, num_topk_sum = values["scores"], values["num_topk_sum"]
    _, num_groups, per_group = scores.shape
    if not 1 <= num_groups <= 32:
        raise fail(op, f"scores has {num_groups} groups (shape {tuple(scores.shape)}); supported: 1 to 32 "
                       "(one warp lane per group)")
    strict_int(op, "num_topk_sum", num_topk_sum, 1, 2)
    if num_topk_sum > per_group:
        raise fail(op, f"num_topk_sum={num_topk_sum} exceeds the {per_group} experts per group; "
                       f"pass num_topk_sum <= {per_group}")
    strict_int(op, "num_topk_groups", values["num_topk_groups"], 0, num_groups)
    _on_cuda(op, scores)


def _plan_group(values: dict) -> Callable[..., torch.Tensor]:
    num_topk_sum, num_topk_groups, device = values["num_topk_sum"], values["num_topk_groups"], values["scores"].device
    fn = launcher("moe.topk_sum_and_topk_group_idx")

    def run(scores: torch.Tensor, *_: Any) -> torch.Tensor:
        num_tokens = scores.shape[0]
        group_idx = torch.empty(num_tokens, num_topk_groups, dtype=torch.int64, device=device)
        if num_tokens and num_topk_groups:
            fn(scores, group_idx, num_topk_sum)
        return group_idx

    return run


TOPK_SUM_AND_TOPK_GROUP_IDX = OpSpec(
    "topk_sum_and_topk_group_idx",
    (TensorParam("scores", _F32, 3), _StrictInt("num_topk_sum"), _StrictInt("num_topk_groups")),
    "Tensor", _plan_group, relations=_group_relations, per_call=_scores_contiguous)


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """Groups ranked by the sum of their ``num_topk_sum`` largest scores: int64 ``[num_tokens, num_topk_groups]``.

    ``scores``: float32 ``[num_tokens, num_groups, experts_per_group]``, contiguous,
    ``1 <= num_groups <= 32``; ``num_topk_sum`` 1 or 2 and ``<= experts_per_group``;
    ``0 <= num_topk_groups <= num_groups``.  Descending group score, ties by lower group.
    """
    return TOPK_SUM_AND_TOPK_GROUP_IDX.call(scores, num_topk_sum, num_topk_groups)


# ---------------------------------------------------------------- top2_sum_gate
def _top2_per_call(op: str, args: tuple) -> None:
    """Per call (from the launch's ``run``, when logits or bias is not contiguous or an optional tensor
    is given): token counts and strides agree (neither is in the memo key); when they do not,
    :func:`check_top2` says what is wrong, in the op's order of checks."""
    mask, fix, phys, count, unmapped = args[13:]
    if not (args[0].is_contiguous() and args[1].is_contiguous()):
        check_top2(op, *args)
    if mask is None and fix is None and unmapped is None and phys is None:  # (a count without a map: relations)
        return
    n = args[0].shape[0]
    if not ((mask is None or (mask.numel() == n and mask.is_contiguous()))
            and (unmapped is None or (unmapped.shape[0] == n and (unmapped.stride(1) == 1 or unmapped.shape[1] < 2)))
            and (fix is None or (fix.shape[0] == n and fix.is_contiguous()))
            and (phys is None or phys.is_contiguous()) and (count is None or count.is_contiguous())):
        check_top2(op, *args)
        raise fail(op, "the token counts or strides of the tensors disagree")  # check_top2 raised already


def _top2_relations(op: str, values: dict) -> None:
    check_top2(op, **values)
    _on_cuda(op, values["logits"], bias=values["bias"], **{name: values[name] for name in _OPTIONAL})


def _top2_scalars(values: dict) -> tuple:
    """The launch's scalars after the tensors: num_topk, num_groups, num_topk_groups, scoring, flags,
    num_extra_experts, routed_scaling_factor (as float32 holds it), ep_rank, num_ep_ranks, tp_rank,
    num_tp_ranks."""
    flags = 0
    for name, bit in (("mask", _HAS_MASK), ("fix_routing_mask", _HAS_FIX), ("unmapped_topk_idx", _HAS_UNMAPPED),
                      ("to_physical_map", _HAS_MAP)):
        if values[name] is not None:
            flags |= bit
    phys = values["to_physical_map"]
    return (values["num_topk"], values["num_groups"], values["num_topk_groups"],
            SCORING[values["scoring_func"].lower()], flags, 0 if phys is None else phys.shape[1] - 1,
            check_float32("top2_sum_gate", "routed_scaling_factor", values["routed_scaling_factor"]),
            values["ep_rank"], values["num_ep_ranks"], values["tp_rank"], values["num_tp_ranks"])


def _plan_top2(values: dict) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    logits = values["logits"]
    device = logits.device  # part of the memo key
    scalars = _top2_scalars(values)
    num_out = values["num_topk"] + (values["num_shared_experts"] if values["use_shared_as_routed"] else 0)
    fn = launcher("moe.top2_sum_gate", slots=slots_for("top2_sum_gate", logits.shape[1], TOP2_SLOTS))
    ph = _placeholders(device) if any(values[name] is None for name in _OPTIONAL) else (None,) * 4

    def run(logits: torch.Tensor, bias: torch.Tensor, *rest: Any) -> tuple[torch.Tensor, torch.Tensor]:
        mask, fix, phys, count, unmapped = rest[11:]
        # per call (here, not a spec per_call: relations run check_top2 on a first call, before the devices)
        if not (logits.is_contiguous() and bias.is_contiguous()) or not (
                mask is None and fix is None and phys is None and count is None and unmapped is None):
            _top2_per_call("top2_sum_gate", (logits, bias, *rest))
        num_tokens = logits.shape[0]
        topk_idx = torch.empty(num_tokens, num_out, dtype=torch.int64, device=device)
        topk_weights = torch.empty(num_tokens, num_out, dtype=torch.float32, device=device)
        if num_tokens:
            fn(logits, bias, ph[0] if mask is None else mask if mask.dim() == 1 else mask.view(-1),
               ph[0] if fix is None else fix, ph[1] if phys is None else phys, ph[2] if count is None else count,
               ph[3] if unmapped is None else unmapped, topk_idx, topk_weights, *scalars)
        return topk_idx, topk_weights

    return run


def _optional(name: str, dtypes: tuple, ndim: Optional[int], **more: Any) -> TensorParam:
    return TensorParam(name, dtypes, ndim, optional=True, default="None", **more)


TOP2_SUM_GATE = OpSpec(
    "top2_sum_gate",
    (TensorParam("logits", _F32, 2), TensorParam("bias", _F32, 1, rows_vary=False), _StrictInt("num_topk"),
     _StrictInt("num_topk_groups"), _StrictInt("num_groups"), _StrictFlag("use_shared_as_routed"),
     _StrictInt("num_shared_experts"), Param("routed_scaling_factor", "float"),
     _StrictInt("ep_rank"), _StrictInt("num_ep_ranks"), _StrictInt("tp_rank"), _StrictInt("num_tp_ranks"),
     Param("scoring_func", "str"), _optional("mask", (torch.bool,), None),
     _optional("fix_routing_mask", (torch.bool,), 1),
     _optional("to_physical_map", (torch.int32,), 2, rows_vary=False),
     _optional("logical_count", (torch.int32,), 1, rows_vary=False),
     _optional("unmapped_topk_idx", (torch.int64,), 2, mutated=True)),
    "(Tensor, Tensor)", _plan_top2, relations=_top2_relations)


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
    return TOP2_SUM_GATE.call(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed,
                          num_shared_experts, routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks,
                          scoring_func, mask, fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx)


SPECS = (TOPK_GATE, TOPK_SUM_AND_TOPK_GROUP_IDX, TOP2_SUM_GATE)
# the tilebin::<op> declarations (ops/_torch.py), registered through ops/moe/_torch_ops.py
TORCH_OPS = (TOPK_GATE.torch_op(topk_gate), TOPK_SUM_AND_TOPK_GROUP_IDX.torch_op(topk_sum_and_topk_group_idx),
             TOP2_SUM_GATE.torch_op(top2_sum_gate))
