"""``mhc_pre_big_fuse``: the fused inference path of mHC pre (tile_kernels 1.0.0
``tile_kernels.modeling.mhc.ops.pre_big_fuse``): norm-fn, split mixes, Sinkhorn and apply mix.

Returns ``(post_mix [..., M, 1], comb_mix [..., M, M], layer_input [..., H])`` (fp32, fp32, bf16)
for a residual ``[..., M, H]`` (bf16).  Two launches after the TF32 rounding of ``fn``: the
split-K GEMM of ``mhc_pre_norm_fn`` (same split count for the same shapes), then one kernel per
token that does the rest with the unfused kernels' operations in their order, so the outputs
equal ``mhc_pre_norm_fn`` -> ``mhc_pre_split_mixes`` -> ``sinkhorn_normalize`` ->
``mhc_pre_apply_mix`` bit for bit.  Not differentiable (as tile_kernels: inference only).  An OpSpec
op: ``tilebin::mhc_pre_big_fuse``.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import aligned_input, fail, launcher
from tilebin.ops._spec import IntParam, OpSpec, TensorParam

from ._rows import FP32, Streams, float_param, ordered, torch_ops
from .norm_fn import _plain, check_fn, check_residual, forward_partials, prep_fn

_KERNEL = "mhc.pre_big_fuse"


def _check(op: str, residual: torch.Tensor, fn: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
           *_: Any) -> None:
    """Every check but the dtypes, the scalars and the device, in today's order."""
    mult, hidden, _ = check_residual(op, residual)
    check_fn(op, fn, mult, hidden)
    n = mult * (mult + 2)
    if tuple(mhc_scale.shape) != (3,):
        raise fail(op, f"mhc_scale has shape {tuple(mhc_scale.shape)}; want [3] (pre, post, comb scales)")
    if tuple(mhc_base.shape) != (n,):
        raise fail(op, f"mhc_base has shape {tuple(mhc_base.shape)}; want [mhc_mult * (mhc_mult + 2)] = [{n}]")


def _plan(values: dict):
    mult, hidden = values["residual"].shape[-2:]
    scalars = tuple(values[p.name] for p in BIG_FUSE.params[4:9])  # the three epsilons, post mult, repeat
    splits, fn_launch = values["n_splits"], launcher(_KERNEL, mhc_mult=mult)

    def run(residual, fn, mhc_scale, mhc_base, *_):
        outer, dev = residual.shape[:-2], residual.device
        x = aligned_input(residual.view(-1, mult, hidden))
        t = x.shape[0]
        post_mix = torch.empty(*outer, mult, 1, dtype=torch.float32, device=dev)
        comb_mix = torch.empty(*outer, mult, mult, dtype=torch.float32, device=dev)
        layer_input = torch.empty(*outer, hidden, dtype=torch.bfloat16, device=dev)
        if t:
            fn_eff = prep_fn(aligned_input(fn), None)
            part_mul, part_sq = forward_partials(x.view(t, mult * hidden), fn_eff, mult, splits)
            fn_launch(part_mul, part_sq, aligned_input(mhc_scale.contiguous()), aligned_input(mhc_base.contiguous()),
                      x, post_mix.view(t, mult), comb_mix.view(t, mult * mult), layer_input.view(t, hidden), *scalars)
        return post_mix, comb_mix, layer_input

    return run


BIG_FUSE = OpSpec(
    "mhc_pre_big_fuse",
    (Streams("residual", (torch.bfloat16,)), TensorParam("fn", FP32, 2, rows_vary=False),
     TensorParam("mhc_scale", FP32, rows_vary=False), TensorParam("mhc_base", FP32, rows_vary=False),
     *map(float_param, ("rms_eps", "mhc_pre_eps", "mhc_sinkhorn_eps", "mhc_post_mult_value")),
     IntParam("sinkhorn_repeat", 1, 1 << 20), IntParam("n_splits", 1, default="16")),
    "(Tensor, Tensor, Tensor)", _plan, **ordered(_check, lambda residual, fn, *_: _plain(residual, fn)))


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
    return BIG_FUSE(residual, fn, mhc_scale, mhc_base, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value,
                    sinkhorn_repeat, n_splits)


SPECS = (BIG_FUSE,)
TORCH_OPS = torch_ops(*SPECS)

__all__ = ["mhc_pre_big_fuse"]
