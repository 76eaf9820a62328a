"""``sinkhorn_normalize``: Sinkhorn normalisation of ``[..., M, M]`` mixing matrices, differentiable
(``tile_kernels.modeling.mhc.ops.sinkhorn`` 1.0.0 API).

``P = softmax(x, -1) + eps``, then ``P /= P.sum(-2) + eps``, then ``repeat - 1`` times
``P /= P.sum(-1) + eps; P /= P.sum(-2) + eps`` (fp32, the kernels ``mhc.sinkhorn_fwd`` /
``mhc.sinkhorn_bwd``).  ``repeat`` and ``eps`` are run-time values: every repeat count and eps is
served by the same cubin.  The backward reruns the forward on the GPU (only ``x`` is saved) and
needs a scratch of ``(2 * repeat - 1) * M`` floats per matrix while it runs.

x: fp32 ``[..., M, M]`` with ``M`` in 2, 4, 8 (any leading dims, 0 matrices included, any
strides: a non-contiguous x is copied); returns fp32 of x's shape.  Bad arguments raise
:class:`tilebin.runtime.ArgumentError` before any GPU work.  OpSpec ops: ``tilebin::sinkhorn_normalize``
(``for_backward``: also check the backward's scratch limit) and ``tilebin::sinkhorn_normalize_bwd``.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import aligned_input, fail, launcher
from tilebin.ops._spec import FlagParam, IntParam, OpSpec

from ._rows import FP32, Streams, float_param, ordered, shapes, torch_ops

MULTS = (2, 4, 8)  # the prebuilt mhc_mult variants
MAX_REPEAT = 1 << 20
_INT32_MAX = 2**31 - 1


def _check(op: str, x: torch.Tensor, repeat: int, eps: float, for_backward: bool = False) -> None:
    """Every check but the dtype, the scalars and the device, in today's order."""
    if x.dim() < 2 or x.shape[-1] != x.shape[-2] or x.shape[-1] not in MULTS:
        raise fail(op, f"x has shape {tuple(x.shape)}; supported: [..., M, M] with M (mhc_mult) in "
                       f"{', '.join(map(str, MULTS))}")
    if x.numel() > _INT32_MAX:
        raise fail(op, f"x has {x.numel()} elements; supported: at most {_INT32_MAX} (split the call)")
    m = x.shape[-1]
    n = x.numel() // (m * m)
    if for_backward and (2 * repeat - 1) * n * m > _INT32_MAX:  # the backward's scratch stays int32-indexable
        raise fail(op, f"the backward of {n} matrices with repeat={repeat} needs {(2 * repeat - 1) * n * m} "
                       f"scratch floats; supported: (2 * repeat - 1) * tokens * M <= {_INT32_MAX} "
                       f"(lower repeat or split the tokens)")


def _plain(x: torch.Tensor, repeat: int, eps: float, for_backward: bool = False) -> bool:
    return (2 * repeat - 1 if for_backward else 1) * x.numel() <= _INT32_MAX


def _plan_fwd(values: dict):
    m, repeat, eps = values["x"].shape[-1], values["repeat"], values["eps"]
    fn = launcher("mhc.sinkhorn_fwd", mhc_mult=m)

    def run(x: torch.Tensor, *_: Any) -> torch.Tensor:
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        if x.numel():
            fn(aligned_input(x.contiguous()).view(-1, m, m), out.view(-1, m, m), repeat, eps)
        return out

    return run


def _plan_bwd(values: dict):
    m, repeat, eps = values["x"].shape[-1], values["repeat"], values["eps"]
    fn = launcher("mhc.sinkhorn_bwd", mhc_mult=m)

    def run(grad_out: torch.Tensor, x: torch.Tensor, *_: Any) -> torch.Tensor:
        grad_in = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        n = x.numel() // (m * m)
        if n:
            work = torch.empty(2 * repeat - 1, n, m, dtype=torch.float32, device=x.device)
            fn(aligned_input(grad_out.to(torch.float32).contiguous()).view(n, m, m),
               aligned_input(x.contiguous()).view(n, m, m), grad_in.view(n, m, m), work, eps)
        return grad_in

    return run


_SCALARS = (IntParam("repeat", 1, MAX_REPEAT), float_param("eps"))
SINKHORN = OpSpec("sinkhorn_normalize", (Streams("x", FP32), *_SCALARS, FlagParam("for_backward", "False")),
                  "Tensor", _plan_fwd, **ordered(_check, _plain))
SINKHORN_BWD = OpSpec("sinkhorn_normalize_bwd", (Streams("grad_out", FP32), Streams("x", FP32), *_SCALARS),
                      "Tensor", _plan_bwd,
                      **shapes(lambda g, x, *_: (("grad_out", g, x.shape),),
                               lambda op, g, x, r, e: _check(op, x, r, e, True)))


class SinkhornNormalize(torch.autograd.Function):
    """``apply(x, repeat, eps)``: see the module docstring."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
        out = SINKHORN(x, repeat, eps, ctx.needs_input_grad[0])
        ctx.save_for_backward(x)
        ctx.scalars = (repeat, eps)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        return SINKHORN_BWD(grad_out, *ctx.saved_tensors, *ctx.scalars), None, None


def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """Sinkhorn-normalise the ``[M, M]`` matrices of fp32 ``x`` (``[..., M, M]``): see the module docstring."""
    return SinkhornNormalize.apply(x, repeat, eps)


SPECS = (SINKHORN, SINKHORN_BWD)
TORCH_OPS = torch_ops(*SPECS)

__all__ = ["MULTS", "SinkhornNormalize", "sinkhorn_normalize"]
