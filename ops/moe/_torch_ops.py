"""``tilebin::<op>`` declarations of the ``tilebin.ops.moe`` ops (see ``ops/_torch.py``)."""

from __future__ import annotations

from typing import Any

import torch

from .._torch import TorchOp, pair_to_public, pair_to_schema
from ._gating import top2_sum_gate, topk_gate, topk_sum_and_topk_group_idx
from ._routing import expand_to_fused, expand_to_fused_with_sf, get_fused_mapping, reduce_fused
from . import _stats


def _mapping_to_schema(result: tuple) -> tuple:
    """get_fused_mapping's outputs without aliases: the three slot maps are rows of one [3, n]
    tensor and the per-expert vectors rows of one [3, num_experts] tensor (a custom op's outputs
    may not alias each other): return those two."""
    return _rows_base(result[0], 3), result[3], _rows_base(result[4], 3)


def _rows_base(first: torch.Tensor, rows: int) -> torch.Tensor:
    """The ``[rows, n]`` tensor whose first row is ``first`` (rows of one contiguous allocation;
    ``first._base`` is not kept inside a fake implementation)."""
    n = first.shape[0]
    return first.as_strided((rows, n), (n, 1), first.storage_offset())


def _mapping_to_public(outputs: tuple) -> tuple:
    slots, token_topk_to_pos, per_expert = outputs
    return (*slots.unbind(0), token_topk_to_pos, *per_expert.unbind(0), [])


def _syncs(topk_idx: Any, num_experts: Any, num_expanded_tokens: Any, alignment: Any, force_no_sync: Any) -> bool:
    """get_fused_mapping sizes its outputs from the data (a host sync): not traceable."""
    return num_expanded_tokens == 0 and not force_no_sync



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
    TorchOp("get_fused_mapping", "(Tensor topk_idx, int num_experts, int num_expanded_tokens, int alignment, "
                                 "bool force_no_sync=False) -> (Tensor, Tensor, Tensor)",
            get_fused_mapping, result_to_schema=_mapping_to_schema, result_to_public=_mapping_to_public,
            eager_only=_syncs),
    TorchOp("expand_to_fused", "(Tensor x, Tensor token_topk_to_pos, Tensor pos_to_expert) -> Tensor", expand_to_fused),
    TorchOp("expand_to_fused_with_sf", "(Tensor x, Tensor x_sf, int num_per_channels, Tensor token_topk_to_pos, "
                                       "Tensor pos_to_expert, bool use_tma_aligned_col_major_sf=False) -> (Tensor, Tensor)",
            expand_to_fused_with_sf, to_schema=pair_to_schema, to_public=lambda x, s, *r: ((x, s), *r)),
    # reduce_fused with a preallocated out writes it: its own op, which mutates out and returns nothing
    TorchOp("reduce_fused", "(Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, "
                            "str fp8_format=\"\", Tensor? sf=None) -> Tensor",
            lambda *a: reduce_fused(*a, None), to_schema=lambda *a: pair_to_schema(*a[:-1]),
            to_public=pair_to_public),
    TorchOp("reduce_fused_out", "(Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, "
                                "str fp8_format, Tensor? sf, Tensor(a!) out) -> ()",
            reduce_fused, to_schema=pair_to_schema,
            to_public=pair_to_public, result_to_schema=lambda r: None),
    # the statistics ops are declared by their OpSpecs (ops/_spec.py), which write their schemas
    *(spec.torch_op(getattr(_stats, spec.name)) for spec in _stats.SPECS),
)
