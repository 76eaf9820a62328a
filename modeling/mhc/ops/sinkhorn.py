"""``sinkhorn_normalize``: Sinkhorn normalisation of ``[..., M, M]`` mixing matrices, differentiable
(``tile_kernels.modeling.mhc.ops.sinkhorn`` 1.0.0 API).

``P = softmax(x, -1) + eps``, then ``P /= P.sum(-2) + eps``, then ``repeat - 1`` times
``P /= P.sum(-1) + eps; P /= P.sum(-2) + eps`` (fp32, the kernels ``mhc.sinkhorn_fwd`` /
``mhc.sinkhorn_bwd``).  ``repeat`` and ``eps`` are run-time values: every repeat count and eps is
served by the same cubin.  The backward reruns the forward on the GPU (only ``x`` is saved) and
needs a scratch of ``(2 * repeat - 1) * M`` floats per matrix while it runs.

x: fp32 ``[..., M, M]`` with ``M`` in 2, 4, 8 (any leading dims, 0 matrices included, any
strides: a non-contiguous x is copied); returns fp32 of x's shape.  Bad arguments raise
:class:`tilebin.runtime.ArgumentError` before any GPU work.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import aligned_input, check_cuda, check_float32, check_int, check_tensor, fail, launcher

_OP = "sinkhorn_normalize"
MULTS = (2, 4, 8)  # the prebuilt mhc_mult variants
MAX_REPEAT = 1 << 20
_INT32_MAX = 2**31 - 1


def _check(x: Any, repeat: Any, eps: Any) -> tuple[int, int, int, float]:
    """``(M, number of matrices, repeat, eps)`` after every check but the device."""
    check_tensor(_OP, "x", x, (torch.float32,))
    if x.dim() < 2 or x.shape[-1] != x.shape[-2] or x.shape[-1] not in MULTS:
        raise fail(_OP, f"x has shape {tuple(x.shape)}; supported: [..., M, M] with M (mhc_mult) in "
                        f"{', '.join(map(str, MULTS))}")
    m = x.shape[-1]
    repeat = check_int(_OP, "repeat", repeat, 1, MAX_REPEAT)
    eps = check_float32(_OP, "eps", eps)
    if x.numel() > _INT32_MAX:
        raise fail(_OP, f"x has {x.numel()} elements; supported: at most {_INT32_MAX} (split the call)")
    return m, x.numel() // (m * m), repeat, eps


def _check_work(n: int, m: int, repeat: int) -> None:
    """The backward's scratch (``2 * repeat - 1`` sums of M floats per matrix) stays int32-indexable."""
    if (2 * repeat - 1) * n * m > _INT32_MAX:
        raise fail(_OP, f"the backward of {n} matrices with repeat={repeat} needs {(2 * repeat - 1) * n * m} "
                        f"scratch floats; supported: (2 * repeat - 1) * tokens * M <= {_INT32_MAX} "
                        f"(lower repeat or split the tokens)")


class SinkhornNormalize(torch.autograd.Function):
    """``apply(x, repeat, eps)``: see the module docstring."""

    @staticmethod
    def forward(ctx, x, repeat, eps):
        m, n, repeat, eps = _check(x, repeat, eps)
        if ctx.needs_input_grad[0]:
            _check_work(n, m, repeat)
        check_cuda(_OP, x=x)
        x3 = aligned_input(x.contiguous()).view(n, m, m)
        out = torch.empty((n, m, m), dtype=torch.float32, device=x.device)
        if n:
            launcher("mhc.sinkhorn_fwd", mhc_mult=m)(x3, out, repeat, eps)
        ctx.save_for_backward(x3)
        ctx.meta = (m, n, repeat, eps)
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        (x3,) = ctx.saved_tensors
        m, n, repeat, eps = ctx.meta
        grad_in = torch.empty((n, m, m), dtype=torch.float32, device=x3.device)
        if n:
            g3 = aligned_input(grad_out.to(torch.float32).contiguous()).view(n, m, m)
            work = torch.empty((2 * repeat - 1, n, m), dtype=torch.float32, device=x3.device)
            launcher("mhc.sinkhorn_bwd", mhc_mult=m)(g3, x3, grad_in, work, eps)
        return grad_in.view(grad_out.shape), None, None


def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """Sinkhorn-normalise the ``[M, M]`` matrices of fp32 ``x`` (``[..., M, M]``): see the module docstring."""
    return SinkhornNormalize.apply(x, repeat, eps)


__all__ = ["MULTS", "SinkhornNormalize", "sinkhorn_normalize"]
