"""``mhc_head_compute_mix``: the LM head's per-stream weights (tile_kernels 1.0.0
``tile_kernels.modeling.mhc.ops.head_compute_mix``), differentiable.

Forward: ``input_mix`` fp32 ``[..., M]``, ``mhc_scale`` fp32 ``[1]``, ``mhc_base`` fp32 ``[M]``,
``mhc_pre_eps`` a float -> fp32 like ``input_mix``::

    out[..., m] = sigmoid(input_mix[..., m] * mhc_scale[0] + mhc_base[m]) + mhc_pre_eps

(the scale and base applied as one fused multiply-add).  Backward, with ``s`` the sigmoid and
``d = s * (1 - s) * grad``: ``grad_input = d * scale``, ``grad_scale = [sum d * input_mix]``,
``grad_base[m] = sum over tokens of d`` (fp32, deterministic fixed-order sums: the same bits on
every GPU and run).  ``M`` from 1 to 8, any leading dims, 0 tokens included (nothing is launched; the scale
and base gradients are then zeros).  ``input_mix`` may be a strided view (e.g. the first ``M`` columns of
the pre-norm mixes): it is copied to contiguous memory (a few bytes per token).  Bad arguments
raise :class:`tilebin.runtime.ArgumentError` before any GPU work.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import check_cuda, check_float32, check_tensor, fail, kernel_meta, launcher

from ._rows import FP32, check_shape, check_size

_OP = "mhc_head_compute_mix"
_FWD_KERNEL = "mhc.head_compute_mix_fwd"
_BWD = "mhc.head_compute_mix_bwd"  # its meta: max_mhc (the op's limit), parts (rows of the backward's scratch)


def _check(input_mix: Any, mhc_scale: Any, mhc_base: Any, mhc_pre_eps: Any) -> tuple[int, float]:
    check_tensor(_OP, "input_mix", input_mix, FP32)
    if input_mix.dim() < 1:
        raise fail(_OP, "input_mix must be [..., mhc_mult], got a 0-D tensor")
    mhc = input_mix.shape[-1]
    max_mhc = kernel_meta(_BWD, "max_mhc")
    if not 1 <= mhc <= max_mhc:
        raise fail(_OP, f"input_mix has shape {tuple(input_mix.shape)}; supported: mhc_mult (its last dim) "
                        f"from 1 to {max_mhc}")
    check_size(_OP, "input_mix", input_mix)
    check_tensor(_OP, "mhc_scale", mhc_scale, FP32)
    check_shape(_OP, "mhc_scale", mhc_scale, (1,), "one scale; pass scale.reshape(1)")
    check_tensor(_OP, "mhc_base", mhc_base, FP32)
    check_shape(_OP, "mhc_base", mhc_base, (mhc,), "one bias per stream")
    eps = check_float32(_OP, "mhc_pre_eps", mhc_pre_eps)
    check_cuda(_OP, input_mix=input_mix, mhc_scale=mhc_scale, mhc_base=mhc_base)
    return mhc, eps


class MHCHeadComputeMix(torch.autograd.Function):
    """``apply(input_mix, mhc_scale, mhc_base, mhc_pre_eps)``: see :func:`mhc_head_compute_mix`."""

    @staticmethod
    def forward(ctx: Any, input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                mhc_pre_eps: float) -> torch.Tensor:
        mhc, eps = _check(input_mix, mhc_scale, mhc_base, mhc_pre_eps)
        inp = input_mix.contiguous()
        scale, base = mhc_scale.contiguous(), mhc_base.contiguous()
        out = torch.empty(input_mix.shape, dtype=torch.float32, device=input_mix.device)
        if out.numel():
            launcher(_FWD_KERNEL)(inp.view(-1, mhc), scale, base, out.view(-1, mhc), eps)
        ctx.save_for_backward(inp, scale, base)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        inp, scale, base = ctx.saved_tensors
        mhc = inp.shape[-1]
        dev = inp.device
        grad_input = torch.empty(inp.shape, dtype=torch.float32, device=dev)
        if not inp.numel():  # 0 tokens: nothing to launch, the sums are zeros
            grad_scale = torch.zeros((1,), dtype=torch.float32, device=dev)
            return grad_input, grad_scale.view(scale.shape), torch.zeros((mhc,), dtype=torch.float32, device=dev), None
        g = grad.contiguous()
        partial = torch.empty((kernel_meta(_BWD, "parts"), kernel_meta(_BWD, "max_mhc") + 1), dtype=torch.float32,
                              device=dev)
        grad_scale = torch.empty((1,), dtype=torch.float32, device=dev)
        grad_base = torch.empty((mhc,), dtype=torch.float32, device=dev)
        launcher("mhc.head_compute_mix_bwd")(g.view(-1, mhc), inp.view(-1, mhc), scale, base,
                                             grad_input.view(-1, mhc), partial, grad_scale, grad_base)
        return grad_input, grad_scale.view(scale.shape), grad_base, None


def mhc_head_compute_mix(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                         mhc_pre_eps: float) -> torch.Tensor:
    """``sigmoid(input_mix * mhc_scale + mhc_base) + mhc_pre_eps`` (fp32; see the module docstring)."""
    return MHCHeadComputeMix.apply(input_mix, mhc_scale, mhc_base, mhc_pre_eps)


__all__ = ["MHCHeadComputeMix", "mhc_head_compute_mix"]
