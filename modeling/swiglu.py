"""``tilebin.modeling.swiglu``: the fused SwiGLU + e4m3 forward and its fused backward as one
autograd Function, ``SwigluPerTokenCastFn`` / ``swiglu_per_token_cast`` (tile_kernels ships the two
ops and no autograd Function or modeling module for them: this one is tilebin's).

Forward (:func:`tilebin.ops.quant.swiglu_forward_and_per_token_cast`): ``act = silu(gate) * up``
of ``x = [gate, up]`` (bf16/fp32 ``[rows, 2 * h]``; gate clamped to ``<= c`` and up to
``[-c, c]`` with ``swiglu_clamp_value=c``), times the row's routing weight
``topk_weights.flat[pos_to_token_topk[row]]`` (0 for a position < 0: a padding row) when routed,
cast to e4m3 with per-token scales: ``(out, out_sf)`` exactly as the op returns them.  When a
gradient is wanted it also saves ``x`` cast to e4m3 (:func:`tilebin.ops.quant.per_token_cast`,
one fp32 scale per ``saved_num_per_channels`` = 32 or 128 channels): the backward reads that
copy (the backward op takes x in e4m3, as tile_kernels' does), so the gradients are those at the
dequantized x.

Backward (:func:`tilebin.ops.quant.swiglu_backward_and_per_token_cast`): from the gradient of
the weighted activation ``act * w`` (bf16 ``[rows, h]``), ``x``'s gradient (the op's bf16
``x_grad``; autograd casts it to x's dtype) and ``topk_weights``' (the op's fp32 ``weight_grad``,
one row sum per routed (token, topk) slot).  The op's other outputs (the recomputed ``act * w``
and the e4m3 copy of ``x_grad``) are dropped: autograd carries one gradient per input.

The gradient's way in: autograd casts every gradient to its tensor's dtype, so an e4m3 ``out``
cannot carry a bf16 gradient (it would arrive rounded to e4m3).  The Function therefore returns a
third output, ``grad_handle``: bf16 ``[rows, h]``, zeros with no storage of its own (strides 0),
standing for the activation in the graph.  ``out`` and ``out_sf`` are not differentiable; the
consumer of ``(out, out_sf)`` (an e4m3 GEMM's autograd Function) takes ``grad_handle`` as an input
too and returns the activation's gradient for it::

    out, out_sf, handle = swiglu_per_token_cast(h, "e4m3", 128, topk_weights, ptt, ttp)
    y = Fp8LinearFn.apply(out, out_sf, handle, w2)   # its backward returns d(loss)/d(act * w) for handle

Routing: ``topk_weights`` (fp32 ``[tokens, topk]``), ``pos_to_token_topk`` (int32 ``[rows]``) and
``token_topk_to_pos`` (int32 ``[tokens, topk]``, contiguous) come together (from
``tilebin.ops.moe.get_fused_mapping``: each the other's inverse, which is not checked: it would
need a device sync), or not at all (plain SwiGLU: every row weighs 1).  Every argument is checked
before any GPU work of the forward (``ArgumentError`` naming the op), including what only the
backward reads.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.autograd.function import once_differentiable

from tilebin.ops._common import check_tensor, fail
from tilebin.ops.quant import per_token_cast, swiglu_backward_and_per_token_cast, swiglu_forward_and_per_token_cast

_OP = "swiglu_per_token_cast"
SAVED_NUM_PER_CHANNELS = (32, 128)


def _check(x: Any, topk_weights: Any, pos_to_token_topk: Any, token_topk_to_pos: Any, saved: Any) -> None:
    """What the forward op does not check but the backward op needs (the rest: the forward op)."""
    if isinstance(saved, bool) or not isinstance(saved, int) or saved not in SAVED_NUM_PER_CHANNELS:
        raise fail(_OP, f"saved_num_per_channels={saved!r} is not supported; supported: 32, 128")
    routing = (topk_weights, pos_to_token_topk, token_topk_to_pos)
    if any(t is None for t in routing) and any(t is not None for t in routing):
        names = ("topk_weights", "pos_to_token_topk", "token_topk_to_pos")
        given = [name for name, t in zip(names, routing) if t is not None]
        raise fail(_OP, f"got {', '.join(given)} only; the routing needs topk_weights, pos_to_token_topk and "
                        "token_topk_to_pos together (or none of them for a plain SwiGLU)")
    width = x.size(1) if isinstance(x, torch.Tensor) and x.dim() == 2 else 0
    if width and not width % 128 and width % (2 * saved):  # (other widths: the forward op's own refusal)
        raise fail(_OP, f"x has {width} columns; the saved e4m3 copy of x needs hidden = x.shape[1] // 2 a "
                        f"multiple of saved_num_per_channels={saved}: pass saved_num_per_channels=32")
    if token_topk_to_pos is None:
        return
    check_tensor(_OP, "token_topk_to_pos", token_topk_to_pos, (torch.int32,), 2)
    if isinstance(topk_weights, torch.Tensor) and topk_weights.shape != token_topk_to_pos.shape:
        raise fail(_OP, f"token_topk_to_pos has shape {tuple(token_topk_to_pos.shape)}; it must match topk_weights "
                        f"{tuple(topk_weights.shape)} ([num_tokens, num_topk])")
    if not token_topk_to_pos.is_contiguous():
        raise fail(_OP, f"token_topk_to_pos must be contiguous (got strides {tuple(token_topk_to_pos.stride())}); "
                        "pass token_topk_to_pos.contiguous()")
    if isinstance(x, torch.Tensor) and token_topk_to_pos.device != x.device:
        raise fail(_OP, f"token_topk_to_pos is on {token_topk_to_pos.device} but x is on {x.device}; "
                        "put every tensor on one GPU")


def _plain_routing(rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights and maps of an unrouted SwiGLU for the backward op: row r is slot (r, 0), weight 1."""
    pos = torch.arange(rows, dtype=torch.int32, device=device)
    return torch.ones((rows, 1), dtype=torch.float32, device=device), pos, pos.view(rows, 1)


class SwigluPerTokenCastFn(torch.autograd.Function):
    """``apply(x, topk_weights, pos_to_token_topk, token_topk_to_pos, clamped_count, options)`` with
    ``options = (fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
    swiglu_clamp_value, sf_clamp_min, saved_num_per_channels, grad_enabled)``; returns ``(out, out_sf,
    grad_handle)`` (see the module docstring; :func:`swiglu_per_token_cast` spells the arguments out).
    ``grad_enabled``: ``torch.is_grad_enabled()`` at the call (forward always runs without grad mode,
    and ``needs_input_grad`` does not say whether a graph is recorded): False saves nothing."""

    @staticmethod
    def forward(ctx, x, topk_weights, pos_to_token_topk, token_topk_to_pos, clamped_count, options):
        fmt, npc, col, round_sf, packed, clamp, sf_min, saved, grad_enabled = options
        _check(x, topk_weights, pos_to_token_topk, token_topk_to_pos, saved)
        out, out_sf = swiglu_forward_and_per_token_cast(x, fmt, npc, pos_to_token_topk, topk_weights, None, col,
                                                        round_sf, packed, clamp, clamped_count, sf_min)
        rows, hidden = x.shape[0], x.shape[1] // 2
        if grad_enabled and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            data, sf = per_token_cast(x, "e4m3", saved)
            ctx.save_for_backward(data, sf, topk_weights, pos_to_token_topk, token_topk_to_pos)
            ctx.backward_options = (saved, round_sf, clamp)
        handle = torch.empty_strided((rows, hidden), (0, 0), dtype=torch.bfloat16, device=x.device).zero_()
        ctx.mark_non_differentiable(out, out_sf)
        ctx.set_materialize_grads(False)
        return out, out_sf, handle

    @staticmethod
    @once_differentiable  # the fused backward is not differentiable itself
    def backward(ctx, grad_out, grad_out_sf, grad_handle):
        if grad_handle is None:  # the activation was not used on the way to the loss
            return None, None, None, None, None, None
        data, sf, topk_weights, pos_to_token_topk, token_topk_to_pos = ctx.saved_tensors
        saved, round_sf, clamp = ctx.backward_options
        weights, maps = topk_weights, (pos_to_token_topk, token_topk_to_pos)
        if weights is None:
            weights, *maps = _plain_routing(data.shape[0], data.device)
        # autograd hands over a bf16 [rows, h] gradient (the handle's), possibly strided (e.g. expanded)
        _, _, x_grad, weight_grad = swiglu_backward_and_per_token_cast(
            (data, sf), grad_handle.contiguous(), weights, *maps, saved, round_sf, clamp)
        return (x_grad if ctx.needs_input_grad[0] else None,
                weight_grad if topk_weights is not None and ctx.needs_input_grad[1] else None,
                None, None, None, None)


def swiglu_per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    topk_weights: Optional[torch.Tensor] = None,
    pos_to_token_topk: Optional[torch.Tensor] = None,
    token_topk_to_pos: Optional[torch.Tensor] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    swiglu_clamp_value: Optional[float] = None,
    clamped_count: Optional[torch.Tensor] = None,
    sf_clamp_min: Optional[float] = None,
    saved_num_per_channels: int = 128,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``SwigluPerTokenCastFn.apply(...)``: ``(out, out_sf, grad_handle)``, differentiable in ``x``
    and ``topk_weights`` through ``grad_handle`` (see the module docstring).

    The forward op's arguments (``fmt``, ``num_per_channels``, the scale-layout flags, the clamp,
    ``clamped_count``, ``sf_clamp_min``: as :func:`tilebin.ops.quant.swiglu_forward_and_per_token_cast`)
    without ``pos_to_expert`` (padding rows are those whose ``pos_to_token_topk`` is negative), plus
    ``token_topk_to_pos`` for the backward and ``saved_num_per_channels`` (32 or 128; the hidden size
    ``x.shape[1] // 2`` must be a multiple of it): the granularity of the e4m3 copy of x saved for it.
    """
    options = (fmt, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value,
               sf_clamp_min, saved_num_per_channels, torch.is_grad_enabled())
    return SwigluPerTokenCastFn.apply(x, topk_weights, pos_to_token_topk, token_topk_to_pos, clamped_count, options)


__all__ = ["SAVED_NUM_PER_CHANNELS", "SwigluPerTokenCastFn", "swiglu_per_token_cast"]
