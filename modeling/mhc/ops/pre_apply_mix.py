"""``mhc_pre_apply_mix``: a sublayer's input as a weighted sum of the mHC residual streams
(tile_kernels 1.0.0 ``tile_kernels.modeling.mhc.ops.pre_apply_mix``), differentiable.

Forward: ``x`` bf16 ``[..., M, H]`` and ``mix`` fp32 ``[..., M, 1]`` -> bf16 ``[..., H]``,
``out[..., i] = sum_m mix[..., m, 0] * x[..., m, i]`` in fp32 (``mix_0 * x_0`` then fused
multiply-adds in stream order), rounded to bf16 once; into ``out`` when given.

Backward: ``grad_mix[..., m, 0] = sum_i grad[..., i] * x[..., m, i]`` (fp32) and ``grad_x[...,
m, i] = bf16(mix_m * grad_i)``.  Fused gradient accumulation (tile_kernels' protocol): when the
storage of ``x`` carries ``grad_from_mhc_post`` (the residual gradient :func:`mhc_post`'s
backward leaves there when ``x`` is also that op's residual), ``mix_m * grad_i`` is added into
that tensor in place (``bf16(fma(mix_m, grad_i, old))``) and None is returned for ``x``; the
attribute stays for :func:`mhc_pre_norm_fn`, which removes it.  Otherwise a fresh gradient is
returned.

``M`` in (2, 4, 8); ``H`` a positive multiple of 8 (one cubin per ``M`` serves every hidden);
any leading dims, 0 tokens included (nothing is launched).  Bad arguments raise
:class:`tilebin.runtime.ArgumentError` before any GPU work.  OpSpec ops: ``tilebin::mhc_pre_apply_mix``
(``_out``) and ``tilebin::mhc_pre_apply_mix_bwd`` (which writes or adds into its ``grad_x``).
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import aligned_input, fail, launcher
from tilebin.ops._spec import FlagParam, OpSpec

from ._rows import (BF16, FP32, MAX_ELEMENTS, OUT, Rows, Streams, apply, check_contiguous, check_hidden,
                    check_mhc, check_out, check_shape, check_size, ordered, out_spec, shapes, small_input, stash_of,
                    torch_ops)


def _check(op: str, x: torch.Tensor, mix: torch.Tensor, out: Any) -> None:
    """Every check but the dtypes and the device, in today's order."""
    if x.dim() < 2:
        raise fail(op, f"x must be [..., mhc_mult, hidden], got shape {tuple(x.shape)}")
    *lead, mhc, hidden = x.shape
    check_mhc(op, "mhc_mult (x.shape[-2])", mhc)
    check_hidden(op, "x", x)
    check_contiguous(op, "x", x)
    check_size(op, "x", x)
    check_shape(op, "mix", mix, (*lead, mhc, 1), "x's leading dims and mhc_mult, then 1")
    if out is not None:
        check_out(op, out, (*lead, hidden), torch.bfloat16, x.device, {"x": x, "mix": mix})


def _plain(x: torch.Tensor, mix: torch.Tensor, *_: Any) -> bool:
    return mix.shape[:-2] == x.shape[:-2] and x.is_contiguous() and x.numel() <= MAX_ELEMENTS


def _plan_fwd(values: dict):
    mhc, hidden = values["x"].shape[-2:]
    fn = launcher("mhc.pre_apply_mix_fwd", mhc=mhc)

    def run(x: torch.Tensor, mix: torch.Tensor, out: Any) -> torch.Tensor:
        if out is None:
            out = torch.empty(*x.shape[:-2], hidden, dtype=torch.bfloat16, device=x.device)
        if x.numel():
            fn(aligned_input(x).view(-1, mhc, hidden), small_input(mix).view(-1, mhc), out.view(-1, hidden))
        return out

    return run


def _plan_bwd(values: dict):
    mhc, hidden = values["x"].shape[-2:]
    fn = launcher("mhc.pre_apply_mix_bwd", mhc=mhc)

    def run(out_grad, x, mix, grad_x, accumulate) -> torch.Tensor:
        grad_mix = torch.empty(mix.shape, dtype=torch.float32, device=x.device)
        if x.numel():  # autograd may hand an expanded or offset out_grad
            fn(aligned_input(out_grad.contiguous()).view(-1, hidden), aligned_input(x).view(-1, mhc, hidden),
               small_input(mix).view(-1, mhc), grad_x.view(-1, mhc, hidden), grad_mix.view(-1, mhc),
               1 if accumulate else 0)
        return grad_mix

    return run


APPLY_MIX = out_spec("mhc_pre_apply_mix", (Streams("x", BF16), Streams("mix", FP32), OUT), "Tensor", _plan_fwd,
                     **ordered(_check, _plain))
APPLY_MIX_BWD = OpSpec("mhc_pre_apply_mix_bwd",
                       (Rows("out_grad", BF16), Streams("x", BF16, contiguous=True), Streams("mix", FP32),
                        Streams("grad_x", BF16, contiguous=True, mutated=True, ptr_align=16), FlagParam("accumulate")),
                       "Tensor", _plan_bwd, **shapes(lambda g, x, mix, grad_x, _: (
                           ("out_grad", g, (*x.shape[:-2], x.shape[-1])), ("mix", mix, (*x.shape[:-1], 1)),
                           ("grad_x", grad_x, x.shape)), lambda op, g, x, mix, *_: _check(op, x, mix, None)))


class MHCPreApplyMix(torch.autograd.Function):
    """``apply(x, mix, out)``: see :func:`mhc_pre_apply_mix`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if out is not None:
            ctx.mark_dirty(out)
        result = APPLY_MIX(x, mix, out)
        ctx.save_for_backward(x, mix)
        return result

    @staticmethod
    def backward(ctx: Any, out_grad: torch.Tensor) -> tuple:
        x, mix = ctx.saved_tensors
        stash = stash_of(x) if ctx.needs_input_grad[0] else None
        grad_x = stash.view(x.shape) if stash is not None else torch.empty_like(x)
        grad_mix = APPLY_MIX_BWD(out_grad, x, mix, grad_x, stash is not None)
        return (grad_x if stash is None and ctx.needs_input_grad[0] else None), grad_mix, None


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_m mix[..., m, 0] * x[..., m, :]`` as bf16 ``[..., H]`` (see the module docstring)."""
    return apply(MHCPreApplyMix, APPLY_MIX, x, mix, out)


SPECS = (APPLY_MIX, APPLY_MIX_BWD)
TORCH_OPS = torch_ops(*SPECS)

__all__ = ["MHCPreApplyMix", "mhc_pre_apply_mix"]
