"""tilebin's TileLang kernels: one file per op, each exporting ``KERNELS`` (its declarations).

``ALL_MODULES`` lists the modules the wheel build lowers; ``tilebin.aot`` imports them.
"""

from ._declare import KernelDecl, product

ALL_MODULES = (
    "tilebin.kernels.transpose.batched_transpose",
    "tilebin.kernels.gemm.gemm_nt",
    "tilebin.kernels.testing.coop_sum",
    "tilebin.kernels.testing.pdl_chain",
    "tilebin.kernels.quant.per_block_cast",
    "tilebin.kernels.quant.per_block_cast_lossless",
    "tilebin.kernels.quant.per_channel_cast_fused",
    "tilebin.kernels.quant.per_channel_cast_and_transpose",
    "tilebin.kernels.quant.swiglu_forward_and_per_token_cast",
    "tilebin.kernels.quant.swiglu_backward_and_per_token_cast",
    "tilebin.kernels.quant.swiglu_forward_and_per_channel_cast_and_transpose",
    "tilebin.kernels.moe.aux_fi",
    "tilebin.kernels.moe.group_count",
    "tilebin.kernels.moe.normalize_weight",
    "tilebin.kernels.moe.mask_indices_by_tp",
    "tilebin.kernels.moe.inplace_unique_group_indices",
)

__all__ = ["ALL_MODULES", "KernelDecl", "product"]
