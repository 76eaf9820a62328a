"""The Engram gate: ``engram_gate_fwd``, ``engram_gate_bwd`` and ``grad_w_reduce``
(``tile_kernels.engram`` 1.0.0 API), each declared by an :class:`~tilebin.ops._spec.OpSpec`.

Every op validates all arguments before touching the GPU (device last) and raises
:class:`tilebin.runtime.ArgumentError` naming the op, the argument, what is supported and the
fix; nothing is written when it raises.  Shapes: ``hidden_states`` ``[num_tokens, hc_mult,
hidden]``; any token count (0 included), any ``hc_mult >= 1``, hidden a multiple of 8 up to
8192; eps, clamp value and the SM count (:func:`tilebin.ops.config.set_num_sms`) are run-time
values, so one cubin per op serves every shape.  ``k`` and ``v`` may be strided views (last dim
contiguous, other strides multiples of 8 elements); everything else must be contiguous.
Outputs are fresh contiguous tensors (``grad_weight_*`` of ``grad_w_reduce`` are updated in
place); launches go on torch's current stream, asynchronously.

Checks: each tensor's dtype and rank and each scalar (the parameters), then today's checks in
today's order (``_gate_checks``, ``_bwd_checks``, ``_reduce_checks``) once per configuration.
What the memo key leaves out (token counts that must agree, strides, data pointers, overlap of
``grad_w_reduce``'s outputs) is tested on every call by a cheap ``per_call`` test (``engram_gate_bwd``:
at the top of its ``run``, one frame less); where it fails, the ordered checks run and raise today's
message, memoized configuration or not.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .._common import TRACING, aligned_input, check_cuda, fail, launcher
from .._spec import Fast, OpSpec, TensorParam
from ..config import get_num_sms
from ._checks import (BF16, FP32, MAX_ELEMENTS, aligned, bool_param, check_contiguous, check_disjoint,
                      check_hidden, check_strided_rows, float_param, rows_ok)

_BWD_KERNEL = "engram.engram_gate_bwd"
_BWD = "engram_gate_bwd"  # the op's name in its messages
_REDUCE_KERNEL = "engram.grad_w_reduce"
_REDUCE = "grad_w_reduce"  # the op's name in its messages
_BF16, _F32 = torch.bfloat16, torch.float32


def _gate_checks(op: str, hidden_states, k, v, weight_fused) -> tuple[int, int, int]:
    """The tensors both gate ops take, in today's order; returns ``(num_tokens, hc_mult, hidden)``."""
    check_contiguous(op, "hidden_states", hidden_states, BF16, ndim=3)
    num_tokens, hc, hidden = hidden_states.shape
    if hc < 1:
        raise fail(op, f"hidden_states has shape {tuple(hidden_states.shape)}; supported: hc_mult >= 1")
    check_hidden(op, "hidden_states", hidden)
    check_strided_rows(op, "k", k, (num_tokens, hc, hidden))
    check_strided_rows(op, "v", v, (num_tokens, hidden))
    check_contiguous(op, "weight_fused", weight_fused, FP32, shape=(hc, hidden))
    return num_tokens, hc, hidden


def _gate_plain(hidden_states, k, v, weight_fused) -> bool:
    """Per call: the facts of :func:`_gate_checks` that the memo key and the spec's ``rows_of`` test
    (the token counts) leave out hold (a stricter test: False sends a call to the ordered checks,
    which raise or pass it)."""
    return (hidden_states.is_contiguous() and weight_fused.is_contiguous()
            and (k.is_contiguous() or rows_ok(k)) and (v.is_contiguous() or rows_ok(v))
            and aligned(hidden_states, k, v, weight_fused) and hidden_states.numel() <= MAX_ELEMENTS)


def _fwd_per_call(op: str, args: tuple) -> None:
    if not _gate_plain(args[0], args[1], args[2], args[3]):
        _gate_checks(op, args[0], args[1], args[2], args[3])


def _fwd_relations(op: str, values: dict) -> None:
    _gate_checks(op, values["hidden_states"], values["k"], values["v"], values["weight_fused"])


def _plan_fwd(values: dict) -> Callable[..., tuple]:
    _, hc, hidden = values["hidden_states"].shape
    eps, clamp_value, save = values["eps"], values["clamp_value"], values["save_for_backward"]
    scalars = (eps, clamp_value, hidden ** -0.5, int(save))
    device = values["hidden_states"].device  # every tensor's device is part of the configuration
    fn = launcher("engram.engram_gate_fwd")
    no_stats = None if save else torch.empty(0, hc, dtype=_F32, device=device)  # read by no kernel

    def run(hidden_states: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_fused: torch.Tensor, *_: Any):
        num_tokens = hidden_states.shape[0]
        output = torch.empty(num_tokens, hc, hidden, dtype=_BF16, device=device)
        if not save:  # [0, hc] statistics: the kernel writes none (nothing to allocate per call)
            if num_tokens:
                fn(hidden_states, k, v, weight_fused, output, no_stats, no_stats, no_stats, no_stats, *scalars)
            return output, None, None, None, None
        # four fp32 [num_tokens, hc] tensors, each its own allocation (as tile_kernels' are)
        dot, gate_score = (torch.empty(num_tokens, hc, dtype=_F32, device=device),
                           torch.empty(num_tokens, hc, dtype=_F32, device=device))
        rstd_x, rstd_k = (torch.empty(num_tokens, hc, dtype=_F32, device=device),
                          torch.empty(num_tokens, hc, dtype=_F32, device=device))
        if num_tokens:
            fn(hidden_states, k, v, weight_fused, output, dot, gate_score, rstd_x, rstd_k, *scalars)
        return output, dot, gate_score, rstd_x, rstd_k

    return run


def _fwd_result(result: Any) -> tuple:
    """engram_gate_fwd's result as the schema's five tensors: the saved ``dot, gate_score, rstd_x,
    rstd_k``, or four distinct empty ``[0, 0]`` tensors when not saved (a saved one is ``[tokens,
    hc_mult >= 1]``; a custom op's outputs may not alias each other)."""
    if result[1] is None:
        return result[0], *(result[0].new_empty(0, 0, dtype=torch.float32) for _ in range(4))
    return result


def _fwd_public(outputs: tuple) -> tuple:
    """The schema's five tensors as the public result (a saved statistic's last size is hc_mult >= 1:
    read alone, a symbolic token count is never compared)."""
    return outputs if outputs[1].shape[-1] else (outputs[0], None, None, None, None)


def _bf16(name: str, ndim: int, rows_of: Optional[str] = "hidden_states", fast: Optional[Fast] = None) -> TensorParam:
    """A bf16 tensor whose token count is hidden_states' (tested per call by the spec)."""
    return TensorParam(name, BF16, ndim, rows_of=rows_of, fast=fast)


ENGRAM_GATE_FWD = OpSpec(
    "engram_gate_fwd",
    (_bf16("hidden_states", 3, None), _bf16("k", 3), _bf16("v", 2),
     TensorParam("weight_fused", FP32, 2, rows_vary=False), float_param("eps"), float_param("clamp_value"),
     bool_param("save_for_backward", "True")),
    "(Tensor, Tensor, Tensor, Tensor, Tensor)", _plan_fwd, relations=_fwd_relations, per_call=_fwd_per_call,
    torch=dict(result_to_schema=_fwd_result, result_to_public=_fwd_public))


def engram_gate_fwd(hidden_states: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_fused: torch.Tensor,
                    eps: float, clamp_value: float, save_for_backward: bool = True):
    """Engram gate forward: ``output = x + sigmoid(signed_sqrt(s)) * v`` per token and head.

    hidden_states, k: bf16 ``[num_tokens, hc_mult, hidden]``; v: bf16 ``[num_tokens, hidden]``;
    weight_fused: fp32 ``[hc_mult, hidden]`` (:func:`fused_weight`); eps, clamp_value: floats
    ``>= 0``.  With ``d = sum(x * weight_fused * k)``, ``rstd_x = rsqrt(mean(x**2) + eps)``,
    ``rstd_k`` likewise and ``s = d * rstd_x * rstd_k / sqrt(hidden)``: gate =
    ``sigmoid(sign(s) * sqrt(max(|s|, clamp_value)))``.  Returns ``(output, dot, gate_score,
    rstd_x, rstd_k)``: output bf16 like hidden_states; with ``save_for_backward`` the raw ``d``,
    the gate and both rstds as fp32 ``[num_tokens, hc_mult]`` (four allocations), else four
    ``None``.  fp32 math; the sums' order differs from torch's (tolerance, not bit-exact).
    """
    return ENGRAM_GATE_FWD.call(hidden_states, k, v, weight_fused, eps, clamp_value, save_for_backward)


_STATS = ("dot", "gate_score", "rstd_x", "rstd_k")
_BWD_TENSORS = ("grad_out", "hidden_states", "k", "v", "weight_fused", *_STATS)


def _bwd_checks(op: str, grad_out, hidden_states, k, v, weight_fused, *stats) -> None:
    """Every tensor check of :func:`engram_gate_bwd` but the device, in today's order."""
    num_tokens, hc, hidden = _gate_checks(op, hidden_states, k, v, weight_fused)
    check_contiguous(op, "grad_out", grad_out, BF16, shape=(num_tokens, hc, hidden))
    for name, t in zip(_STATS, stats):
        check_contiguous(op, name, t, FP32, shape=(num_tokens, hc), align=4)  # scalar accesses


def _bwd_relations(op: str, values: dict) -> None:
    _bwd_checks(op, *(values[name] for name in _BWD_TENSORS))


def _plan_bwd(values: dict) -> Callable[..., tuple]:
    _, hc, hidden = values["hidden_states"].shape
    scalars = (values["clamp_value"], hidden ** -0.5)
    device = values["hidden_states"].device  # every tensor's device is part of the configuration
    fn = launcher(_BWD_KERNEL)

    def run(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, *_: Any) -> tuple:
        # per call (no separate per_call: one frame less), what the memo key and the spec's rows_of
        # test (the token counts) leave out: contiguity, the element limit and 16-byte aligned pointers,
        # all in one test; where it fails (or with fake tensors), the ordered checks raise today's
        # message or pass the call
        if TRACING.on or not (
                hidden_states.is_contiguous() and weight_fused.is_contiguous() and grad_out.is_contiguous()
                and dot.is_contiguous() and gate_score.is_contiguous() and rstd_x.is_contiguous()
                and rstd_k.is_contiguous() and (k.is_contiguous() or rows_ok(k)) and (v.is_contiguous() or rows_ok(v))
                and hidden_states.numel() <= MAX_ELEMENTS
                and not (hidden_states.data_ptr() | k.data_ptr() | v.data_ptr() | weight_fused.data_ptr()
                         | grad_out.data_ptr() | dot.data_ptr() | gate_score.data_ptr() | rstd_x.data_ptr()
                         | rstd_k.data_ptr()) % 16):
            _bwd_checks(_BWD, grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k)
            # the kernel's contract is 16-byte aligned tensors: a view of the saved statistics that starts
            # inside a buffer (a later chunk of tokens) is copied, never launched misaligned
            if not aligned(dot, gate_score, rstd_x, rstd_k):
                dot, gate_score, rstd_x, rstd_k = (aligned_input(t) for t in (dot, gate_score, rstd_x, rstd_k))
        return fast(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k)

    def fast(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, *_: Any) -> tuple:
        # (a replay whose every tensor the compiled key found contiguous, 16-byte aligned and within the
        # element limit: the spec's Fast; or run above, after its own test)
        n = hidden_states.shape[0]
        grad_x = torch.empty(n, hc, hidden, dtype=_BF16, device=device)
        grad_k = torch.empty(n, hc, hidden, dtype=_BF16, device=device)
        grad_v = torch.empty(n, hidden, dtype=_BF16, device=device)
        grad_w_partial = torch.empty(get_num_sms(device), hc, hidden, dtype=_F32, device=device)
        fn(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k,
           grad_x, grad_k, grad_v, grad_w_partial, *scalars)
        return grad_x, grad_k, grad_v, grad_w_partial

    run.fast = fast
    return run


_FAST = Fast()  # engram_gate_bwd's run.fast: every tensor contiguous and 16-byte aligned (run's own test)
ENGRAM_GATE_BWD = OpSpec(
    "engram_gate_bwd",
    (_bf16("grad_out", 3, fast=_FAST), _bf16("hidden_states", 3, None, Fast(max_numel=MAX_ELEMENTS)),
     _bf16("k", 3, fast=_FAST), _bf16("v", 2, fast=_FAST),
     TensorParam("weight_fused", FP32, 2, rows_vary=False, fast=_FAST),
     *(TensorParam(name, FP32, 2, rows_of="hidden_states", fast=_FAST) for name in _STATS),
     float_param("clamp_value")),
    "(Tensor, Tensor, Tensor, Tensor)", _plan_bwd, relations=_bwd_relations)


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
    return ENGRAM_GATE_BWD.call(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k,
                                clamp_value)


def _reduce_checks(op: str, grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    """Every check of :func:`grad_w_reduce` in today's order, the device and the outputs' overlap last."""
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


def _reduce_relations(op: str, values: dict) -> None:
    _reduce_checks(op, *values.values())


def _plan_reduce(values: dict) -> Callable[..., None]:
    """Per call (no spec per_call: relations run the ordered checks first on a first call), a test
    stricter than :func:`_reduce_checks` (an empty tensor's span counts), where False sends the call to
    them: all five contiguous and 16-byte aligned, the outputs (``gwh``, ``gwe``) overlapping neither
    each other nor an input (byte spans fixed by the configuration: every shape is part of its key);
    then the launch (hc_mult 0: nothing to do)."""
    fn = launcher(_REDUCE_KERNEL) if values["grad_w_partial"].shape[1] else None
    out_bytes = 4 * values["grad_weight_hidden"].numel()  # each output's; each weight has half as many
    gp_bytes, w_bytes = 4 * values["grad_w_partial"].numel(), out_bytes // 2

    def run(gp: torch.Tensor, wh: torch.Tensor, we: torch.Tensor, gwh: torch.Tensor, gwe: torch.Tensor) -> None:
        if not TRACING.on:  # (fake tensors have no memory: a traced call ran every check in relations)
            p0, p1, p2, p3, p4 = gp.data_ptr(), wh.data_ptr(), we.data_ptr(), gwh.data_ptr(), gwe.data_ptr()
            e0, e1, e2, e3, e4 = p0 + gp_bytes, p1 + w_bytes, p2 + w_bytes, p3 + out_bytes, p4 + out_bytes
            if not (gp.is_contiguous() and wh.is_contiguous() and we.is_contiguous() and gwh.is_contiguous()
                    and gwe.is_contiguous() and not (p0 | p1 | p2 | p3 | p4) % 16
                    and (e3 <= p4 or e4 <= p3) and (e3 <= p0 or e0 <= p3) and (e3 <= p1 or e1 <= p3)
                    and (e3 <= p2 or e2 <= p3) and (e4 <= p0 or e0 <= p4) and (e4 <= p1 or e1 <= p4)
                    and (e4 <= p2 or e2 <= p4)):
                _reduce_checks(_REDUCE, gp, wh, we, gwh, gwe)
        if fn is not None:
            fn(gp, wh, we, gwh, gwe)

    return run


def _weight(name: str, dtypes: tuple, mutated: bool = False) -> TensorParam:
    return TensorParam(name, dtypes, 2, mutated=mutated, rows_vary=False)


GRAD_W_REDUCE = OpSpec(
    "grad_w_reduce",
    (TensorParam("grad_w_partial", FP32, 3, rows_vary=False), _weight("weight_hidden", BF16),
     _weight("weight_embed", BF16), _weight("grad_weight_hidden", FP32, True), _weight("grad_weight_embed", FP32, True)),
    "()", _plan_reduce, relations=_reduce_relations,
    schema_args="Tensor grad_w_partial, Tensor weight_hidden, Tensor weight_embed, "
                "Tensor(a!) grad_weight_hidden, Tensor(b!) grad_weight_embed")  # two outputs: (a!) and (b!)


def grad_w_reduce(grad_w_partial: torch.Tensor, weight_hidden: torch.Tensor, weight_embed: torch.Tensor,
                  grad_weight_hidden: torch.Tensor, grad_weight_embed: torch.Tensor) -> None:
    """Sum ``grad_w_partial`` over its first dim into ``s`` and accumulate in place
    ``grad_weight_hidden += s * weight_embed`` and ``grad_weight_embed += s * weight_hidden``.

    grad_w_partial: fp32 ``[num_blocks, hc_mult, hidden]`` (any ``num_blocks``, so any SM count);
    weight_hidden, weight_embed: bf16 ``[hc_mult, hidden]``; grad_weight_hidden,
    grad_weight_embed: fp32 ``[hc_mult, hidden]`` (e.g. a parameter's ``main_grad``), separate
    memory.  All contiguous.  Deterministic fixed-order fp32 sums.
    """
    return GRAD_W_REDUCE.call(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)


SPECS = (ENGRAM_GATE_FWD, ENGRAM_GATE_BWD, GRAD_W_REDUCE)
TORCH_OPS = tuple(spec.torch_op(fn) for spec, fn in zip(SPECS, (engram_gate_fwd, engram_gate_bwd, grad_w_reduce)))


__all__ = ["engram_gate_bwd", "engram_gate_fwd", "grad_w_reduce"]
