"""The Engram gate: ``engram_gate_fwd``, ``engram_gate_bwd`` and ``grad_w_reduce``
(``tile_kernels.engram`` 1.0.0 API).

Every op validates all arguments before touching the GPU (device last) and raises
:class:`tilebin.runtime.ArgumentError` naming the op, the argument, what is supported and the
fix; nothing is written when it raises.  Shapes: ``hidden_states`` ``[num_tokens, hc_mult,
hidden]``; any token count (0 included), any ``hc_mult >= 1``, hidden a multiple of 8 up to
8192; eps, clamp value and the SM count (:func:`tilebin.ops.config.set_num_sms`) are run-time
values, so one cubin per op serves every shape.  ``k`` and ``v`` may be strided views (last dim
contiguous, other strides multiples of 8 elements); everything else must be contiguous.
Outputs are fresh contiguous tensors (``grad_weight_*`` of ``grad_w_reduce`` are updated in
place); launches go on torch's current stream, asynchronously.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.compiler import is_compiling

from .._common import TRACING, aligned_input, check_cuda, fail, launcher
from .._torch import TorchOp, traced
from ..config import get_num_sms
from ._checks import (BF16, FP32, MAX_ELEMENTS, check_bool, check_contiguous, check_disjoint, check_float,
                      check_hidden, check_strided_rows)


_BWD_KERNEL = "engram.engram_gate_bwd"
_REDUCE_KERNEL = "engram.grad_w_reduce"


def _check_gate_inputs(op: str, hidden_states, k, v, weight_fused) -> tuple[int, int, int]:
    """The tensors both gate ops take; returns ``(num_tokens, hc_mult, hidden)``."""
    check_contiguous(op, "hidden_states", hidden_states, BF16, ndim=3)
    num_tokens, hc, hidden = hidden_states.shape
    if hc < 1:
        raise fail(op, f"hidden_states has shape {tuple(hidden_states.shape)}; supported: hc_mult >= 1")
    check_hidden(op, "hidden_states", hidden)
    check_strided_rows(op, "k", k, (num_tokens, hc, hidden))
    check_strided_rows(op, "v", v, (num_tokens, hidden))
    check_contiguous(op, "weight_fused", weight_fused, FP32, shape=(hc, hidden))
    return num_tokens, hc, hidden


def _stats(num_tokens: int, hc: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Four fp32 ``[num_tokens, hc]`` tensors (views of one allocation; empty for 0 tokens)."""
    return torch.empty((4, num_tokens, hc), dtype=torch.float32, device=device).unbind(0)


def engram_gate_fwd(hidden_states: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_fused: torch.Tensor,
                    eps: float, clamp_value: float, save_for_backward: bool = True):
    """Engram gate forward: ``output = x + sigmoid(signed_sqrt(s)) * v`` per token and head.

    hidden_states, k: bf16 ``[num_tokens, hc_mult, hidden]``; v: bf16 ``[num_tokens, hidden]``;
    weight_fused: fp32 ``[hc_mult, hidden]`` (:func:`fused_weight`); eps, clamp_value: floats
    ``>= 0``.  With ``d = sum(x * weight_fused * k)``, ``rstd_x = rsqrt(mean(x**2) + eps)``,
    ``rstd_k`` likewise and ``s = d * rstd_x * rstd_k / sqrt(hidden)``: gate =
    ``sigmoid(sign(s) * sqrt(max(|s|, clamp_value)))``.  Returns ``(output, dot, gate_score,
    rstd_x, rstd_k)``: output bf16 like hidden_states; with ``save_for_backward`` the raw ``d``,
    the gate and both rstds as fp32 ``[num_tokens, hc_mult]`` (views of one buffer), else four
    ``None``.  fp32 math; the sums' order differs from torch's (tolerance, not bit-exact).
    """
    if is_compiling() and not TRACING.on:
        return traced("engram_gate_fwd", hidden_states, k, v, weight_fused, eps, clamp_value, save_for_backward)
    op = "engram_gate_fwd"
    num_tokens, hc, hidden = _check_gate_inputs(op, hidden_states, k, v, weight_fused)
    eps = check_float(op, "eps", eps)
    clamp_value = check_float(op, "clamp_value", clamp_value)
    save = check_bool(op, "save_for_backward", save_for_backward)
    check_cuda(op, hidden_states=hidden_states, k=k, v=v, weight_fused=weight_fused)
    device = hidden_states.device
    output = torch.empty((num_tokens, hc, hidden), dtype=torch.bfloat16, device=device)
    stats = _stats(num_tokens if save else 0, hc, device)  # [0, hc]: the kernel writes no statistics
    if num_tokens:
        launcher("engram.engram_gate_fwd")(hidden_states, k, v, weight_fused, output, *stats,
                                            eps, clamp_value, hidden ** -0.5, int(save))
    return (output, *stats) if save else (output, None, None, None, None)


def engram_gate_bwd(grad_out: torch.Tensor, hidden_states: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    weight_fused: torch.Tensor, dot: torch.Tensor, gate_score: torch.Tensor, rstd_x: torch.Tensor,
                    rstd_k: torch.Tensor, clamp_value: float):
    """Gradients of :func:`engram_gate_fwd` given ``grad_out`` (bf16, contiguous, like hidden_states).

    dot, gate_score, rstd_x, rstd_k: the forward's saved fp32 ``[num_tokens, hc_mult]`` tensors
    (contiguous); the other tensors as in the forward.  Returns ``(grad_hidden_states, grad_k,
    grad_v, grad_w_partial)``: bf16 gradients (contiguous, of hidden_states'/k's/v's shapes) and
    fp32 ``[num_sms, hc_mult, hidden]`` partial sums of the fused weight's gradient (one row per
    token range, zeros where a range is empty) for :func:`grad_w_reduce`.  ``num_sms`` is
    :func:`tilebin.ops.config.get_num_sms`; the results do not depend on it beyond summation order.
    """
    if is_compiling() and not TRACING.on:
        return traced("engram_gate_bwd", grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x,
                      rstd_k, clamp_value)
    return _gate_bwd(_BWD_KERNEL, grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k,
                     clamp_value)


def _gate_bwd(kernel: str, grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value):
    """:func:`engram_gate_bwd`'s checks and launch of ``kernel``."""
    op = "engram_gate_bwd"
    num_tokens, hc, hidden = _check_gate_inputs(op, hidden_states, k, v, weight_fused)
    check_contiguous(op, "grad_out", grad_out, BF16, shape=(num_tokens, hc, hidden))
    for name, t in (("dot", dot), ("gate_score", gate_score), ("rstd_x", rstd_x), ("rstd_k", rstd_k)):
        check_contiguous(op, name, t, FP32, shape=(num_tokens, hc), align=4)  # scalar accesses
    clamp_value = check_float(op, "clamp_value", clamp_value)
    check_cuda(op, grad_out=grad_out, hidden_states=hidden_states, k=k, v=v, weight_fused=weight_fused, dot=dot,
               gate_score=gate_score, rstd_x=rstd_x, rstd_k=rstd_k)
    # the kernel's contract is 16-byte aligned tensors: a view of the saved statistics that starts
    # inside a buffer (a later chunk of tokens) is copied, never launched misaligned
    dot, gate_score, rstd_x, rstd_k = (aligned_input(t) for t in (dot, gate_score, rstd_x, rstd_k))
    device = hidden_states.device
    grad_x = torch.empty((num_tokens, hc, hidden), dtype=torch.bfloat16, device=device)
    grad_k = torch.empty((num_tokens, hc, hidden), dtype=torch.bfloat16, device=device)
    grad_v = torch.empty((num_tokens, hidden), dtype=torch.bfloat16, device=device)
    grad_w_partial = torch.empty((get_num_sms(device), hc, hidden), dtype=torch.float32, device=device)
    launcher(kernel)(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k,
                     grad_x, grad_k, grad_v, grad_w_partial, clamp_value, hidden ** -0.5)
    return grad_x, grad_k, grad_v, grad_w_partial


def grad_w_reduce(grad_w_partial: torch.Tensor, weight_hidden: torch.Tensor, weight_embed: torch.Tensor,
                  grad_weight_hidden: torch.Tensor, grad_weight_embed: torch.Tensor) -> None:
    """Sum ``grad_w_partial`` over its first dim into ``s`` and accumulate in place
    ``grad_weight_hidden += s * weight_embed`` and ``grad_weight_embed += s * weight_hidden``.

    grad_w_partial: fp32 ``[num_blocks, hc_mult, hidden]`` (any ``num_blocks``, so any SM count);
    weight_hidden, weight_embed: bf16 ``[hc_mult, hidden]``; grad_weight_hidden,
    grad_weight_embed: fp32 ``[hc_mult, hidden]`` (e.g. a parameter's ``main_grad``), separate
    memory.  All contiguous.  Deterministic fixed-order fp32 sums.
    """
    if is_compiling() and not TRACING.on:
        return traced("grad_w_reduce", grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden,
                      grad_weight_embed)
    if not _reduce_args_plain(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
        _check_reduce_args(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
    hc = grad_w_partial.shape[1]
    if hc:
        launcher(_REDUCE_KERNEL)(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden,
                                 grad_weight_embed)


def _check_reduce_args(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    """Every check of :func:`grad_w_reduce`, in order; raises the first failure."""
    op = "grad_w_reduce"
    check_contiguous(op, "grad_w_partial", grad_w_partial, FP32, ndim=3)
    _, hc, hidden = grad_w_partial.shape
    check_hidden(op, "grad_w_partial", hidden, None)
    check_contiguous(op, "weight_hidden", weight_hidden, BF16, shape=(hc, hidden))
    check_contiguous(op, "weight_embed", weight_embed, BF16, shape=(hc, hidden))
    check_contiguous(op, "grad_weight_hidden", grad_weight_hidden, FP32, shape=(hc, hidden))
    check_contiguous(op, "grad_weight_embed", grad_weight_embed, FP32, shape=(hc, hidden))
    check_cuda(op, grad_w_partial=grad_w_partial, weight_hidden=weight_hidden, weight_embed=weight_embed,
               grad_weight_hidden=grad_weight_hidden, grad_weight_embed=grad_weight_embed)
    check_disjoint(op, {"grad_weight_hidden": grad_weight_hidden, "grad_weight_embed": grad_weight_embed},
                   {"grad_w_partial": grad_w_partial, "weight_hidden": weight_hidden, "weight_embed": weight_embed})


_F32, _BF16 = torch.float32, torch.bfloat16


def _reduce_args_plain(gp, wh, we, gwh, gwe) -> bool:
    """True only for arguments :func:`_check_reduce_args` accepts, in the common shape: all five
    non-empty, contiguous, 16-byte aligned, on one CUDA device, outputs disjoint from everything.
    A cheaper predicate than the checks (same facts read once, byte spans from the known shapes,
    no device objects: the host cost of the op was mostly its checks); anything else (including
    a call that must fail) returns False and goes through the checks, which raise the same error
    as ever.  Stricter than the checks is safe: a False only costs the slow path."""
    tensor = torch.Tensor
    if TRACING.on:  # fake tensors have no addresses: the checks judge them
        return False
    if not (isinstance(gp, tensor) and isinstance(wh, tensor) and isinstance(we, tensor)
            and isinstance(gwh, tensor) and isinstance(gwe, tensor)):
        return False
    if gp.dtype is not _F32 or gp.dim() != 3 or not gp.is_cuda:
        return False
    nb, hc, hidden = gp.shape
    a = hc * hidden
    if not (nb > 0 and hc > 0 and 0 < hidden and hidden % 8 == 0 and nb * a <= MAX_ELEMENTS):
        return False
    shape, dev = (hc, hidden), gp.get_device()
    if not (wh.dtype is _BF16 and we.dtype is _BF16 and gwh.dtype is _F32 and gwe.dtype is _F32
            and wh.shape == shape and we.shape == shape and gwh.shape == shape and gwe.shape == shape
            and gp.is_contiguous() and wh.is_contiguous() and we.is_contiguous()
            and gwh.is_contiguous() and gwe.is_contiguous()
            and wh.is_cuda and we.is_cuda and gwh.is_cuda and gwe.is_cuda
            and wh.get_device() == dev and we.get_device() == dev
            and gwh.get_device() == dev and gwe.get_device() == dev):
        return False
    p0, p1, p2, p3, p4 = gp.data_ptr(), wh.data_ptr(), we.data_ptr(), gwh.data_ptr(), gwe.data_ptr()
    if (p0 | p1 | p2 | p3 | p4) % 16:
        return False
    e0, e1, e2, e3, e4 = p0 + 4 * nb * a, p1 + 2 * a, p2 + 2 * a, p3 + 4 * a, p4 + 4 * a
    # the outputs (p3, p4) overlap neither each other nor an input
    return ((e3 <= p4 or e4 <= p3) and (e3 <= p0 or e0 <= p3) and (e3 <= p1 or e1 <= p3) and (e3 <= p2 or e2 <= p3)
            and (e4 <= p0 or e0 <= p4) and (e4 <= p1 or e1 <= p4) and (e4 <= p2 or e2 <= p4))


def _fwd_result(result: Any) -> tuple:
    """engram_gate_fwd's result as the schema's ``(out, stats)``: the saved ``dot, gate_score,
    rstd_x, rstd_k`` are rows of one ``[4, tokens, hc]`` tensor (a custom op's outputs may not
    alias each other), empty ``[4, 0, 0]`` when not saved."""
    if result[1] is None:
        return result[0], result[0].new_empty((4, 0, 0), dtype=torch.float32)
    dot = result[1]  # the first of four contiguous [tokens, hc] rows of one allocation
    tokens, hc = dot.shape
    return result[0], dot.as_strided((4, tokens, hc), (tokens * hc, hc, 1), dot.storage_offset())


def _fwd_public(outputs: tuple) -> tuple:
    out, stats = outputs
    return (out, *stats.unbind(0)) if stats.shape[1:] != (0, 0) else (out, None, None, None, None)


TORCH_OPS = (
    TorchOp("engram_gate_fwd", "(Tensor hidden_states, Tensor k, Tensor v, Tensor weight_fused, float eps, "
                               "float clamp_value, bool save_for_backward=True) "
                               "-> (Tensor, Tensor)",
            engram_gate_fwd, result_to_schema=_fwd_result, result_to_public=_fwd_public),
    TorchOp("engram_gate_bwd", "(Tensor grad_out, Tensor hidden_states, Tensor k, Tensor v, Tensor weight_fused, "
                               "Tensor dot, Tensor gate_score, Tensor rstd_x, Tensor rstd_k, float clamp_value) "
                               "-> (Tensor, Tensor, Tensor, Tensor)", engram_gate_bwd),
    TorchOp("grad_w_reduce", "(Tensor grad_w_partial, Tensor weight_hidden, Tensor weight_embed, "
                             "Tensor(a!) grad_weight_hidden, Tensor(b!) grad_weight_embed) -> ()", grad_w_reduce),
)


__all__ = ["engram_gate_bwd", "engram_gate_fwd", "grad_w_reduce"]
