"""Torch references of mHC's split mixes (semantics of tile_kernels 1.0.0 ``mhc_pre_split_mixes``),
test-only.

``split_mixes`` is the definition, differentiable: with ``M = mhc_mult`` and ``K = M * (M + 2)``,
``z = input_mixes * scale_k + base`` (``scale_k`` = ``scale[0]`` on columns ``< M``, ``scale[1]`` on
``[M, 2M)``, ``scale[2]`` after; product and sum rounded apart in fp32, as the kernel does)::

    pre  = sigmoid(z[..., :M]) + pre_eps            [..., M, 1]
    post = sigmoid(z[..., M:2M]) * post_mult_value  [..., M, 1]
    comb = z[..., 2M:]                               [..., M, M]

``split_mixes_bwd`` is the closed-form backward the kernel evaluates (checked against autograd
in the CPU tests): ``dz`` = ``g_pre * s (1 - s)``, ``g_post * post_mult_value * s (1 - s)`` or
``g_comb``; ``grad_mixes = dz * scale_k``, ``grad_base = sum_tokens dz``, ``grad_scale[i] =
sum over tokens and segment i of dz * input_mixes``.
"""

from __future__ import annotations

import torch


def _scale_k(scale: torch.Tensor, m: int) -> torch.Tensor:
    return torch.cat([scale[0].expand(m), scale[1].expand(m), scale[2].expand(m * m)])


def split_mixes(input_mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, mhc_mult: int,
                post_mult_value: float, pre_eps: float, dtype: torch.dtype = torch.float64):
    """``(pre, post, comb)`` in ``dtype``, differentiable in all three tensors."""
    m = mhc_mult
    x, s, b = input_mixes.to(dtype), scale.to(dtype), base.to(dtype)
    z = x * _scale_k(s, m) + b
    lead = x.shape[:-1]
    pre = (z[..., :m].sigmoid() + pre_eps).unsqueeze(-1)
    post = (z[..., m:2 * m].sigmoid() * post_mult_value).unsqueeze(-1)
    comb = z[..., 2 * m:].reshape(*lead, m, m)
    return pre, post, comb


def split_mixes_bwd(g_pre, g_post, g_comb, input_mixes, scale, base, mhc_mult: int, post_mult_value: float,
                    dtype: torch.dtype = torch.float64):
    """``(grad_mixes, grad_scale, grad_base)`` of :func:`split_mixes` in ``dtype`` (closed form)."""
    m = mhc_mult
    k = m * (m + 2)
    x, s, b = input_mixes.to(dtype), scale.to(dtype), base.to(dtype)
    z = x * _scale_k(s, m) + b
    sig = z.sigmoid()
    lead = x.shape[:-1]
    dz = torch.cat([g_pre.to(dtype).reshape(*lead, m) * sig[..., :m] * (1 - sig[..., :m]),
                    g_post.to(dtype).reshape(*lead, m) * post_mult_value * sig[..., m:2 * m] * (1 - sig[..., m:2 * m]),
                    g_comb.to(dtype).reshape(*lead, m * m)], dim=-1)
    grad_mixes = dz * _scale_k(s, m)
    flat_dz, flat_x = dz.reshape(-1, k), x.reshape(-1, k)
    grad_base = flat_dz.sum(0)
    gx = (flat_dz * flat_x).sum(0)
    grad_scale = torch.stack([gx[:m].sum(), gx[m:2 * m].sum(), gx[2 * m:].sum()])
    return grad_mixes, grad_scale, grad_base
