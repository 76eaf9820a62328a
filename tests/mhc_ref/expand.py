"""Reference of ``expand_to_mhc``: a hidden state copied into ``mhc_mult`` streams, and its gradient.

Forward: ``out[..., m, :] = x[..., :]`` (exact).  Backward: the sum over the streams; the kernel
adds in fp32 in stream order and rounds once, which :func:`expand_bwd_emulated` reproduces bit
for bit (``0 + g_0`` is exact, then fp32 additions in order).
"""

from __future__ import annotations

import torch


def expand(x: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    """``[..., mhc_mult, H]`` copies of ``x`` (any dtype; differentiable)."""
    return x.unsqueeze(-2).expand(*x.shape[:-1], mhc_mult, x.shape[-1]).contiguous()


def expand_bwd(grad: torch.Tensor) -> torch.Tensor:
    """float64 stream sum of ``grad`` ``[..., M, H]``."""
    return grad.to(torch.float64).sum(-2)


def expand_bwd_emulated(grad: torch.Tensor) -> torch.Tensor:
    """The kernel's bits: fp32 sum in stream order, rounded to bf16."""
    acc = grad[..., 0, :].to(torch.float32)
    for m in range(1, grad.shape[-2]):
        acc = acc + grad[..., m, :].to(torch.float32)
    return acc.to(torch.bfloat16)
