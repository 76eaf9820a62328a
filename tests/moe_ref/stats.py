"""Torch references of the MoE statistics ops (semantics of ``tile_kernels.torch`` 1.0.0).

Plain torch on any device, written for clarity, not speed.  Where tilebin's ops deliberately
go beyond tile_kernels (index entries outside ``[0, bins)`` are skipped instead of asserted;
``inplace_unique_group_indices`` takes any values) the references do the same.

``aux_fi`` spells out the float32 steps torch takes on CUDA for ``counts.float() * E / (T * A)``
(multiply, then multiply by the float32 reciprocal of the scalar divisor), so it gives the same
bits on any device; ``aux_fi_divided`` is the literal formula (a true division on CPU), which
tile_kernels compares with ``calc_diff < 2e-7``.
"""

from __future__ import annotations

import torch

# tile_kernels' own tolerance for aux_fi (its per-block float atomics make the sum order vary)
AUX_FI_CALC_DIFF = 2e-7


def _valid(idx: torch.Tensor, bins: int) -> torch.Tensor:
    flat = idx.reshape(-1).long()
    return flat[(flat >= 0) & (flat < bins)]


def counts(idx: torch.Tensor, bins: int) -> torch.Tensor:
    """int64 ``[bins]``: how many entries of ``idx`` equal each value in ``[0, bins)``."""
    return torch.bincount(_valid(idx, bins), minlength=bins)


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 ``[num_groups]`` counts of ``group_idx``; entries outside ``[0, num_groups)`` skipped."""
    return counts(group_idx, num_groups).to(torch.int32)


def _f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64).to(torch.float32)


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """float32 ``[num_experts]``: ``(float(c) * float(E)) * (1 / float(T * A))``, each step in float32;
    zeros for 0 tokens."""
    num_tokens = topk_idx.shape[0]
    c = counts(topk_idx, num_experts).to(torch.float32)
    if num_tokens == 0:
        return torch.zeros(num_experts, dtype=torch.float32, device=topk_idx.device)
    inv = torch.tensor(1.0, dtype=torch.float32) / _f32(float(num_tokens * num_aux_topk))
    scaled = c * _f32(float(num_experts)).to(c.device)
    return scaled * inv.to(c.device)


def aux_fi_divided(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """The literal ``counts.float() * E / (T * A)`` (torch's own rounding on the device)."""
    num_tokens = topk_idx.shape[0]
    if num_tokens == 0:
        return torch.zeros(num_experts, dtype=torch.float32, device=topk_idx.device)
    return counts(topk_idx, num_experts).float() * num_experts / (num_tokens * num_aux_topk)


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(denominator, normalized)``: ``1e-20`` plus the row's weights left to right (float32),
    and each weight divided by it."""
    num_tokens, num_topk = topk_weights.shape
    denominator = torch.full((num_tokens,), 1e-20, dtype=torch.float32, device=topk_weights.device)
    for j in range(num_topk):
        denominator = denominator + topk_weights[:, j]
    return denominator, topk_weights / denominator[:, None]


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int,
                       num_tp_ranks: int) -> torch.Tensor:
    """Experts of EP ranks ``tp_rank, tp_rank + num_tp_ranks, ...`` renumbered densely, else ``-1``."""
    per_gpu = n // num_ep_ranks
    per_dp = num_tp_ranks * per_gpu
    v = indices.long()
    keep = (v >= 0) & (torch.div(v, per_gpu, rounding_mode="floor") % num_tp_ranks == tp_rank)
    w = v - tp_rank * per_gpu
    local = w - torch.div(w, per_dp, rounding_mode="floor") * (per_dp - per_gpu)
    keep &= local >= 0
    return torch.where(keep, local, torch.full_like(local, -1)).to(indices.dtype)


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    """Per row, every entry equal to an earlier entry of the row (original values) becomes ``-1``."""
    original = group_indices.clone()
    for j in range(1, original.shape[1]):
        repeat = (original[:, :j] == original[:, j:j + 1]).any(dim=1)
        group_indices[:, j] = torch.where(repeat, torch.full_like(original[:, j], -1), original[:, j])


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """``1 - 2 <x, y> / (|x|^2 + |y|^2)`` in float64 (0.0 when both are all zero)."""
    x, y = x.double(), y.double()
    denominator = float((x * x + y * y).sum())
    return 0.0 if denominator == 0 else 1.0 - 2.0 * float((x * y).sum()) / denominator


__all__ = ["AUX_FI_CALC_DIFF", "aux_fi", "aux_fi_divided", "calc_diff", "counts", "group_count",
           "inplace_unique_group_indices", "mask_indices_by_tp", "normalize_weight"]
