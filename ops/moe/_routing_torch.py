"""How the fused MoE routing ops (``_routing``) map onto their ``tilebin::<op>`` custom ops where
the public signature does not map one to one (``ops/_torch.py``'s ``TorchOp`` conversions):
get_fused_mapping's counts list and its data-sized form, the ``(data, sf)`` pairs, and
reduce_fused's optional ``out`` (its own op, ``reduce_fused_out``, which mutates out)."""

from __future__ import annotations

from typing import Any

import torch

from .._torch import pair_to_public, pair_to_schema

# reduce_fused with a preallocated out writes it: its own custom op, which mutates out and returns nothing
REDUCE_OUT_SCHEMA = ("(Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, str fp8_format, "
                     "Tensor? sf, Tensor(a!) out) -> ()")


def mapping_to_schema(result: tuple) -> tuple:
    """get_fused_mapping's seven tensors (each its own allocation), without the counts list."""
    return result[:7]


def mapping_to_public(outputs: tuple) -> tuple:
    return (*outputs, [])


def mapping_syncs(topk_idx: Any, num_experts: Any, num_expanded_tokens: Any, alignment: Any,
                  force_no_sync: Any) -> bool:
    """get_fused_mapping sizes its outputs from the data (a host sync): not traceable (eager_only)."""
    return num_expanded_tokens == 0 and not force_no_sync


def sf_pair_to_public(x: torch.Tensor, x_sf: torch.Tensor, *rest: Any) -> tuple:
    """expand_to_fused_with_sf's schema ``x, x_sf`` as its public ``(data, sf)``."""
    return ((x, x_sf), *rest)


def reduce_to_schema(*args: Any) -> tuple:
    """reduce_fused's public arguments (out None) as tilebin::reduce_fused's, which has no out."""
    return pair_to_schema(*args[:-1])


def reduce_to_public(*args: Any) -> tuple:
    return (*pair_to_public(*args), None)


def no_outputs(result: Any) -> None:
    """reduce_fused_out's outputs: none (it writes out)."""
    return None


__all__ = ["REDUCE_OUT_SCHEMA", "mapping_syncs", "mapping_to_public", "mapping_to_schema", "no_outputs",
           "reduce_to_public", "reduce_to_schema", "sf_pair_to_public"]
