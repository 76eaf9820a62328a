"""``mhc_pre_split_mixes`` / ``MHCPreSplitMixes``: split the mixes vector into the pre, post and
comb mixes, differentiable (``tile_kernels.modeling.mhc.ops.pre_split_mixes`` 1.0.0 API).

With ``M = mhc_mult``, ``K = M * (M + 2)`` and ``z = input_mixes * scale_k + base`` (``scale_k``
is ``scale[0]`` on the first M columns, ``scale[1]`` on the next M, ``scale[2]`` on the last
``M * M``)::

    pre_layer_mix  = sigmoid(z[..., :M]) + mhc_pre_eps                  [..., M, 1]
    post_layer_mix = sigmoid(z[..., M:2M]) * mhc_post_mult_value        [..., M, 1]
    comb_res_mix   = z[..., 2M:]                                       [..., M, M]

input_mixes fp32 ``[..., K]`` (tile_kernels takes ``[a, b, K]``; any leading dims work here, 0
tokens included), mhc_scale fp32 ``[3]``, mhc_base fp32 ``[K]``, ``M`` in 2, 4, 8; the two
floats are run-time values.  Backward: the gradients of input_mixes, mhc_scale and mhc_base
(fp32; the scale and base gradients are summed over tokens in a fixed order: deterministic).  The
backward recomputes the sigmoids from the saved input instead of dividing the saved post mix by
``mhc_post_mult_value`` (tile_kernels' way), so ``mhc_post_mult_value = 0`` gives zero, not NaN.
Bad arguments raise :class:`tilebin.runtime.ArgumentError` before any GPU work.  OpSpec ops:
``tilebin::mhc_pre_split_mixes`` and ``tilebin::mhc_pre_split_mixes_bwd``.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import aligned_input, fail, launcher
from tilebin.ops._spec import IntParam, OpSpec, TensorParam
from tilebin.ops.config import get_num_sms

from ._rows import FP32, Rows, Streams, float_param, ordered, shapes, torch_ops

_FWD_KERNEL = "mhc.pre_split_mixes_fwd"
MULTS = (2, 4, 8)
THREADS = 128  # tokens per block of mhc.pre_split_mixes_bwd
_INT32_MAX = 2**31 - 1


def _check(op: str, input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, m: int,
           *_: Any) -> None:
    """Every check but the dtypes, the scalars' types and the device, in today's order."""
    if m not in MULTS:
        raise fail(op, f"mhc_mult={m!r} is not supported; supported: {', '.join(map(str, MULTS))}")
    k = m * (m + 2)
    if input_mixes.dim() < 2 or input_mixes.shape[-1] != k:
        raise fail(op, f"input_mixes has shape {tuple(input_mixes.shape)}; supported: [..., {k}] "
                       f"(mhc_mult * (mhc_mult + 2) for mhc_mult={m})")
    if tuple(mhc_scale.shape) != (3,):
        raise fail(op, f"mhc_scale has shape {tuple(mhc_scale.shape)}; supported: (3,) (pre, post, comb scales)")
    if tuple(mhc_base.shape) != (k,):
        raise fail(op, f"mhc_base has shape {tuple(mhc_base.shape)}; supported: ({k},) for mhc_mult={m}")
    if input_mixes.numel() > _INT32_MAX:
        raise fail(op, f"input_mixes has {input_mixes.numel()} elements; supported: at most {_INT32_MAX} "
                       f"(split the call)")


def _plain(input_mixes: torch.Tensor, *_: Any) -> bool:
    return input_mixes.numel() <= _INT32_MAX


def _plan_fwd(values: dict):
    m, post_mult, pre_eps = values["mhc_mult"], values["mhc_post_mult_value"], values["mhc_pre_eps"]
    k, fn = m * (m + 2), launcher(_FWD_KERNEL, mhc_mult=m)

    def run(input_mixes, mhc_scale, mhc_base, *_):
        lead, dev = input_mixes.shape[:-1], input_mixes.device
        pre = torch.empty(*lead, m, 1, dtype=torch.float32, device=dev)
        post = torch.empty(*lead, m, 1, dtype=torch.float32, device=dev)
        comb = torch.empty(*lead, m, m, dtype=torch.float32, device=dev)
        if input_mixes.numel():
            fn(aligned_input(input_mixes.contiguous()).view(-1, k), aligned_input(mhc_scale.contiguous()),
               aligned_input(mhc_base.contiguous()), pre.view(-1, m), post.view(-1, m), comb.view(-1, m, m),
               post_mult, pre_eps)
        return pre, post, comb

    return run


def _plan_bwd(values: dict):
    m, post_mult = values["mhc_mult"], values["mhc_post_mult_value"]
    k, fn = m * (m + 2), launcher("mhc.pre_split_mixes_bwd", mhc_mult=m)

    def run(grad_pre, grad_post, grad_comb, input_mixes, mhc_scale, mhc_base, *_):
        dev, n = input_mixes.device, input_mixes.numel() // k
        if not n:
            return (torch.zeros(input_mixes.shape, dtype=torch.float32, device=dev),
                    torch.zeros(3, device=dev), torch.zeros(k, device=dev))
        grad_mixes = torch.empty(input_mixes.shape, dtype=torch.float32, device=dev)
        partial = torch.empty(min(-(-n // THREADS), get_num_sms(dev)), k + 3, dtype=torch.float32, device=dev)
        gp, gq, gc = (aligned_input(g.to(torch.float32).contiguous()) for g in (grad_pre, grad_post, grad_comb))
        fn(gp.view(n, m), gq.view(n, m), gc.view(n, m, m), aligned_input(input_mixes.contiguous()).view(n, k),
           aligned_input(mhc_scale.contiguous()), aligned_input(mhc_base.contiguous()), grad_mixes.view(n, k),
           partial, post_mult)
        return grad_mixes, partial[:, k:].sum(0), partial[:, :k].sum(0)

    return run


def _bwd_shapes(grad_pre, grad_post, grad_comb, input_mixes, scale, base, m, *_: Any) -> tuple:
    lead = input_mixes.shape[:-1]
    return (("grad_pre", grad_pre, (*lead, m, 1)), ("grad_post", grad_post, (*lead, m, 1)),
            ("grad_comb", grad_comb, (*lead, m, m)))


_INPUTS = (Rows("input_mixes", FP32), TensorParam("mhc_scale", FP32, rows_vary=False),
           TensorParam("mhc_base", FP32, rows_vary=False), IntParam("mhc_mult", 1),
           float_param("mhc_post_mult_value"))
SPLIT = OpSpec("mhc_pre_split_mixes", (*_INPUTS, float_param("mhc_pre_eps")), "(Tensor, Tensor, Tensor)", _plan_fwd,
               **ordered(_check, _plain))
SPLIT_BWD = OpSpec("mhc_pre_split_mixes_bwd",
                   (Streams("grad_pre", FP32), Streams("grad_post", FP32), Streams("grad_comb", FP32), *_INPUTS),
                   "(Tensor, Tensor, Tensor)", _plan_bwd,
                   **shapes(_bwd_shapes, lambda op, gp, gq, gc, *a: _check(op, *a)))



class MHCPreSplitMixes(torch.autograd.Function):
    """``apply(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)``."""

    @staticmethod
    def forward(ctx, input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps):
        outs = SPLIT(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)
        ctx.save_for_backward(input_mixes, mhc_scale, mhc_base)
        ctx.scalars = (mhc_mult, mhc_post_mult_value)
        return outs

    @staticmethod
    def backward(ctx, grad_pre, grad_post, grad_comb):
        grad_mixes, grad_scale, grad_base = SPLIT_BWD(grad_pre, grad_post, grad_comb, *ctx.saved_tensors,
                                                      *ctx.scalars)
        need = ctx.needs_input_grad
        return grad_mixes, grad_scale if need[1] else None, grad_base if need[2] else None, None, None, None


def mhc_pre_split_mixes(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                        mhc_post_mult_value: float,
                        mhc_pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pre_layer_mix [..., M, 1], post_layer_mix [..., M, 1], comb_res_mix [..., M, M])``: see the module
    docstring."""
    return MHCPreSplitMixes.apply(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)


SPECS = (SPLIT, SPLIT_BWD)
TORCH_OPS = torch_ops(*SPECS)

__all__ = ["MHCPreSplitMixes", "MULTS", "mhc_pre_split_mixes"]
