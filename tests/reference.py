"""Pure-torch references for tilebin's kernels (GPU tests compare launches against these).

Imports torch only: the GPU test machine has torch but no TileLang.  Each function takes
the kernel's inputs and returns what the kernel's outputs must hold, on the inputs'
device.  Comparison rules are given per function.
"""

import torch

__all__ = ["batched_transpose", "coop_sum", "gemm_nt", "pdl_chain"]


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """``out[b] = x[b].T`` for x ``[batch, rows, cols]``; bit-exact (compare raw bytes)."""
    if x.dim() != 3:
        raise ValueError(f"batched_transpose: x must be 3-D [batch, rows, cols] (got shape {tuple(x.shape)})")
    return x.transpose(1, 2).contiguous()


def gemm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``c = a @ b.T``: fp32 matmul of the bf16 inputs, rounded to bf16 once.

    The kernel accumulates in fp32 in another order, so compare with a tolerance, e.g.
    ``(c.float() - ref.float()).abs().max() <= 1e-2 * ref.float().abs().max() + 1e-2``.
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"gemm_nt: need a [m, k] and b [n, k] (got {tuple(a.shape)} and {tuple(b.shape)})")
    return (a.float() @ b.float().T).to(torch.bfloat16)


def coop_sum(x: torch.Tensor) -> torch.Tensor:
    """``out = [sum(x)]`` as float32 ``[1]``, summed in float64 then rounded.

    The kernel sums in float32 in a fixed order of its own: compare with a tolerance
    that grows with n, e.g. ``atol = 1e-5 * x.abs().sum() + 1e-6``.
    """
    if x.dim() != 1:
        raise ValueError(f"coop_sum: x must be 1-D (got shape {tuple(x.shape)})")
    return x.double().sum().float().reshape(1)


def pdl_chain(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, z) = (x + 1, (x + 1) * 2)`` in float32; exact (each is one rounding of the same op)."""
    if x.dim() != 1:
        raise ValueError(f"pdl_chain: x must be 1-D (got shape {tuple(x.shape)})")
    y = x + 1
    return y, y * 2
