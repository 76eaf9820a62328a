"""MoE statistics and index hygiene (``tile_kernels.moe`` 1.0.0 API): ``aux_fi``, ``group_count``,
``normalize_weight``, ``mask_indices_by_tp`` and ``inplace_unique_group_indices``.

Every op validates all arguments before touching the GPU (device last) and raises
:class:`tilebin.runtime.ArgumentError` naming the op, the value, what is supported and the fix.
Outputs are fresh tensors on the input's device with tile_kernels' dtypes and shapes
(contiguous); launches go on torch's current stream, asynchronously (no host sync).

Token counts, top-k sizes and expert/group counts are all run-time values (one cubin each).
``aux_fi`` and ``group_count`` count in one block up to ``SINGLE_BLOCK_ENTRIES`` indices
(decode batches: a plain launch) and otherwise in a cooperative grid sized by
:func:`tilebin.ops.config.get_num_sms`; their counts are integers (bit-exact) and the results
do not depend on the SM count.  ``aux_fi`` launches ``moe.aux_fi`` up to its ``max_experts``
shared bins (4096) and ``moe.aux_fi_many_experts`` past them.  Index entries outside
``[0, num_experts)`` / ``[0, num_groups)`` are not counted (tile_kernels asserts on the device
instead).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.compiler import is_compiling

from .._common import TRACING, check_cuda, check_int, check_tensor, fail, kernel_meta, launcher, memo_table, typed_key
from .._torch import traced
from ..config import get_num_sms

MAX_ENTRIES = 1 << 30  # flat index arithmetic in the kernels is int32, with room for a grid sweep
SINGLE_BLOCK_ENTRIES = 4096  # up to this many indices, count in one block (plain launch), not a cooperative grid
_INT32_MAX = 2**31 - 1
_INT64 = (torch.int64,)
_MASK_DTYPES = {torch.int64: "int64", torch.int32: "int32"}

_AUX_FI = "moe.aux_fi"  # its meta: max_experts (its shared bins; more: moe.aux_fi_many_experts), max_blocks
_AUX_FI_WIDE = 65536  # above this many indices aux_fi's grid loads 8 per thread (fewer blocks), else 4




def _check_2d(op: str, name: str, t: Any, dtypes: tuple = _INT64) -> None:
    """A 2-D contiguous ``[num_tokens, num_topk]`` tensor of ``dtypes`` with at most MAX_ENTRIES entries."""
    check_tensor(op, name, t, dtypes, 2)
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}); "
                       f"call {name}.contiguous()")
    if t.numel() > MAX_ENTRIES:
        raise fail(op, f"{name} has {t.shape[0]} x {t.shape[1]} entries, more than 2**30; split the tokens")


_FAST: dict[tuple, Any] = {}  # validated configurations (see _fast_table)
_FAST_DEPS: list[Any] = [None, None]
_FAST_MAX = 256


def _fast_table() -> dict[tuple, Any]:
    """The memo of validated configurations, emptied when the launcher or the device check it
    was filled under changed (tests stub both; a stubbed device check lets CPU tensors in)."""
    return memo_table(_FAST, _FAST_DEPS, launcher, check_cuda)


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """Per-expert load frequency ``f_i`` for the auxiliary load-balancing loss.

    ``f[e] = count(topk_idx == e) * num_experts / (num_tokens * num_aux_topk)`` as float32
    ``[num_experts]`` (0 for 0 tokens).  topk_idx: int64 ``[num_tokens, num_topk]``, contiguous;
    ``-1`` marks an empty slot.  Bit-exact with torch's float32 evaluation of that formula on
    CUDA (the division by the scalar is a multiplication by its float32 reciprocal there).
    """
    if is_compiling() and not TRACING.on:
        return traced("aux_fi", topk_idx, num_experts, num_aux_topk)
    op = "aux_fi"
    _check_2d(op, "topk_idx", topk_idx)
    num_experts = check_int(op, "num_experts", num_experts, 1)
    num_aux_topk = check_int(op, "num_aux_topk", num_aux_topk, 1)
    check_cuda(op, topk_idx=topk_idx)
    out = torch.empty(num_experts, dtype=torch.float32, device=topk_idx.device)
    single = topk_idx.numel() <= SINGLE_BLOCK_ENTRIES
    if num_experts <= kernel_meta(_AUX_FI, "max_experts"):
        _aux_fi(topk_idx, out, num_aux_topk, single)
    else:
        launcher("moe.aux_fi_many_experts", single_block=single)(topk_idx, out, num_aux_topk,
                                                                 0 if single else get_num_sms(topk_idx.device))
    return out


def _aux_fi(topk_idx: torch.Tensor, out: torch.Tensor, num_aux_topk: int, single: bool) -> None:
    """Launch ``moe.aux_fi``: one block, or a co-resident grid (2 per SM at most) of one
    block per 256 x unroll entries, each with its workspace row (torch.empty: no fill kernel)."""
    unroll = 8 if single or topk_idx.numel() > _AUX_FI_WIDE else 4
    blocks = 1 if single else max(1, min(2 * get_num_sms(out.device), kernel_meta(_AUX_FI, "max_blocks"),
                                         -(-topk_idx.numel() // (256 * unroll))))
    workspace = torch.empty((blocks, out.size(0)), dtype=torch.int32, device=out.device)
    launcher(_AUX_FI, single_block=single, unroll=unroll)(topk_idx, out, workspace, num_aux_topk)


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """How many entries of ``group_idx`` (int64 ``[num_tokens, num_topk]``, contiguous) equal each
    group: int32 ``[num_groups]``.  Negative entries (``-1``: empty slot) are not counted."""
    if is_compiling() and not TRACING.on:
        return traced("group_count", group_idx, num_groups)
    op = "group_count"
    _check_2d(op, "group_idx", group_idx)
    num_groups = check_int(op, "num_groups", num_groups, 1)
    check_cuda(op, group_idx=group_idx)
    out = torch.empty(num_groups, dtype=torch.int32, device=group_idx.device)
    single = group_idx.numel() <= SINGLE_BLOCK_ENTRIES
    launcher("moe.group_count", single_block=single)(group_idx, out, 0 if single else get_num_sms(group_idx.device))
    return out


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale each token's top-k weights to sum to one.

    topk_weights: float32 ``[num_tokens, num_topk]``, contiguous.  Returns ``(denominator,
    normalized_weights)``: ``denominator[t] = 1e-20 + w[t, 0] + w[t, 1] + ...`` (float32, left
    to right) of shape ``[num_tokens]`` and ``normalized_weights = w / denominator[:, None]``,
    bit-exact with the same torch expression.
    """
    if is_compiling() and not TRACING.on:
        return traced("normalize_weight", topk_weights)
    try:  # a configuration seen before: only the token-count-dependent checks (the slow path says why not)
        shape = topk_weights.shape
        device = topk_weights.device
        key = typed_key("normalize_weight", topk_weights.dtype, device, shape[1:])
        fn = _fast_table().get(key)
    except (AttributeError, TypeError, IndexError):
        key = fn = None
    if fn is not None and topk_weights.is_contiguous():
        num_tokens, num_topk = shape
        if num_tokens and num_tokens * num_topk <= MAX_ENTRIES:
            denominator = torch.empty((num_tokens,), dtype=torch.float32, device=device)
            normalized = torch.empty((num_tokens, num_topk), dtype=torch.float32, device=device)
            fn(topk_weights, denominator, normalized)
            return denominator, normalized
    op = "normalize_weight"
    _check_2d(op, "topk_weights", topk_weights, (torch.float32,))
    check_cuda(op, topk_weights=topk_weights)
    num_tokens, num_topk = topk_weights.shape
    denominator = torch.empty((num_tokens,), dtype=torch.float32, device=topk_weights.device)
    normalized = torch.empty((num_tokens, num_topk), dtype=torch.float32, device=topk_weights.device)
    if num_tokens:
        fn = launcher("moe.normalize_weight")
        fn(topk_weights, denominator, normalized)
        if key is not None and len(_FAST) < _FAST_MAX:
            _fast_table()[key] = fn
    return denominator, normalized


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> torch.Tensor:
    """Keep the experts that TP rank ``tp_rank`` serves, renumbered locally; ``-1`` elsewhere.

    indices: int64 or int32 ``[num_tokens, num_topk]``, contiguous, global expert ids out of
    ``n``.  With ``per_gpu = n // num_ep_ranks`` experts per EP rank, expert ``v`` is kept when
    ``(v // per_gpu) % num_tp_ranks == tp_rank`` and becomes ``w - (w // (num_tp_ranks *
    per_gpu)) * (num_tp_ranks - 1) * per_gpu`` with ``w = v - tp_rank * per_gpu``.  Negative
    entries stay ``-1``.  Returns a new tensor of indices' dtype and shape.
    """
    if is_compiling() and not TRACING.on:
        return traced("mask_indices_by_tp", indices, n, num_ep_ranks, tp_rank, num_tp_ranks)
    op = "mask_indices_by_tp"
    _check_2d(op, "indices", indices, tuple(_MASK_DTYPES))
    n = check_int(op, "n", n, 1)
    num_ep_ranks = check_int(op, "num_ep_ranks", num_ep_ranks, 1, n)
    num_tp_ranks = check_int(op, "num_tp_ranks", num_tp_ranks, 1)
    tp_rank = check_int(op, "tp_rank", tp_rank, 0, num_tp_ranks - 1)
    per_gpu = n // num_ep_ranks
    if num_tp_ranks * per_gpu > _INT32_MAX:
        raise fail(op, f"num_tp_ranks * (n // num_ep_ranks) = {num_tp_ranks} * {per_gpu} exceeds 2**31 - 1; "
                       "supported: experts per TP group below 2**31")
    check_cuda(op, indices=indices)
    masked = torch.empty_like(indices, memory_format=torch.contiguous_format)
    if indices.numel():
        launcher("moe.mask_indices_by_tp", dtype=_MASK_DTYPES[indices.dtype])(
            indices, masked, per_gpu, num_tp_ranks * per_gpu, num_tp_ranks, tp_rank)
    return masked


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    """In each row of ``group_indices`` (int64 ``[num_tokens, num_topk]``, contiguous), set every
    repeat of a value seen earlier in the row to ``-1``, in place (first occurrences stay).

    ``num_groups`` (>= 1) is checked but not needed: any values are deduplicated (tile_kernels
    requires ``num_groups <= 128`` and group ids below it).
    """
    if is_compiling() and not TRACING.on:
        return traced("inplace_unique_group_indices", group_indices, num_groups)
    op = "inplace_unique_group_indices"
    _check_2d(op, "group_indices", group_indices)
    check_int(op, "num_groups", num_groups, 1)
    check_cuda(op, group_indices=group_indices)
    if group_indices.numel():
        launcher("moe.inplace_unique_group_indices")(group_indices)


__all__ = ["aux_fi", "group_count", "inplace_unique_group_indices", "mask_indices_by_tp", "normalize_weight"]
