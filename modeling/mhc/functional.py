"""The mHC layer-level functions (tile_kernels 1.0.0 ``tile_kernels.modeling.mhc.functional``):
``expand_from_embedding``, ``mhc_pre`` and ``mhc_head``, compositions of the ops in
:mod:`tilebin.modeling.mhc.ops`.

A model with mHC keeps ``mhc_mult`` residual streams per token (``[..., M, H]``, bf16)::

    residual = expand_from_embedding(embedding)                 # [..., H] -> [..., M, H]
    for layer in layers:
        x, (post_mix, comb_mix) = mhc_pre(residual, layer.fn, layer.scale, layer.base)
        residual = mhc_post(layer(x), residual, post_mix, comb_mix)
    logits = lm_head(mhc_head(residual, head_fn, head_scale, head_base))

Differentiable throughout; with autograd disabled ``mhc_pre`` takes the fused inference path
(:func:`mhc_pre_big_fuse`), whose outputs equal the unfused composition.
"""

from __future__ import annotations

import torch

from .ops.expand import expand_to_mhc
from .ops.head_compute_mix import mhc_head_compute_mix
from .ops.norm_fn import mhc_pre_norm_fn
from .ops.post import mhc_post  # noqa: F401  (the post step of the layer API, as tile_kernels exposes it here)
from .ops.pre_apply_mix import mhc_pre_apply_mix
from .ops.pre_big_fuse import mhc_pre_big_fuse
from .ops.pre_split_mixes import mhc_pre_split_mixes
from .ops.sinkhorn import sinkhorn_normalize


def expand_from_embedding(x: torch.Tensor, mhc_mult: int = 4) -> torch.Tensor:
    """The first residual: ``x`` ``[..., H]`` (bf16) copied into ``mhc_mult`` streams ``[..., M, H]``."""
    return expand_to_mhc(x, mhc_mult)


def mhc_pre(
    residual: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    mhc_mult: int = 4,
    post_mult_value: float = 1.0,
    pre_eps: float = 1e-6,
    sinkhorn_eps: float = 1e-6,
    sinkhorn_repeat: int = 10,
    n_splits: int = 16,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The input of one sublayer and the mixes its :func:`mhc_post` needs.

    residual: bf16 ``[..., M, H]``; fn: fp32 ``[M * (M + 2), M * H]``; scale: fp32 ``[3]`` (pre,
    post and comb scales); base: fp32 ``[M * (M + 2)]``; norm_weight: optional fp32 ``[M * H]``
    RMSNorm weight (folded into ``fn``).  Steps: the normalized projection
    (:func:`mhc_pre_norm_fn`), the split into pre/post/comb mixes (:func:`mhc_pre_split_mixes`),
    Sinkhorn normalization of the comb matrices (:func:`sinkhorn_normalize`), and the pre mix
    applied to the streams (:func:`mhc_pre_apply_mix`).

    Returns ``(layer_input, (post_mix, comb_mix))``: bf16 ``[..., H]``, fp32 ``[..., M, 1]`` and
    fp32 ``[..., M, M]``.  With autograd disabled (``torch.no_grad()``, inference mode) the whole
    step runs fused (:func:`mhc_pre_big_fuse`); a norm weight is then folded into ``fn`` first
    (``fn * norm_weight``, as the unfused path forms it), so both paths give the same values.
    """
    if not torch.is_grad_enabled():
        fused_fn = fn if norm_weight is None else fn * norm_weight
        post_mix, comb_mix, layer_input = mhc_pre_big_fuse(
            residual, fused_fn, scale, base,
            rms_eps=norm_eps, mhc_pre_eps=pre_eps, mhc_sinkhorn_eps=sinkhorn_eps,
            mhc_post_mult_value=post_mult_value, sinkhorn_repeat=sinkhorn_repeat, n_splits=n_splits,
        )
        return layer_input, (post_mix, comb_mix)

    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps, n_splits=n_splits)
    pre_mix, post_mix, comb_mix = mhc_pre_split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    comb_mix = sinkhorn_normalize(comb_mix, repeat=sinkhorn_repeat, eps=sinkhorn_eps)
    layer_input = mhc_pre_apply_mix(residual, pre_mix)
    return layer_input, (post_mix, comb_mix)


def mhc_head(
    residual: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    mhc_mult: int = 4,
    pre_eps: float = 1e-6,
    n_splits: int = 16,
) -> torch.Tensor:
    """The LM head's input: the streams of the last residual merged by sigmoid weights.

    residual: bf16 ``[..., M, H]``; fn: fp32 ``[M, M * H]`` (the block-level layout's first ``M``
    rows; zero rows are appended up to ``M * (M + 2)`` so the pre-norm projection serves it);
    scale: fp32 ``[1]`` or a one-element tensor; base: fp32 ``[M]``; norm_weight as in
    :func:`mhc_pre`.  Weights ``w = sigmoid(mixes[..., :M] * scale + base) + pre_eps``
    (:func:`mhc_head_compute_mix`), then ``sum_m w_m * residual[..., m, :]``
    (:func:`mhc_pre_apply_mix`).  Returns bf16 ``[..., H]``.  Differentiable.
    """
    rows = mhc_mult * (mhc_mult + 2)
    if fn.shape[0] < rows:
        fn = torch.cat([fn, fn.new_zeros((rows - fn.shape[0], *fn.shape[1:]))], dim=0)
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps, n_splits=n_splits)
    if scale.numel() == 1:
        scale = scale.reshape(1)
    mix = mhc_head_compute_mix(mixes[..., :mhc_mult], scale, base, pre_eps)
    return mhc_pre_apply_mix(residual, mix.unsqueeze(-1))


__all__ = ["expand_from_embedding", "mhc_head", "mhc_pre"]
