"""Torch references of the Engram gate (semantics of ``tile_kernels.engram`` 1.0.0).

Per token ``t`` and head ``h`` (x = hidden_states[t, h], k = k[t, h], v = v[t] widened from
bf16; w = weight_hidden[h] * weight_embed[h], the fused weight)::

    rstd_x = rsqrt(mean(x**2) + eps);   rstd_k = rsqrt(mean(k**2) + eps)
    dot    = sum(x * w * k)                          (the raw, un-normalised dot product)
    s      = dot * rstd_x * rstd_k * hidden**-0.5
    gate   = sigmoid(copysign(sqrt(max(|s|, clamp_value)), s))
    out    = bf16(x + gate * v)                      (gate, product and sum rounded to fp32 first)

i.e. ``sigmoid(signed_sqrt(<RMSNorm(x) * wh, RMSNorm(k) * we> / sqrt(hidden)))``.  At ``s == +-0``
the sign bit of s picks the sign, as tile_kernels' kernel does (its torch reference's
``sign(0) = 0`` gives 0.5 there).
Backward, with ``go = grad_out[t, h]`` and ``G = dL/ds * rstd_x * rstd_k / sqrt(hidden)``
(``dL/ds = sum(go * v) * gate * (1 - gate) / (2 sqrt|s|)``, zero where ``|s| < clamp_value``,
the clamp's flat region)::

    grad_x = go + G * (k * w - x * dot * rstd_x**2 / hidden)
    grad_k =      G * (x * w - k * dot * rstd_k**2 / hidden)
    grad_v = sum_h go_h * gate_h
    grad_w = sum_t G * x * k;  grad_weight_hidden = grad_w * weight_embed;  grad_weight_embed = grad_w * weight_hidden

Everything is computed in ``dtype`` (float32 or float64); ``gate_autograd`` is the forward in
differentiable torch (autograd gives the backward), used to check the closed form above.
"""

from __future__ import annotations

import torch


def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """fp32 ``weight_hidden * weight_embed`` (exact for bf16 inputs)."""
    return weight_hidden.float() * weight_embed.float()


def gate_fwd(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_fused: torch.Tensor, eps: float,
             clamp_value: float, dtype: torch.dtype = torch.float64, out_dtype: torch.dtype = torch.bfloat16):
    """``(output, dot, gate, rstd_x, rstd_k)``: output in ``out_dtype`` (the kernel's bf16), the
    others in ``dtype`` ``[tokens, hc]``."""
    hidden = x.shape[-1]
    xf, kf, vf, wf = (a.to(dtype) for a in (x, k, v, weight_fused))
    rstd_x = torch.rsqrt((xf * xf).sum(-1) / hidden + eps)
    rstd_k = torch.rsqrt((kf * kf).sum(-1) / hidden + eps)
    dot = (xf * wf.unsqueeze(0) * kf).sum(-1)
    s = dot * rstd_x * rstd_k * hidden ** -0.5
    gate = torch.sigmoid(torch.copysign(torch.sqrt(torch.clamp(s.abs(), min=clamp_value)), s))
    if out_dtype == torch.bfloat16:  # the kernel's last step: fp32 gate, fp32 product, fp32 sum, bf16
        out = (x.float() + gate.float().unsqueeze(-1) * v.float().unsqueeze(-2)).to(out_dtype)
    else:
        out = (xf + gate.unsqueeze(-1) * vf.unsqueeze(-2)).to(out_dtype)
    return out, dot, gate, rstd_x, rstd_k


def gate_bwd(grad_out: torch.Tensor, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_fused: torch.Tensor,
             dot: torch.Tensor, gate: torch.Tensor, rstd_x: torch.Tensor, rstd_k: torch.Tensor, clamp_value: float,
             dtype: torch.dtype = torch.float64, out_dtype: torch.dtype = torch.bfloat16):
    """Closed-form backward: ``(grad_x, grad_k, grad_v)`` in ``out_dtype`` (the kernel's bf16) and
    ``grad_w_fused`` in ``dtype`` ``[hc, hidden]``."""
    hidden = x.shape[-1]
    go, xf, kf, vf, wf = (a.to(dtype) for a in (grad_out, x, k, v, weight_fused))
    dot, gate, rstd_x, rstd_k = (a.to(dtype) for a in (dot, gate, rstd_x, rstd_k))
    scale = rstd_x * rstd_k * hidden ** -0.5
    s = dot * scale
    dldg = (go * vf.unsqueeze(-2)).sum(-1)
    slope = torch.where(s.abs() < clamp_value, torch.zeros_like(s), 0.5 / torch.sqrt(s.abs().clamp_min(1e-300)))
    big = (dldg * gate * (1 - gate) * slope * scale).unsqueeze(-1)
    grad_x = go + big * (kf * wf - xf * (dot * rstd_x * rstd_x / hidden).unsqueeze(-1))
    grad_k = big * (xf * wf - kf * (dot * rstd_k * rstd_k / hidden).unsqueeze(-1))
    grad_v = (go * gate.unsqueeze(-1)).sum(-2)
    grad_w = (big * xf * kf).sum(0)
    return grad_x.to(out_dtype), grad_k.to(out_dtype), grad_v.to(out_dtype), grad_w


def grad_w_reduce(grad_w_partial: torch.Tensor, weight_hidden: torch.Tensor, weight_embed: torch.Tensor,
                  grad_weight_hidden: torch.Tensor, grad_weight_embed: torch.Tensor) -> None:
    """In place: ``s = grad_w_partial.sum(0)`` (float64, then fp32); ``grad_weight_hidden += s *
    weight_embed``; ``grad_weight_embed += s * weight_hidden`` (fp32 product and sum)."""
    s = grad_w_partial.double().sum(0).float()
    grad_weight_hidden += s * weight_embed.float()
    grad_weight_embed += s * weight_hidden.float()


def gate_autograd(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_hidden: torch.Tensor,
                  weight_embed: torch.Tensor, clamp_value: float, eps: float) -> torch.Tensor:
    """The forward as differentiable torch in the inputs' dtype (no bf16 rounding of the output)."""
    hidden = x.shape[-1]
    rstd_x = torch.rsqrt(x.pow(2).mean(-1) + eps)
    rstd_k = torch.rsqrt(k.pow(2).mean(-1) + eps)
    dot = ((x * weight_hidden) * (k * weight_embed)).sum(-1)
    s = dot * rstd_x * rstd_k * hidden ** -0.5
    gate = torch.sigmoid(torch.copysign(s.abs().clamp_min(clamp_value).sqrt(), s))
    return x + gate.unsqueeze(-1) * v.unsqueeze(-2)
