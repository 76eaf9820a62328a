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
from torch.compiler import is_compiling

from tilebin.ops._common import aligned_input, fail, launcher
from tilebin.ops._spec import FlagParam, OpSpec

from ._rows import (BF16, FP32, MAX_ELEMENTS, OUT, STASH, Rows, Streams, apply, call_out, check_contiguous,
                    check_hidden, check_mhc, check_out, check_shape, check_size, ordered, out_spec, small_input,
                    torch_ops)


def _check(op: str, x: Any, residual: Any, post_layer_mix: Any, comb_res_mix: Any, out: Any = None,
           d_o: Any = None, fuse: Any = None) -> None:
    """Every check but the dtypes and the device, in today's order (``d_o``: the backward's)."""
    if residual.dim() < 2:
        raise fail(op, f"residual must be [..., mhc_mult, hidden], got shape {tuple(residual.shape)}")
    *lead, mhc, hidden = residual.shape
    check_mhc(op, "mhc_mult (residual.shape[-2])", mhc)
    check_hidden(op, "residual", residual)
    check_size(op, "residual", residual)
    check_shape(op, "x", x, (*lead, hidden), "residual without its mhc_mult dim")
    check_contiguous(op, "x", x)
    check_shape(op, "post_layer_mix", post_layer_mix, (*lead, mhc, 1), "residual's leading dims and mhc_mult, then 1")
    check_shape(op, "comb_res_mix", comb_res_mix, (*lead, mhc, mhc), "residual's leading dims, then mhc_mult twice")
    if out is not None:
        check_out(op, out, tuple(residual.shape), torch.bfloat16, residual.device,
                  {"x": x, "residual": residual, "post_layer_mix": post_layer_mix, "comb_res_mix": comb_res_mix})
    if d_o is not None:
        check_shape(op, "d_o", d_o, tuple(residual.shape), "the forward's output shape")


def _plain(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
           *rest: Any) -> bool:
    """The token dims agree, x is contiguous, residual within int32 indexing (the key holds the rest)."""
    lead = residual.shape[:-2]
    return (x.shape[:-1] == lead and post_layer_mix.shape[:-2] == lead and comb_res_mix.shape[:-2] == lead
            and (len(rest) < 2 or rest[0].shape == residual.shape) and x.is_contiguous()
            and residual.numel() <= MAX_ELEMENTS)


def _inputs(x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> tuple:
    """The kernels' views of the four inputs: ``[T, H]``, ``[T, M, H]``, ``[T, M]``, ``[T, M, M]``, aligned."""
    mhc, hidden = residual.shape[-2:]
    return (aligned_input(x).view(-1, hidden), aligned_input(residual.contiguous()).view(-1, mhc, hidden),
            small_input(post).view(-1, mhc), small_input(comb).view(-1, mhc, mhc))


def _plan_fwd(values: dict):
    mhc, hidden = values["residual"].shape[-2:]
    fn = launcher("mhc.post_fwd", mhc=mhc)

    def run(x, residual, post_layer_mix, comb_res_mix, out):
        if out is None:
            out = torch.empty(residual.shape, dtype=torch.bfloat16, device=residual.device)
        if out.numel():
            fn(*_inputs(x, residual, post_layer_mix, comb_res_mix), out.view(-1, mhc, hidden))
        return out

    return run


def _plan_bwd(values: dict):
    mhc, hidden = values["residual"].shape[-2:]
    fn = launcher("mhc.post_bwd", mhc=mhc)

    def run(x, residual, post_layer_mix, comb_res_mix, d_o, _):
        d_x, d_residual, d_post, d_comb = (torch.empty(t.shape, dtype=t.dtype, device=t.device)
                                           for t in (x, residual, post_layer_mix, comb_res_mix))
        if d_residual.numel():
            x2, r3, p2, c3 = _inputs(x, residual, post_layer_mix, comb_res_mix)
            fn(aligned_input(d_o.contiguous()).view(-1, mhc, hidden), x2, r3, p2, c3, d_x.view(-1, hidden),
               d_residual.view(-1, mhc, hidden), d_post.view(-1, mhc), d_comb.view(-1, mhc, mhc))
        return d_x, d_residual, d_post, d_comb

    return run


_INPUTS = (Rows("x", BF16), Streams("residual", BF16), Streams("post_layer_mix", FP32),
           Streams("comb_res_mix", FP32))
POST_FWD = out_spec("mhc_post_fwd", (*_INPUTS, OUT), "Tensor", _plan_fwd, **ordered(_check, _plain))
POST_BWD = OpSpec("mhc_post_bwd", (*_INPUTS, Streams("d_o", BF16), FlagParam("fuse_grad_acc", "True")),
                  "(Tensor, Tensor, Tensor, Tensor)", _plan_bwd,
                  **ordered(lambda op, x, r, p, c, d_o, fuse: _check(op, x, r, p, c, None, d_o), _plain))


def mhc_post_fwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """The merged residual ``[..., M, H]`` (bf16; see the module docstring), into ``out`` when given."""
    return call_out(POST_FWD, x, residual, post_layer_mix, comb_res_mix, out)


def mhc_post_bwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                 d_o: torch.Tensor, fuse_grad_acc: bool = True) -> tuple[torch.Tensor, ...]:
    """``(d_x, d_residual, d_post_layer_mix, d_comb_res_mix)`` of :func:`mhc_post_fwd` given ``d_o``
    (bf16 like the output; any strides).  ``fuse_grad_acc``: also leave ``d_residual`` on the
    residual's storage (``grad_from_mhc_post``) for the pre ops of the same residual (eager only:
    under torch.compile every gradient is returned, see ``_rows.stash_of``)."""
    grads = POST_BWD(x, residual, post_layer_mix, comb_res_mix, d_o, fuse_grad_acc)
    if fuse_grad_acc and not is_compiling():
        grads[1]._mhc_residual_ptr = residual.data_ptr()  # which view of the storage it belongs to
        setattr(residual.untyped_storage(), STASH, grads[1])
    return grads


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
        return (*mhc_post_bwd(*ctx.saved_tensors, d_o, True), None)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Differentiable :func:`mhc_post_fwd` (backward: :func:`mhc_post_bwd` with fused accumulation)."""
    return apply(MHCPost, POST_FWD, x, residual, post_layer_mix, comb_res_mix, out)


SPECS = (POST_FWD, POST_BWD)
TORCH_OPS = torch_ops(*SPECS)

__all__ = ["MHCPost", "mhc_post", "mhc_post_bwd", "mhc_post_fwd"]
