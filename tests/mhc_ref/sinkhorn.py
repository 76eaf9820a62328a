"""Torch references of the mHC Sinkhorn normalisation (semantics of tile_kernels 1.0.0
``sinkhorn_normalize``), test-only.

``sinkhorn(x, repeat, eps)`` is the definition, differentiable (autograd gives the backward)::

    P = softmax(x, -1) + eps
    P = P / (P.sum(-2) + eps)
    repeat - 1 times:  P = P / (P.sum(-1) + eps);  P = P / (P.sum(-2) + eps)

``sinkhorn_fwd_emulated`` / ``sinkhorn_bwd_emulated`` run the kernels' algorithm in fp32 torch
(sums in index order, one reciprocal per row or column; the backward keeps each step's sums
only, rebuilds every intermediate from the final matrix on the way back and recomputes the
softmax), so the CPU tests can show that algorithm matches float64 autograd of the definition.
"""

from __future__ import annotations

import torch


def sinkhorn(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The definition in ``dtype`` (float64 by default), differentiable."""
    p = x.to(dtype).softmax(-1) + eps
    p = p / (p.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        p = p / (p.sum(-1, keepdim=True) + eps)
        p = p / (p.sum(-2, keepdim=True) + eps)
    return p


def _seq_sum(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum along ``dim`` in index order (each addition rounded), keeping the dim."""
    parts = t.unbind(dim)
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return acc.unsqueeze(dim)


def _softmax32(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / _seq_sum(e, -1)


def sinkhorn_fwd_emulated(x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """The forward kernel's algorithm in fp32."""
    p = _softmax32(x.float()) + eps
    for k in range(2 * repeat - 1):
        dim = -2 if k % 2 == 0 else -1
        p = p * (1 / (_seq_sum(p, dim) + eps))
    return p


def sinkhorn_bwd_emulated(grad: torch.Tensor, x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """The backward kernel's algorithm in fp32 (sums kept, intermediates rebuilt backwards)."""
    p = _softmax32(x.float()) + eps
    sums = []
    for k in range(2 * repeat - 1):
        dim = -2 if k % 2 == 0 else -1
        s = _seq_sum(p, dim)
        sums.append((s, dim))
        p = p * (1 / (s + eps))
    g = grad.float()
    for s, dim in reversed(sums):
        d = s + eps
        g = (g - _seq_sum(g * p, dim)) * (1 / d)
        p = p * d
    sm = _softmax32(x.float())
    return (g - _seq_sum(g * sm, -1)) * sm
