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


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``fma(a, b, c)``: the exact ``a * b + c`` rounded once to fp32.  Evaluated in float64,
    which is exact whenever the product has at most 32 significant bits (fp32 x bf16) and the
    sum spans at most 53; otherwise a second rounding can differ from one only on a float64 value
    exactly halfway between two fp32 values (never seen on random data)."""
    return (a.to(torch.float64) * b.to(torch.float64) + c.to(torch.float64)).to(torch.float32)


def apply_mix_emulated(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """The forward kernel's bits: ``acc = mix_0 * x_0`` (fp32), ``acc = fma(mix_m, x_m, acc)`` in
    stream order, ``bf16(acc)``.  ``x`` ``[..., M, H]``, ``mix`` ``[..., M, 1]``."""
    w = mix.to(torch.float32)
    acc = w[..., 0, :] * x[..., 0, :].to(torch.float32)
    for m in range(1, x.shape[-2]):
        acc = fma32(w[..., m, :], x[..., m, :], acc)
    return acc.to(torch.bfloat16)


def apply_mix_grad_x_acc_emulated(grad: torch.Tensor, mix: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The backward kernel's bits when accumulating into ``old`` (bf16): ``bf16(fma(mix_m, g_i, old))``."""
    return fma32(mix, grad.unsqueeze(-2), old).to(torch.bfloat16)
