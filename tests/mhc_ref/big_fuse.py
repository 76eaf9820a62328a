"""Float64 reference of the fused mHC pre step (``mhc_pre_big_fuse``): the composition
norm-fn -> split mixes -> Sinkhorn -> apply mix (tile_kernels 1.0.0 semantics).

Per token, with ``M = mhc_mult`` and ``mixes = pre_norm_fn(residual, fn, None, rms_eps)``
(see :mod:`mhc_ref.norm_fn`, TF32-rounded fn)::

    z = mixes * [scale0] * M ++ [scale1] * M ++ [scale2] * M * M + base
    pre  = sigmoid(z[:M]) + pre_eps
    post = sigmoid(z[M:2M]) * post_mult_value                      -> [..., M, 1]
    comb = sinkhorn(z[2M:].view(M, M), repeat, sinkhorn_eps)       -> [..., M, M]
    layer_input = sum_m pre[m] * residual[..., m, :]               -> [..., H] (before bf16)

``sinkhorn``: row softmax + eps, column normalisation, then ``repeat - 1`` times row and
column normalisation, each ``P / (sum + eps)``.
"""

from __future__ import annotations

import torch

from .norm_fn import pre_norm_fn


def sinkhorn(x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    p = x.softmax(-1) + eps
    p = p / (p.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        p = p / (p.sum(-1, keepdim=True) + eps)
        p = p / (p.sum(-2, keepdim=True) + eps)
    return p


def split_mixes(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, m: int,
                post_mult_value: float, pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 ``(pre [..., M, 1], post [..., M, 1], comb [..., M, M])`` (comb before Sinkhorn)."""
    s = scale.to(torch.float64)
    full = torch.cat([s[0].expand(m), s[1].expand(m), s[2].expand(m * m)])
    z = mixes.to(torch.float64) * full + base.to(torch.float64)
    pre = (z[..., :m].sigmoid() + pre_eps).unsqueeze(-1)
    post = (z[..., m:2 * m].sigmoid() * post_mult_value).unsqueeze(-1)
    comb = z[..., 2 * m:].reshape(*z.shape[:-1], m, m)
    return pre, post, comb


def pre_big_fuse(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor,
                 rms_eps: float, pre_eps: float, sinkhorn_eps: float, post_mult_value: float,
                 sinkhorn_repeat: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 ``(post_mix [..., M, 1], comb_mix [..., M, M], layer_input [..., H])``."""
    m = residual.shape[-2]
    mixes = pre_norm_fn(residual, fn, None, rms_eps)
    pre, post, comb = split_mixes(mixes, scale, base, m, post_mult_value, pre_eps)
    comb = sinkhorn(comb, sinkhorn_repeat, sinkhorn_eps)
    layer_input = (residual.to(torch.float64) * pre).sum(-2)
    return post, comb, layer_input


__all__ = ["pre_big_fuse", "sinkhorn", "split_mixes"]
