"""The kernel modules the wheel build lowers (``tilebin.aot build`` with no module argument).

Kept out of ``kernels/__init__.py`` on purpose: every kernel imports that package, so the AOT
cache digests it with each kernel; adding a module here must not invalidate the others.

The mHC family is listed by file name (every ``kernels/mhc/<name>.py`` not starting with ``_``,
sorted): its kernels are written in parallel, one file each, and none edits a shared list.
"""

from pathlib import Path

_MHC = Path(__file__).resolve().parent / "mhc"

ALL_MODULES = (
    "tilebin.kernels.transpose.batched_transpose",
    "tilebin.kernels.transpose.batched_transpose_direct",
    "tilebin.kernels.transpose.batched_transpose_warps",
    "tilebin.kernels.testing.gemm_nt",
    "tilebin.kernels.testing.coop_sum",
    "tilebin.kernels.testing.pdl_chain",
    "tilebin.kernels.quant.per_token_cast",
    "tilebin.kernels.quant.per_token_cast_decode",
    "tilebin.kernels.quant.per_block_cast",
    "tilebin.kernels.quant.per_block_cast_lossless",
    "tilebin.kernels.quant.per_channel_cast_fused",
    "tilebin.kernels.quant.per_channel_cast_bf16",
    "tilebin.kernels.quant.per_channel_cast_and_transpose",
    "tilebin.kernels.quant.swiglu_forward_and_per_token_cast",
    "tilebin.kernels.quant.swiglu_backward_and_per_token_cast",
    "tilebin.kernels.quant.swiglu_forward_and_per_channel_cast_and_transpose",
    "tilebin.kernels.quant.cast_back",
    "tilebin.kernels.quant.unpack_e2m1",
    "tilebin.kernels.quant.cast_back_e5m6",
    "tilebin.kernels.quant.per_token_cast_e5m6",
    "tilebin.kernels.quant.per_token_cast_e5m6_fp32",
    "tilebin.kernels.moe.topk_gate",
    "tilebin.kernels.moe.top2_sum_gate",
    "tilebin.kernels.moe.topk_sum_and_topk_group_idx",
    "tilebin.kernels.moe.aux_fi",
    "tilebin.kernels.moe.aux_fi_many_experts",
    "tilebin.kernels.moe.group_count",
    "tilebin.kernels.moe.normalize_weight",
    "tilebin.kernels.moe.mask_indices_by_tp",
    "tilebin.kernels.moe.inplace_unique_group_indices",
    "tilebin.kernels.moe.get_fused_mapping",
    "tilebin.kernels.moe.expand_to_fused",
    "tilebin.kernels.moe.reduce_fused",
    "tilebin.kernels.moe.reduce_fused_few_tokens",
    "tilebin.kernels.moe.reduce_fused_paired",
    "tilebin.kernels.engram.engram_hash",
    "tilebin.kernels.engram.fused_weight",
    "tilebin.kernels.engram.engram_gate_fwd",
    "tilebin.kernels.engram.engram_gate_bwd",
    "tilebin.kernels.engram.grad_w_reduce",
) + tuple(
    f"tilebin.kernels.mhc.{p.stem}" for p in sorted(_MHC.glob("*.py")) if not p.name.startswith("_")
)
