"""MoE statistics and index hygiene (``tile_kernels.moe`` 1.0.0 API): ``aux_fi``, ``group_count``,
``normalize_weight``, ``mask_indices_by_tp`` and ``inplace_unique_group_indices``.

Every op validates all arguments before touching the GPU (device last) and raises
:class:`tilebin.runtime.ArgumentError` naming the op, the value, what is supported and the fix.
Outputs are fresh tensors on the input's device with tile_kernels' dtypes and shapes
(contiguous); launches go on torch's current stream, asynchronously (no host sync).

Token counts, top-k sizes and expert/group counts are all run-time values (one cubin each).
``aux_fi`` and ``group_count`` count in one block up to ``SINGLE_BLOCK_ENTRIES`` indices
(decode batches: a plain launch) and otherwise in a grid sized by
:func:`tilebin.ops.config.get_num_sms` (``group_count``: cooperative; ``aux_fi``: a plain launch
whose last arrival converts, with totals in a zeroed state kept per stream, see
:class:`tilebin.ops._common.ZeroedState`); their counts are integers (bit-exact) and the results
do not depend on the SM count.  ``aux_fi`` launches ``moe.aux_fi`` up to its ``max_experts``
shared bins (4096) and ``moe.aux_fi_many_experts`` past them.  Index entries outside
``[0, num_experts)`` / ``[0, num_groups)`` are not counted (tile_kernels asserts on the device
instead).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .._common import TRACING, ZeroedState, check_int, fail, kernel_meta, launcher, specialised_launcher
from .._spec import IntParam, OpSpec, TensorParam
from ..config import get_num_sms

MAX_ENTRIES = 1 << 30  # flat index arithmetic in the kernels is int32, with room for a grid sweep
SINGLE_BLOCK_ENTRIES = 4096  # up to this many indices, count in one block (plain launch), not a cooperative grid
_INT32_MAX = 2**31 - 1
_INT64 = (torch.int64,)
_MASK_DTYPES = {torch.int64: "int64", torch.int32: "int32"}

_AUX_FI = "moe.aux_fi"  # its meta: max_experts (its shared bins; more: moe.aux_fi_many_experts), arrivals_max_experts
_AUX_FI_WIDE = 65536  # above this many indices aux_fi's grid loads 8 per thread (fewer blocks), else 4


def _entries(name: str, dtypes: tuple = _INT64) -> TensorParam:
    """A 2-D contiguous ``[num_tokens, num_topk]`` tensor of ``dtypes`` with at most MAX_ENTRIES entries."""
    return TensorParam(name, dtypes, 2, contiguous=True, max_numel=MAX_ENTRIES)


def _plan_aux_fi(values: dict) -> Callable[..., torch.Tensor]:
    num_experts, num_aux_topk = values["num_experts"], values["num_aux_topk"]
    device = values["topk_idx"].device  # part of the configuration
    if num_experts > kernel_meta(_AUX_FI, "max_experts"):
        fns = {single: launcher("moe.aux_fi_many_experts", single_block=single) for single in (True, False)}

        def run_wide(topk_idx: torch.Tensor, *_: Any) -> torch.Tensor:
            out = torch.empty(num_experts, dtype=torch.float32, device=device)
            single = bool(topk_idx.numel() <= SINGLE_BLOCK_ENTRIES)  # a plain bool: a symbolic size keys no dict
            fns[single](topk_idx, out, num_aux_topk, 0 if single else get_num_sms(device))
            return out

        return run_wide
    # the launchers by unroll, looked up once per configuration; the grid's mode by the expert count
    grid = "arrivals" if num_experts <= kernel_meta(_AUX_FI, "arrivals_max_experts") else "ticket"
    one_block = launcher(_AUX_FI, mode="single", unroll=8)
    fns = {unroll: launcher(_AUX_FI, mode=grid, unroll=unroll) for unroll in (4, 8)}
    # the single block never touches its state; the grid's: zeroed, one per stream
    idle = torch.empty(2, num_experts, dtype=torch.int32, device=device)
    states = None if TRACING.on else ZeroedState((2, num_experts), device)

    def run(topk_idx: torch.Tensor, *_: Any) -> torch.Tensor:
        out = torch.empty(num_experts, dtype=torch.float32, device=device)
        entries = topk_idx.numel()
        if bool(entries <= SINGLE_BLOCK_ENTRIES):
            one_block(topk_idx, out, idle, num_aux_topk, 0)
        else:  # one block per 256 x unroll entries, 2 per SM at most (the kernel sizes its grid)
            fns[8 if bool(entries > _AUX_FI_WIDE) else 4](topk_idx, out, idle if states is None else states.get(),
                                                         num_aux_topk, get_num_sms(device))
        return out

    return run


AUX_FI = OpSpec("aux_fi", (_entries("topk_idx"), IntParam("num_experts", 1), IntParam("num_aux_topk", 1)),
                "Tensor", _plan_aux_fi)


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """Per-expert load frequency ``f_i`` for the auxiliary load-balancing loss.

    ``f[e] = count(topk_idx == e) * num_experts / (num_tokens * num_aux_topk)`` as float32
    ``[num_experts]`` (0 for 0 tokens).  topk_idx: int64 ``[num_tokens, num_topk]``, contiguous;
    ``-1`` marks an empty slot.  Bit-exact with torch's float32 evaluation of that formula on
    CUDA (the division by the scalar is a multiplication by its float32 reciprocal there).
    """
    return AUX_FI.call(topk_idx, num_experts, num_aux_topk)


def _plan_group_count(values: dict) -> Callable[..., torch.Tensor]:
    num_groups = values["num_groups"]
    one_block, grid = launcher("moe.group_count", single_block=True), launcher("moe.group_count", single_block=False)

    def run(group_idx: torch.Tensor, *_: Any) -> torch.Tensor:
        device = group_idx.device
        out = torch.empty(num_groups, dtype=torch.int32, device=device)
        if group_idx.numel() <= SINGLE_BLOCK_ENTRIES:
            one_block(group_idx, out, 0)
        else:
            grid(group_idx, out, get_num_sms(device))
        return out

    return run


GROUP_COUNT = OpSpec("group_count", (_entries("group_idx"), IntParam("num_groups", 1)), "Tensor", _plan_group_count)


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """How many entries of ``group_idx`` (int64 ``[num_tokens, num_topk]``, contiguous) equal each
    group: int32 ``[num_groups]``.  Negative entries (``-1``: empty slot) are not counted."""
    return GROUP_COUNT.call(group_idx, num_groups)


def _plan_normalize_weight(values: dict) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    topk = values["topk_weights"].shape[1]
    if topk == 8:  # a row per 8 lanes, coalesced (moe.normalize_weight_lanes)
        fn = launcher("moe.normalize_weight_lanes", topk=8)
    else:  # the variant built for this top-k when there is one (2, 6, 9), else the run-time top-k one
        fn = specialised_launcher("moe.normalize_weight", {"num_topk": topk})

    def run(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num_tokens, num_topk = topk_weights.shape
        device = topk_weights.device
        denominator = torch.empty(num_tokens, dtype=torch.float32, device=device)
        normalized = torch.empty(num_tokens, num_topk, dtype=torch.float32, device=device)
        if num_tokens:
            fn(topk_weights, denominator, normalized)
        return denominator, normalized

    return run


NORMALIZE_WEIGHT = OpSpec("normalize_weight", (_entries("topk_weights", (torch.float32,)),), "(Tensor, Tensor)",
                          _plan_normalize_weight)


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale each token's top-k weights to sum to one.

    topk_weights: float32 ``[num_tokens, num_topk]``, contiguous.  Returns ``(denominator,
    normalized_weights)``: ``denominator[t] = 1e-20 + w[t, 0] + w[t, 1] + ...`` (float32, left
    to right) of shape ``[num_tokens]`` and ``normalized_weights = w / denominator[:, None]``,
    bit-exact with the same torch expression.
    """
    return NORMALIZE_WEIGHT.call(topk_weights)


def _mask_relations(op: str, values: dict) -> None:
    """``num_ep_ranks <= n``, ``tp_rank < num_tp_ranks``, the local expert range fits int32."""
    n = values["n"]
    check_int(op, "num_ep_ranks", values["num_ep_ranks"], 1, n)
    check_int(op, "tp_rank", values["tp_rank"], 0, values["num_tp_ranks"] - 1)
    per_gpu = n // values["num_ep_ranks"]
    if values["num_tp_ranks"] * per_gpu > _INT32_MAX:
        raise fail(op, f"num_tp_ranks * (n // num_ep_ranks) = {values['num_tp_ranks']} * {per_gpu} exceeds "
                       "2**31 - 1; supported: experts per TP group below 2**31")


def _plan_mask(values: dict) -> Callable[..., torch.Tensor]:
    per_gpu = values["n"] // values["num_ep_ranks"]
    num_tp_ranks, tp_rank = values["num_tp_ranks"], values["tp_rank"]
    fn = launcher("moe.mask_indices_by_tp", dtype=_MASK_DTYPES[values["indices"].dtype])

    def run(indices: torch.Tensor, *_: Any) -> torch.Tensor:
        masked = torch.empty_like(indices)  # contiguous (checked): so is the copy
        if indices.numel():
            fn(indices, masked, per_gpu, num_tp_ranks * per_gpu, num_tp_ranks, tp_rank)
        return masked

    return run


MASK_INDICES_BY_TP = OpSpec(
    "mask_indices_by_tp",
    (_entries("indices", tuple(_MASK_DTYPES)), IntParam("n", 1), IntParam("num_ep_ranks", 1), IntParam("tp_rank", 0),
     IntParam("num_tp_ranks", 1)),
    "Tensor", _plan_mask, relations=_mask_relations)


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> torch.Tensor:
    """Keep the experts that TP rank ``tp_rank`` serves, renumbered locally; ``-1`` elsewhere.

    indices: int64 or int32 ``[num_tokens, num_topk]``, contiguous, global expert ids out of
    ``n``.  With ``per_gpu = n // num_ep_ranks`` experts per EP rank, expert ``v`` is kept when
    ``(v // per_gpu) % num_tp_ranks == tp_rank`` and becomes ``w - (w // (num_tp_ranks *
    per_gpu)) * (num_tp_ranks - 1) * per_gpu`` with ``w = v - tp_rank * per_gpu``.  Negative
    entries stay ``-1``.  Returns a new tensor of indices' dtype and shape.
    """
    return MASK_INDICES_BY_TP.call(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)


def _plan_unique(values: dict) -> Callable[..., None]:
    fn = launcher("moe.inplace_unique_group_indices")

    def run(group_indices: torch.Tensor, *_: Any) -> None:
        if group_indices.numel():
            fn(group_indices)

    return run


INPLACE_UNIQUE_GROUP_INDICES = OpSpec(
    "inplace_unique_group_indices", (TensorParam("group_indices", _INT64, 2, contiguous=True, max_numel=MAX_ENTRIES,
                                                 mutated=True), IntParam("num_groups", 1)),
    "()", _plan_unique)


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    """In each row of ``group_indices`` (int64 ``[num_tokens, num_topk]``, contiguous), set every
    repeat of a value seen earlier in the row to ``-1``, in place (first occurrences stay).

    ``num_groups`` (>= 1) is checked but not needed: any values are deduplicated (tile_kernels
    requires ``num_groups <= 128`` and group ids below it).
    """
    return INPLACE_UNIQUE_GROUP_INDICES.call(group_indices, num_groups)


SPECS = (AUX_FI, GROUP_COUNT, NORMALIZE_WEIGHT, MASK_INDICES_BY_TP, INPLACE_UNIQUE_GROUP_INDICES)

__all__ = ["aux_fi", "group_count", "inplace_unique_group_indices", "mask_indices_by_tp", "normalize_weight"]
