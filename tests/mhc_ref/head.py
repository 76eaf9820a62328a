"""Reference of ``mhc_head_compute_mix``: the LM head's per-stream weights.

Definition: ``out = sigmoid(input_mix * scale + base) + pre_eps`` (float64 here; the kernel
applies scale and base as one fp32 fused multiply-add).  Gradients with ``s`` the sigmoid and
``d = s * (1 - s) * grad``: ``grad_input = d * scale``, ``grad_scale = [sum d * input_mix]``,
``grad_base = d`` summed over the tokens.
"""

from __future__ import annotations

import torch


def head_mix(input_mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, pre_eps: float) -> torch.Tensor:
    """float64 like ``input_mix`` (differentiable in float64 inputs)."""
    z = input_mix.to(torch.float64) * scale.to(torch.float64) + base.to(torch.float64)
    return torch.sigmoid(z) + pre_eps


def head_mix_bwd(grad: torch.Tensor, input_mix: torch.Tensor, scale: torch.Tensor,
                 base: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """float64 ``{name: (value, error scale)}`` for ``input``, ``scale``, ``base``; the error scale
    is the absolute sum of the terms (``|d| * |input|`` etc.) plus ``|grad|`` weighted alike, which
    covers the fp32 rounding of ``1 - s`` near saturation."""
    g, a = grad.to(torch.float64), input_mix.to(torch.float64)
    sc, b = scale.to(torch.float64), base.to(torch.float64)
    s = torch.sigmoid(a * sc + b)
    d = s * (1 - s) * g
    lead = tuple(range(d.dim() - 1))
    return {
        "input": (d * sc, (d.abs() + g.abs()) * sc.abs()),
        "scale": ((d * a).sum().reshape(1), ((d.abs() + g.abs()) * a.abs()).sum().reshape(1)),
        "base": (d.sum(lead) if lead else d, (d.abs() + g.abs()).sum(lead) if lead else d.abs() + g.abs()),
    }
