"""Reference of ``mhc_pre_apply_mix``: the sublayer input as a weighted sum of the streams.

Definition: ``out[..., i] = sum_m mix[..., m, 0] * x[..., m, i]`` (evaluated in float64 here; the
kernel uses fp32 fused multiply-adds in stream order and rounds to bf16 once).  Gradients:
``grad_x[..., m, i] = mix_m * g_i`` (the kernel: one fp32 product, rounded to bf16, which
:func:`apply_mix_grad_x_emulated` reproduces bit for bit) and ``grad_mix[..., m, 0] = sum_i g_i *
x[..., m, i]``.
"""

from __future__ import annotations

import torch


def apply_mix(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """float64 ``[..., H]`` (differentiable in float64 inputs)."""
    return (x.to(torch.float64) * mix.to(torch.float64)).sum(-2)


def apply_mix_terms_abs(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """Absolute sum of the forward's terms (for the error bound)."""
    return (x.to(torch.float64) * mix.to(torch.float64)).abs().sum(-2)


def apply_mix_bwd(grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """float64 ``(grad_x, grad_mix, grad_mix_terms_abs)``."""
    g, x64, w = grad.to(torch.float64).unsqueeze(-2), x.to(torch.float64), mix.to(torch.float64)
    grad_x = w * g
    prod = g * x64
    return grad_x, prod.sum(-1, keepdim=True), prod.abs().sum(-1, keepdim=True)


def apply_mix_grad_x_emulated(grad: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """The kernel's bits for grad_x without accumulation: ``bf16(fp32(mix_m * g_i))``."""
    return (mix.to(torch.float32) * grad.to(torch.float32).unsqueeze(-2)).to(torch.bfloat16)
