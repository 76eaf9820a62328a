"""``tilebin.ops.moe``: the MoE gating and routing ops of ``tile_kernels.moe`` 1.0.0, same API.

Names, signatures, defaults and outputs follow tile_kernels (in-place ops stay in place), so
``from tilebin.ops import moe`` replaces ``from tile_kernels import moe``.  Every op checks its
arguments before touching the GPU and launches on torch's current stream; SM counts are run-time
values (:mod:`tilebin.ops.config`).
"""

from ._gating import top2_sum_gate, topk_gate, topk_sum_and_topk_group_idx
from ._routing import expand_to_fused, expand_to_fused_with_sf, get_fused_mapping, reduce_fused
from ._stats import aux_fi, group_count, inplace_unique_group_indices, mask_indices_by_tp, normalize_weight

__all__ = [
    "top2_sum_gate", "topk_gate", "topk_sum_and_topk_group_idx",
    "aux_fi", "group_count", "inplace_unique_group_indices", "mask_indices_by_tp", "normalize_weight",
    "expand_to_fused", "expand_to_fused_with_sf", "get_fused_mapping", "reduce_fused",
]
