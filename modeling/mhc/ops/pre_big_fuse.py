"""``mhc_pre_big_fuse``: the fused inference path of mHC pre (tile_kernels 1.0.0
``tile_kernels.modeling.mhc.ops.pre_big_fuse``): norm-fn, split mixes, Sinkhorn and apply mix.

Returns ``(post_mix [..., M, 1], comb_mix [..., M, M], layer_input [..., H])`` (fp32, fp32, bf16)
for a residual ``[..., M, H]`` (bf16).  Two launches after the TF32 rounding of ``fn``: the
split-K GEMM of ``mhc_pre_norm_fn`` (same split count for the same shapes), then one kernel per
token that does the rest with the unfused kernels' operations in their order, so the outputs
equal ``mhc_pre_norm_fn`` -> ``mhc_pre_split_mixes`` -> ``sinkhorn_normalize`` ->
``mhc_pre_apply_mix`` bit for bit.  Not differentiable (as tile_kernels: inference only).
"""

from __future__ import annotations


import torch

from tilebin.ops._common import (
    aligned_input,
    check_cuda,
    check_float32,
    check_int,
    check_tensor,
    fail,
    launcher,
)

from .norm_fn import check_fn, check_residual, forward_partials, prep_fn

_OP = "mhc_pre_big_fuse"
_KERNEL = "mhc.pre_big_fuse"


def mhc_pre_big_fuse(
    residual: torch.Tensor,
    fn: torch.Tensor,
    mhc_scale: torch.Tensor,
    mhc_base: torch.Tensor,
    rms_eps: float,
    mhc_pre_eps: float,
    mhc_sinkhorn_eps: float,
    mhc_post_mult_value: float,
    sinkhorn_repeat: int,
    n_splits: int = 16,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(post_mix, comb_mix, layer_input)`` of one mHC pre step, fused (see the module docstring)."""
    mult, hidden, outer = check_residual(_OP, residual)
    check_fn(_OP, fn, mult, hidden)
    n = mult * (mult + 2)
    check_tensor(_OP, "mhc_scale", mhc_scale, (torch.float32,))
    if tuple(mhc_scale.shape) != (3,):
        raise fail(_OP, f"mhc_scale has shape {tuple(mhc_scale.shape)}; want [3] (pre, post, comb scales)")
    check_tensor(_OP, "mhc_base", mhc_base, (torch.float32,))
    if tuple(mhc_base.shape) != (n,):
        raise fail(_OP, f"mhc_base has shape {tuple(mhc_base.shape)}; want [mhc_mult * (mhc_mult + 2)] = [{n}]")
    rms = check_float32(_OP, "rms_eps", rms_eps)
    pre_eps = check_float32(_OP, "mhc_pre_eps", mhc_pre_eps)
    sk_eps = check_float32(_OP, "mhc_sinkhorn_eps", mhc_sinkhorn_eps)
    post_mult = check_float32(_OP, "mhc_post_mult_value", mhc_post_mult_value)
    repeat = check_int(_OP, "sinkhorn_repeat", sinkhorn_repeat, 1, 1 << 20)
    splits = check_int(_OP, "n_splits", n_splits, 1)
    check_cuda(_OP, residual=residual, fn=fn, mhc_scale=mhc_scale, mhc_base=mhc_base)
    dev = residual.device
    x = aligned_input(residual.view(-1, mult, hidden))
    t = x.shape[0]
    post_mix = torch.empty((t, mult), dtype=torch.float32, device=dev)
    comb_mix = torch.empty((t, mult * mult), dtype=torch.float32, device=dev)
    layer_input = torch.empty((t, hidden), dtype=torch.bfloat16, device=dev)
    if t:
        fn_eff = prep_fn(aligned_input(fn), None)
        part_mul, part_sq = forward_partials(x.view(t, mult * hidden), fn_eff, mult, splits)
        launcher(_KERNEL, mhc_mult=mult)(
            part_mul, part_sq, aligned_input(mhc_scale.contiguous()), aligned_input(mhc_base.contiguous()), x,
            post_mix, comb_mix, layer_input, rms, pre_eps, sk_eps, post_mult, repeat)
    return (post_mix.view(*outer, mult, 1), comb_mix.view(*outer, mult, mult), layer_input.view(*outer, hidden))


__all__ = ["mhc_pre_big_fuse"]
