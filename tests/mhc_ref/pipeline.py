"""Torch reference of a whole mHC model step: ``expand -> (mhc_pre -> sublayer -> mhc_post) * L ->
mhc_head``, differentiable, with bf16 roundings where the ops store bf16 (the residual streams,
the layer input, the head output) and the mix math in ``dtype`` (fp32 by default, float64 for
definitions).

Built from the per-op references: :mod:`mhc_ref.split_mixes` and :mod:`mhc_ref.sinkhorn`
(``dtype``-generic definitions), :func:`mhc_ref.norm_fn.tf32` (the TF32 rounding of the
projection, a straight-through identity for gradients, as the kernels treat it), and this
family's apply-mix, post and head-mix definitions.
"""

from __future__ import annotations

import torch

from .norm_fn import tf32
from .sinkhorn import sinkhorn
from .split_mixes import split_mixes

BF16 = torch.bfloat16


def expand(x: torch.Tensor, mhc_mult: int = 4) -> torch.Tensor:
    return x.unsqueeze(-2).expand(*x.shape[:-1], mhc_mult, x.shape[-1]).contiguous()


def norm_fn(residual: torch.Tensor, fn: torch.Tensor, norm_weight: torch.Tensor | None, eps: float,
            dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(x @ tf32(fn * w).T) * rsqrt(mean(x**2) + eps)`` over the flattened streams; the TF32
    rounding passes gradients straight through."""
    x = residual.flatten(-2).to(dtype)
    f = fn if norm_weight is None else fn * norm_weight
    f = f + (tf32(f.detach()) - f.detach())
    mul = x @ f.to(dtype).transpose(0, 1)
    return mul * ((x * x).mean(-1, keepdim=True) + eps).rsqrt()


def apply_mix(x: torch.Tensor, mix: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (x.to(dtype) * mix.to(dtype)).sum(-2).to(BF16)


def post(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb: torch.Tensor,
         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    out = post_mix.to(dtype) * x.to(dtype).unsqueeze(-2) + torch.einsum(
        "...mn,...mi->...ni", comb.to(dtype), residual.to(dtype))
    return out.to(BF16)


def pre(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
        norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
        post_mult_value: float = 1.0, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
        sinkhorn_repeat: int = 10, dtype: torch.dtype = torch.float32):
    """``mhc_pre``'s definition: ``(layer_input bf16, (post_mix, comb_mix))``."""
    mixes = norm_fn(residual, fn, norm_weight, norm_eps, dtype)
    pre_mix, post_mix, comb = split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps, dtype=dtype)
    comb = sinkhorn(comb, sinkhorn_repeat, sinkhorn_eps, dtype=dtype)
    return apply_mix(residual, pre_mix, dtype), (post_mix.float(), comb.float())


def head(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
         norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
         pre_eps: float = 1e-6, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``mhc_head``'s definition (``fn`` ``[M, M * H]``)."""
    mixes = norm_fn(residual, fn, norm_weight, norm_eps, dtype)
    z = mixes * scale.to(dtype).reshape(1) + base.to(dtype)
    mix = torch.sigmoid(z) + pre_eps
    return apply_mix(residual, mix.unsqueeze(-1), dtype)


class Reference:
    """The functional API (``expand_from_embedding``, ``mhc_pre``, ``mhc_head``, ``mhc_post``) on
    these definitions, to run one model body against tilebin's ops."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.dtype = dtype

    def expand_from_embedding(self, x, mhc_mult=4):
        return expand(x, mhc_mult)

    def mhc_pre(self, residual, fn, scale, base, **kw):
        kw.pop("n_splits", None)
        return pre(residual, fn, scale, base, dtype=self.dtype, **kw)

    def mhc_post(self, x, residual, post_mix, comb):
        return post(x, residual, post_mix, comb, self.dtype)

    def mhc_head(self, residual, fn, scale, base, **kw):
        kw.pop("n_splits", None)
        return head(residual, fn, scale, base, dtype=self.dtype, **kw)


__all__ = ["Reference", "apply_mix", "expand", "head", "norm_fn", "post", "pre"]
