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
Bad arguments raise :class:`tilebin.runtime.ArgumentError` before any GPU work.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import aligned_input, check_cuda, check_float32, check_int, check_tensor, fail, launcher
from tilebin.ops.config import get_num_sms

_OP = "mhc_pre_split_mixes"
_FWD_KERNEL = "mhc.pre_split_mixes_fwd"
MULTS = (2, 4, 8)
THREADS = 128  # tokens per block of mhc.pre_split_mixes_bwd
_INT32_MAX = 2**31 - 1


def _check(input_mixes: Any, mhc_scale: Any, mhc_base: Any, mhc_mult: Any, post_mult_value: Any,
           pre_eps: Any) -> tuple[int, int, float, float]:
    """``(M, tokens, post_mult_value, pre_eps)`` after every check but the device."""
    mhc_mult = check_int(_OP, "mhc_mult", mhc_mult, 1)
    if mhc_mult not in MULTS:
        raise fail(_OP, f"mhc_mult={mhc_mult!r} is not supported; supported: {', '.join(map(str, MULTS))}")
    m = mhc_mult
    k = m * (m + 2)
    check_tensor(_OP, "input_mixes", input_mixes, (torch.float32,))
    if input_mixes.dim() < 2 or input_mixes.shape[-1] != k:
        raise fail(_OP, f"input_mixes has shape {tuple(input_mixes.shape)}; supported: [..., {k}] "
                        f"(mhc_mult * (mhc_mult + 2) for mhc_mult={m})")
    check_tensor(_OP, "mhc_scale", mhc_scale, (torch.float32,))
    if tuple(mhc_scale.shape) != (3,):
        raise fail(_OP, f"mhc_scale has shape {tuple(mhc_scale.shape)}; supported: (3,) (pre, post, comb scales)")
    check_tensor(_OP, "mhc_base", mhc_base, (torch.float32,))
    if tuple(mhc_base.shape) != (k,):
        raise fail(_OP, f"mhc_base has shape {tuple(mhc_base.shape)}; supported: ({k},) for mhc_mult={m}")
    post_mult_value = check_float32(_OP, "mhc_post_mult_value", post_mult_value)
    pre_eps = check_float32(_OP, "mhc_pre_eps", pre_eps)
    if input_mixes.numel() > _INT32_MAX:
        raise fail(_OP, f"input_mixes has {input_mixes.numel()} elements; supported: at most {_INT32_MAX} "
                        f"(split the call)")
    return m, input_mixes.numel() // k, post_mult_value, pre_eps


class MHCPreSplitMixes(torch.autograd.Function):
    """``apply(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)``."""

    @staticmethod
    def forward(ctx, input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps):
        m, n, post_mult_value, pre_eps = _check(input_mixes, mhc_scale, mhc_base, mhc_mult,
                                                mhc_post_mult_value, mhc_pre_eps)
        check_cuda(_OP, input_mixes=input_mixes, mhc_scale=mhc_scale, mhc_base=mhc_base)
        k = m * (m + 2)
        lead = tuple(input_mixes.shape[:-1])
        mixes = aligned_input(input_mixes.contiguous()).view(n, k)
        scale = aligned_input(mhc_scale.contiguous())
        base = aligned_input(mhc_base.contiguous())
        dev = input_mixes.device
        pre = torch.empty((n, m), dtype=torch.float32, device=dev)
        post = torch.empty((n, m), dtype=torch.float32, device=dev)
        comb = torch.empty((n, m, m), dtype=torch.float32, device=dev)
        if n:
            launcher(_FWD_KERNEL, mhc_mult=m)(mixes, scale, base, pre, post, comb, post_mult_value, pre_eps)
        ctx.save_for_backward(mixes, scale, base)
        ctx.meta = (m, n, lead, post_mult_value)
        return pre.view(*lead, m, 1), post.view(*lead, m, 1), comb.view(*lead, m, m)

    @staticmethod
    def backward(ctx, grad_pre, grad_post, grad_comb):
        mixes, scale, base = ctx.saved_tensors
        m, n, lead, post_mult_value = ctx.meta
        k = m * (m + 2)
        dev = mixes.device
        if not n:
            return (torch.zeros((*lead, k), dtype=torch.float32, device=dev), torch.zeros(3, device=dev),
                    torch.zeros(k, device=dev), None, None, None)
        gp = aligned_input(grad_pre.to(torch.float32).contiguous()).view(n, m)
        gq = aligned_input(grad_post.to(torch.float32).contiguous()).view(n, m)
        gc = aligned_input(grad_comb.to(torch.float32).contiguous()).view(n, m, m)
        grad_mixes = torch.empty((n, k), dtype=torch.float32, device=dev)
        blocks = min(-(-n // THREADS), get_num_sms(dev))
        partial = torch.empty((blocks, k + 3), dtype=torch.float32, device=dev)
        launcher("mhc.pre_split_mixes_bwd", mhc_mult=m)(gp, gq, gc, mixes, scale, base, grad_mixes, partial,
                                                         post_mult_value)
        sums = partial.sum(0)
        need = ctx.needs_input_grad
        return (grad_mixes.view(*lead, k), sums[k:] if need[1] else None, sums[:k] if need[2] else None,
                None, None, None)


def mhc_pre_split_mixes(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                        mhc_post_mult_value: float, mhc_pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pre_layer_mix [..., M, 1], post_layer_mix [..., M, 1], comb_res_mix [..., M, M])``: see the module docstring."""
    return MHCPreSplitMixes.apply(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)


__all__ = ["MHCPreSplitMixes", "MULTS", "mhc_pre_split_mixes"]
