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
:class:`tilebin.runtime.ArgumentError` before any GPU work.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import check_cuda, check_tensor, fail, launcher

from . import _rows
from ._rows import (BF16, FP32, STASH, aligned_input, check_contiguous, check_hidden, check_mhc, check_out,
                    check_shape, check_size, small_input)

_OP = "mhc_pre_apply_mix"
_FWD_KERNEL = "mhc.pre_apply_mix_fwd"


def _check(x: Any, mix: Any, out: Any) -> tuple[int, int, tuple]:
    check_tensor(_OP, "x", x, BF16)
    if x.dim() < 2:
        raise fail(_OP, f"x must be [..., mhc_mult, hidden], got shape {tuple(x.shape)}")
    *lead, mhc, hidden = x.shape
    check_mhc(_OP, "mhc_mult (x.shape[-2])", mhc)
    check_hidden(_OP, "x", x)
    check_contiguous(_OP, "x", x)
    check_size(_OP, "x", x)
    check_tensor(_OP, "mix", mix, FP32)
    check_shape(_OP, "mix", mix, (*lead, mhc, 1), "x's leading dims and mhc_mult, then 1")
    if out is not None:
        check_out(_OP, out, (*lead, hidden), torch.bfloat16, x.device, {"x": x, "mix": mix})
    check_cuda(_OP, x=x, mix=mix, out=out)
    return mhc, hidden, tuple(lead)


def _stash_of(x: torch.Tensor) -> torch.Tensor | None:
    """The residual gradient mhc_post's backward left on ``x``'s storage, when it is one ``x``'s
    gradient can be added into (a contiguous bf16 tensor of ``x``'s size on its device, left for
    this very residual), else None."""
    stash = getattr(x.untyped_storage(), STASH, None)
    if (isinstance(stash, torch.Tensor) and stash.dtype == torch.bfloat16 and stash.is_contiguous()
            and stash.numel() == x.numel() and stash.device == x.device
            and getattr(stash, "_mhc_residual_ptr", x.data_ptr()) == x.data_ptr()):
        return stash
    return None


def _plain_mix(x: torch.Tensor, mix: Any, mhc: int, hidden: int) -> bool:
    """True when :func:`_check` and the device check would accept ``(x, mix)`` (x already known
    to be bf16 ``[..., mhc, hidden]``) and neither needs a copy; else False (the checked path)."""
    return (isinstance(mix, torch.Tensor) and mix.dtype is FP32[0] and mix.shape == (*x.shape[:-1], 1)
            and _rows.plain(x, mix))


class MHCPreApplyMix(torch.autograd.Function):
    """``apply(x, mix, out)``: see :func:`mhc_pre_apply_mix`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        mh = _rows.plain_streams(x) if out is None else None
        if mh is not None and _plain_mix(x, mix, *mh):  # the common case, one cheaper predicate
            (mhc, hidden), lead, xa, m2 = mh, x.shape[:-2], x, mix
        else:
            mhc, hidden, lead = _check(x, mix, out)
            xa = aligned_input(x)
            m2 = small_input(mix)
        if out is None:
            out = torch.empty((*lead, hidden), dtype=torch.bfloat16, device=x.device)
        else:
            ctx.mark_dirty(out)
        if x.numel():
            launcher(_FWD_KERNEL, mhc=mhc)(xa.view(-1, mhc, hidden), m2.view(-1, mhc), out.view(-1, hidden))
        ctx.save_for_backward(x, m2)
        return out

    @staticmethod
    def backward(ctx: Any, out_grad: torch.Tensor) -> tuple:
        x, mix = ctx.saved_tensors
        *lead, mhc, hidden = x.shape
        stash = _stash_of(x) if ctx.needs_input_grad[0] else None
        grad_x = stash.view(x.shape) if stash is not None else torch.empty_like(x)
        grad_mix = torch.empty(mix.shape, dtype=torch.float32, device=x.device)
        if x.numel():
            g = aligned_input(out_grad.contiguous())  # autograd may hand an expanded or offset view
            launcher("mhc.pre_apply_mix_bwd", mhc=mhc)(
                g.view(-1, hidden), aligned_input(x).view(-1, mhc, hidden), mix.view(-1, mhc),
                grad_x.view(-1, mhc, hidden), grad_mix.view(-1, mhc), 1 if stash is not None else 0)
        if stash is not None or not ctx.needs_input_grad[0]:
            grad_x = None
        return grad_x, grad_mix, None


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_m mix[..., m, 0] * x[..., m, :]`` as bf16 ``[..., H]`` (see the module docstring)."""
    return MHCPreApplyMix.apply(x, mix, out)


__all__ = ["MHCPreApplyMix", "mhc_pre_apply_mix"]
