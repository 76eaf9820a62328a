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
raise :class:`tilebin.runtime.ArgumentError` before any GPU work.  OpSpec ops: ``tilebin::mhc_head_compute_mix`` and
``tilebin::mhc_head_compute_mix_bwd``.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import fail, kernel_meta, launcher
from tilebin.ops._spec import OpSpec, TensorParam

from ._rows import (FP32, MAX_ELEMENTS, Rows, check_shape, check_size, float_param, ordered, shapes, small_input,
                    torch_ops)

_BWD = "mhc.head_compute_mix_bwd"  # its meta: max_mhc (the op's limit), parts (rows of the backward's scratch)


def _check(op: str, input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, *_: Any) -> None:
    """Every check but the dtypes, eps and the device, in today's order."""
    if input_mix.dim() < 1:
        raise fail(op, "input_mix must be [..., mhc_mult], got a 0-D tensor")
    mhc = input_mix.shape[-1]
    max_mhc = kernel_meta(_BWD, "max_mhc")
    if not 1 <= mhc <= max_mhc:
        raise fail(op, f"input_mix has shape {tuple(input_mix.shape)}; supported: mhc_mult (its last dim) "
                       f"from 1 to {max_mhc}")
    check_size(op, "input_mix", input_mix)
    check_shape(op, "mhc_scale", mhc_scale, (1,), "one scale; pass scale.reshape(1)")
    check_shape(op, "mhc_base", mhc_base, (mhc,), "one bias per stream")


def _plain(input_mix: torch.Tensor, *_: Any) -> bool:
    return input_mix.numel() <= MAX_ELEMENTS


def _plan_fwd(values: dict):
    mhc, eps, fn = values["input_mix"].shape[-1], values["mhc_pre_eps"], launcher("mhc.head_compute_mix_fwd")

    def run(input_mix, mhc_scale, mhc_base, _):
        out = torch.empty(input_mix.shape, dtype=torch.float32, device=input_mix.device)
        if out.numel():
            fn(small_input(input_mix).view(-1, mhc), small_input(mhc_scale), small_input(mhc_base), out.view(-1, mhc),
               eps)
        return out

    return run


def _plan_bwd(values: dict):
    mhc, fn = values["input_mix"].shape[-1], launcher(_BWD)
    parts, max_mhc = kernel_meta(_BWD, "parts"), kernel_meta(_BWD, "max_mhc")

    def run(grad, input_mix, mhc_scale, mhc_base):
        dev = input_mix.device
        grad_input = torch.empty(input_mix.shape, dtype=torch.float32, device=dev)
        new = torch.empty if input_mix.numel() else torch.zeros
        grad_scale, grad_base = new((1,), dtype=torch.float32, device=dev), new((mhc,), dtype=torch.float32, device=dev)
        if input_mix.numel():  # 0 tokens: nothing to launch, the sums are zeros
            partial = torch.empty(parts, max_mhc + 1, dtype=torch.float32, device=dev)
            fn(small_input(grad).view(-1, mhc), small_input(input_mix).view(-1, mhc), small_input(mhc_scale),
               small_input(mhc_base), grad_input.view(-1, mhc), partial, grad_scale, grad_base)
        return grad_input, grad_scale, grad_base

    return run


_SCALE_BASE = (TensorParam("mhc_scale", FP32, rows_vary=False), TensorParam("mhc_base", FP32, rows_vary=False))
HEAD_MIX = OpSpec("mhc_head_compute_mix",
                  (Rows("input_mix", FP32), *_SCALE_BASE, float_param("mhc_pre_eps")),
                  "Tensor", _plan_fwd, **ordered(_check, _plain))
HEAD_MIX_BWD = OpSpec("mhc_head_compute_mix_bwd", (Rows("grad", FP32), Rows("input_mix", FP32), *_SCALE_BASE),
                      "(Tensor, Tensor, Tensor)", _plan_bwd,
                      **shapes(lambda grad, input_mix, *_: (("grad", grad, input_mix.shape),),
                               lambda op, grad, *args: _check(op, *args)))


class MHCHeadComputeMix(torch.autograd.Function):
    """``apply(input_mix, mhc_scale, mhc_base, mhc_pre_eps)``: see :func:`mhc_head_compute_mix`."""

    @staticmethod
    def forward(ctx: Any, input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                mhc_pre_eps: float) -> torch.Tensor:
        out = HEAD_MIX(input_mix, mhc_scale, mhc_base, mhc_pre_eps)
        ctx.save_for_backward(input_mix, mhc_scale, mhc_base)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return (*HEAD_MIX_BWD(grad, *ctx.saved_tensors), None)


def mhc_head_compute_mix(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                         mhc_pre_eps: float) -> torch.Tensor:
    """``sigmoid(input_mix * mhc_scale + mhc_base) + mhc_pre_eps`` (fp32; see the module docstring)."""
    return MHCHeadComputeMix.apply(input_mix, mhc_scale, mhc_base, mhc_pre_eps)


SPECS = (HEAD_MIX, HEAD_MIX_BWD)
TORCH_OPS = torch_ops(*SPECS)

__all__ = ["MHCHeadComputeMix", "mhc_head_compute_mix"]
