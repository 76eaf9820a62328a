"""``EngramGateFn`` / ``engram_gate``: the fused Engram gate with RMSNorm, differentiable.

Forward: ``output = hidden_states + sigmoid(signed_sqrt(<RMSNorm(x) * wh, RMSNorm(k) * we> /
sqrt(hidden))) * v`` per token and head (see :func:`tilebin.ops.engram.engram_gate_fwd`), with
``signed_sqrt`` clamped at ``clamp_value``.  Backward: the gradients of hidden_states, k and v
(bf16, their shapes) and of both weights.

The ``main_grad`` convention (Megatron-style fp32 gradient buffers): when ``weight_hidden`` or
``weight_embed`` has a ``main_grad`` attribute (not None), its gradient is accumulated into that
tensor in place and ``None`` is returned for the weight; otherwise an fp32 gradient is returned
(autograd casts it to the weight's dtype).  A ``main_grad`` must be a contiguous fp32 tensor of
the weight's shape on its device, else :class:`tilebin.runtime.ArgumentError` before any GPU
work of the backward.  Works under CUDA-graph capture once warmed up (no host syncs).
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import check_tensor, fail
from tilebin.ops.engram import engram_gate_bwd, engram_gate_fwd, fused_weight, grad_w_reduce

_OP = "engram_gate"


def _check_shapes(hidden_states: Any, k: Any, v: Any) -> tuple[int, int]:
    """``[*, hc_mult, hidden]`` hidden_states and k of one shape, v ``[*, hidden]``."""
    for name, t in (("hidden_states", hidden_states), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise fail(_OP, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if hidden_states.dim() < 2:
        raise fail(_OP, f"hidden_states must be [*, hc_mult, hidden], got shape {tuple(hidden_states.shape)}")
    *lead, hc, hidden = hidden_states.shape
    if tuple(k.shape) != tuple(hidden_states.shape):
        raise fail(_OP, f"k has shape {tuple(k.shape)}, want hidden_states' {tuple(hidden_states.shape)}")
    if tuple(v.shape) != (*lead, hidden):
        raise fail(_OP, f"v has shape {tuple(v.shape)}, want {(*lead, hidden)} (hidden_states without hc_mult)")
    return hc, hidden


def main_grad_of(weight: torch.Tensor, name: str) -> torch.Tensor | None:
    """``weight.main_grad`` after checking it (fp32, the weight's shape, contiguous, its device), or None."""
    grad = getattr(weight, "main_grad", None)
    if grad is None:
        return None
    check_tensor(_OP, f"{name}.main_grad", grad, (torch.float32,), weight.dim())
    if tuple(grad.shape) != tuple(weight.shape) or not grad.is_contiguous() or grad.device != weight.device:
        raise fail(_OP, f"{name}.main_grad is {tuple(grad.shape)} (strides {tuple(grad.stride())}) on {grad.device}; "
                        f"supported: a contiguous float32 tensor of shape {tuple(weight.shape)} on {weight.device}")
    return grad


class EngramGateFn(torch.autograd.Function):
    """Fused Engram gate: ``apply(hidden_states, k, v, weight_hidden, weight_embed, clamp_value, eps)``.

    hidden_states, k: bf16 ``[*, hc_mult, hidden]``; v: bf16 ``[*, hidden]``; weight_hidden,
    weight_embed: bf16 ``[hc_mult, hidden]``; clamp_value, eps: floats.  Returns bf16 of
    hidden_states' shape.  See the module docstring for the ``main_grad`` convention.
    """

    @staticmethod
    def forward(ctx, hidden_states, k, v, weight_hidden, weight_embed, clamp_value, eps):
        hc, hidden = _check_shapes(hidden_states, k, v)
        for name, w in (("weight_hidden", weight_hidden), ("weight_embed", weight_embed)):
            if isinstance(w, torch.Tensor):
                main_grad_of(w, name)  # a bad buffer fails now, not after the backward's kernels
        x = hidden_states.reshape(-1, hc, hidden)
        k2 = k.reshape(-1, hc, hidden)
        v2 = v.reshape(-1, hidden)
        weight_fused = fused_weight(weight_hidden, weight_embed)
        output, dot, gate_score, rstd_x, rstd_k = engram_gate_fwd(x, k2, v2, weight_fused, eps, clamp_value, True)
        ctx.save_for_backward(x, k2, v2, weight_hidden, weight_embed, weight_fused, dot, gate_score, rstd_x, rstd_k)
        ctx.clamp_value = clamp_value
        ctx.shapes = (tuple(hidden_states.shape), tuple(v.shape))
        return output.view(hidden_states.shape)

    @staticmethod
    def backward(ctx, grad_output):
        x, k, v, weight_hidden, weight_embed, weight_fused, dot, gate_score, rstd_x, rstd_k = ctx.saved_tensors
        shape, v_shape = ctx.shapes
        main_wh = main_grad_of(weight_hidden, "weight_hidden")
        main_we = main_grad_of(weight_embed, "weight_embed")
        grad_out = grad_output.reshape(x.shape).contiguous()  # e.g. an expanded gradient of .sum()
        grad_x, grad_k, grad_v, grad_w_partial = engram_gate_bwd(
            grad_out, x, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, ctx.clamp_value)
        want_wh = main_wh is None and ctx.needs_input_grad[3]
        want_we = main_we is None and ctx.needs_input_grad[4]
        grad_wh = grad_we = None
        if main_wh is not None or main_we is not None or want_wh or want_we:
            grad_wh = main_wh if main_wh is not None else torch.zeros(weight_hidden.shape, dtype=torch.float32,
                                                                      device=x.device)
            grad_we = main_we if main_we is not None else torch.zeros(weight_embed.shape, dtype=torch.float32,
                                                                      device=x.device)
            grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_wh, grad_we)
        return (grad_x.view(shape), grad_k.view(shape), grad_v.view(v_shape),
                grad_wh if want_wh else None, grad_we if want_we else None, None, None)


def engram_gate(hidden_states: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_hidden: torch.Tensor,
                weight_embed: torch.Tensor, clamp_value: float, eps: float) -> torch.Tensor:
    """``EngramGateFn.apply(...)``: the differentiable Engram gate (see :class:`EngramGateFn`)."""
    return EngramGateFn.apply(hidden_states, k, v, weight_hidden, weight_embed, clamp_value, eps)


__all__ = ["EngramGateFn", "engram_gate", "main_grad_of"]
