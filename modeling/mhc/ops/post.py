"""``mhc_post``: a sublayer's output merged back into the mHC residual streams (tile_kernels 1.0.0
``tile_kernels.modeling.mhc.ops.post`` and ``tile_kernels.mhc.post_kernel``), differentiable.

Forward (``mhc_post_fwd``): ``x`` bf16 ``[..., H]``, ``residual`` bf16 ``[..., M, H]``,
``post_layer_mix`` fp32 ``[..., M, 1]``, ``comb_res_mix`` fp32 ``[..., M, M]`` -> bf16 ``[..., M,
H]`` (into ``out`` when given)::

    out[..., n, i] = post_layer_mix[..., n, 0] * x[..., i] + sum_m comb_res_mix[..., m, n] * residual[..., m, i]

in fp32 (the post term first, then fused multiply-adds in stream order ``m``), rounded to bf16
once: output stream ``n`` takes column ``n`` of the comb matrix.

Backward (``mhc_post_bwd``), given ``d_o`` like the output: ``d_x = sum_n post_n * d_o[n]``,
``d_residual[m] = sum_n comb[m, n] * d_o[n]`` (bf16; fp32 fma chains over ``n`` in order),
``d_post_layer_mix[n] = sum_i x_i * d_o[n, i]`` and ``d_comb_res_mix[m, n] = sum_i
residual[m, i] * d_o[n, i]`` (fp32 sums over hidden).  With ``fuse_grad_acc`` (default True, as
tile_kernels) ``d_residual`` is also left on the residual's storage as ``grad_from_mhc_post``:
:func:`mhc_pre_apply_mix` and :func:`mhc_pre_norm_fn` of the same residual then add their
gradients into it in place (the latter removes the attribute).

``M`` in (2, 4, 8); ``H`` a positive multiple of 8 (one cubin per ``M`` serves every hidden);
any leading dims, 0 tokens included (nothing is launched).  ``residual`` may be non-contiguous
(it is copied, as tile_kernels does); the other inputs must be contiguous.  Bad arguments raise
:class:`tilebin.runtime.ArgumentError` before any GPU work.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import check_cuda, check_flag, check_tensor, fail, launcher

from . import _rows
from ._rows import (BF16, FP32, STASH, aligned_input, check_contiguous, check_hidden, check_mhc, check_out,
                    check_shape, check_size, small_input)

_OP = "mhc_post"
_FWD_KERNEL = "mhc.post_fwd"


def _check(op: str, x: Any, residual: Any, post_layer_mix: Any, comb_res_mix: Any) -> tuple[int, int, tuple]:
    check_tensor(op, "residual", residual, BF16)
    if residual.dim() < 2:
        raise fail(op, f"residual must be [..., mhc_mult, hidden], got shape {tuple(residual.shape)}")
    *lead, mhc, hidden = residual.shape
    check_mhc(op, "mhc_mult (residual.shape[-2])", mhc)
    check_hidden(op, "residual", residual)
    check_size(op, "residual", residual)
    check_tensor(op, "x", x, BF16)
    check_shape(op, "x", x, (*lead, hidden), "residual without its mhc_mult dim")
    check_contiguous(op, "x", x)
    check_tensor(op, "post_layer_mix", post_layer_mix, FP32)
    check_shape(op, "post_layer_mix", post_layer_mix, (*lead, mhc, 1), "residual's leading dims and mhc_mult, then 1")
    check_tensor(op, "comb_res_mix", comb_res_mix, FP32)
    check_shape(op, "comb_res_mix", comb_res_mix, (*lead, mhc, mhc), "residual's leading dims, then mhc_mult twice")
    return mhc, hidden, tuple(lead)


def _plain_args(x: Any, residual: Any, post_layer_mix: Any, comb_res_mix: Any) -> tuple[int, int] | None:
    """``(mhc, hidden)`` when :func:`_check` and the device check would accept the arguments and
    none needs a copy (all contiguous, aligned, on one GPU); else None."""
    mh = _rows.plain_streams(residual)
    if mh is None or not (isinstance(x, torch.Tensor) and isinstance(post_layer_mix, torch.Tensor)
                          and isinstance(comb_res_mix, torch.Tensor)):
        return None
    mhc, hidden = mh
    lead = residual.shape[:-2]
    if (x.dtype is not BF16[0] or post_layer_mix.dtype is not FP32[0] or comb_res_mix.dtype is not FP32[0]
            or x.shape != (*lead, hidden) or post_layer_mix.shape != (*lead, mhc, 1)
            or comb_res_mix.shape != (*lead, mhc, mhc)):
        return None
    return mh if _rows.plain(residual, x, post_layer_mix, comb_res_mix) else None


def mhc_post_fwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """The merged residual ``[..., M, H]`` (bf16; see the module docstring), into ``out`` when given."""
    if out is None:
        mh = _plain_args(x, residual, post_layer_mix, comb_res_mix)
        if mh is not None:  # the common case, validated by one cheaper predicate
            mhc, hidden = mh
            out = torch.empty(residual.shape, dtype=torch.bfloat16, device=residual.device)
            if out.numel():
                launcher(_FWD_KERNEL, mhc=mhc)(x.view(-1, hidden), residual.view(-1, mhc, hidden),
                                               post_layer_mix.view(-1, mhc), comb_res_mix.view(-1, mhc, mhc),
                                               out.view(-1, mhc, hidden))
            return out
    op = "mhc_post_fwd"
    mhc, hidden, lead = _check(op, x, residual, post_layer_mix, comb_res_mix)
    if out is not None:
        check_out(op, out, tuple(residual.shape), torch.bfloat16, residual.device,
                  {"x": x, "residual": residual, "post_layer_mix": post_layer_mix, "comb_res_mix": comb_res_mix})
    check_cuda(op, x=x, residual=residual, post_layer_mix=post_layer_mix, comb_res_mix=comb_res_mix, out=out)
    if out is None:
        out = torch.empty(residual.shape, dtype=torch.bfloat16, device=residual.device)
    if out.numel():
        launcher(_FWD_KERNEL, mhc=mhc)(
            aligned_input(x).view(-1, hidden), aligned_input(residual.contiguous()).view(-1, mhc, hidden),
            small_input(post_layer_mix).view(-1, mhc), small_input(comb_res_mix).view(-1, mhc, mhc),
            out.view(-1, mhc, hidden))
    return out


def mhc_post_bwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 d_o: torch.Tensor, fuse_grad_acc: bool = True) -> tuple[torch.Tensor, ...]:
    """``(d_x, d_residual, d_post_layer_mix, d_comb_res_mix)`` of :func:`mhc_post_fwd` given ``d_o``
    (bf16 like the output; any strides).  ``fuse_grad_acc``: also leave ``d_residual`` on the
    residual's storage (``grad_from_mhc_post``) for the pre ops of the same residual."""
    op = "mhc_post_bwd"
    mhc, hidden, lead = _check(op, x, residual, post_layer_mix, comb_res_mix)
    check_tensor(op, "d_o", d_o, BF16)
    check_shape(op, "d_o", d_o, tuple(residual.shape), "the forward's output shape")
    fuse = check_flag(op, "fuse_grad_acc", fuse_grad_acc)
    check_cuda(op, x=x, residual=residual, post_layer_mix=post_layer_mix, comb_res_mix=comb_res_mix, d_o=d_o)
    return _backward(x, residual, post_layer_mix, comb_res_mix, d_o, fuse)


def _backward(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
              d_o: torch.Tensor, fuse: bool) -> tuple[torch.Tensor, ...]:
    """:func:`mhc_post_bwd` on validated arguments (the autograd backward: the forward checked
    them, and autograd hands ``d_o`` of the output's shape and dtype)."""
    mhc, hidden = residual.shape[-2:]
    dev = residual.device
    d_x = torch.empty(x.shape, dtype=torch.bfloat16, device=dev)
    d_residual = torch.empty(residual.shape, dtype=torch.bfloat16, device=dev)
    d_post = torch.empty(post_layer_mix.shape, dtype=torch.float32, device=dev)
    d_comb = torch.empty(comb_res_mix.shape, dtype=torch.float32, device=dev)
    if d_residual.numel():
        launcher("mhc.post_bwd", mhc=mhc)(
            aligned_input(d_o.contiguous()).view(-1, mhc, hidden), aligned_input(x).view(-1, hidden),
            aligned_input(residual.contiguous()).view(-1, mhc, hidden), small_input(post_layer_mix).view(-1, mhc),
            small_input(comb_res_mix).view(-1, mhc, mhc), d_x.view(-1, hidden), d_residual.view(-1, mhc, hidden),
            d_post.view(-1, mhc), d_comb.view(-1, mhc, mhc))
    if fuse:
        d_residual._mhc_residual_ptr = residual.data_ptr()  # which view of the storage it belongs to
        setattr(residual.untyped_storage(), STASH, d_residual)
    return d_x, d_residual, d_post, d_comb


class MHCPost(torch.autograd.Function):
    """``apply(x, residual, post_layer_mix, comb_res_mix, out)``: see :func:`mhc_post`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                comb_res_mix: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if out is not None:
            ctx.mark_dirty(out)
        result = mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out)
        ctx.save_for_backward(x, residual, post_layer_mix, comb_res_mix)
        return result

    @staticmethod
    def backward(ctx: Any, d_o: torch.Tensor) -> tuple:
        x, residual, post_layer_mix, comb_res_mix = ctx.saved_tensors
        return (*_backward(x, residual, post_layer_mix, comb_res_mix, d_o, True), None)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Differentiable :func:`mhc_post_fwd` (backward: :func:`mhc_post_bwd` with fused accumulation)."""
    return MHCPost.apply(x, residual, post_layer_mix, comb_res_mix, out)


__all__ = ["MHCPost", "mhc_post", "mhc_post_bwd", "mhc_post_fwd"]
