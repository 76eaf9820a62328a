"""Argument checks of the SwiGLU ops (``_swiglu``): each raises an ArgumentError naming the op, the
argument, the value received and the fix (``ops._common.fail``).  No GPU work.

Per op: the checks of single parameters (its ``OpSpec`` params), the per-call checks (``*_per_call``:
what the memo key leaves out -- row counts, contiguity, alignment -- run on every call, in the order
the op has always checked them) and the checks between parameters that the key decides
(``fwd_layout``).  The device check stays in ``_swiglu`` (tests stub it there).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from tilebin.runtime._record import record

from .._common import SOLE_GPU, TRACING, check_aligned, check_float32, check_tensor, fail, ptr
from .._spec import IntParam, Param, TensorParam
from ._sf import SfLayout, check_fmt, output_layout

GROUP = 128  # channels per scale of the grouped per-token forward
FWD_HIDDEN_ALIGN = 64


def check_float(op: str, name: str, value: Any, default: float) -> float:
    """``value`` as a float (``default`` when None); real numbers only, NaN refused."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise fail(op, f"{name} must be a float or None, got {type(value).__name__} {value!r}")
    return check_float32(op, name, value)  # beyond float32's range: +-inf, as the kernel's float32 holds it


def check_contiguous(op: str, name: str, t: torch.Tensor, align: int = 16) -> None:
    if t.is_contiguous() and t.numel() and not ptr(t) % align:  # the common case (an empty tensor's strides:
        return                                                   # check_aligned's rule, below)
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (got strides {tuple(t.stride())} for shape {tuple(t.shape)}); "
                       f"pass {name}.contiguous()")
    check_aligned(op, name, t, align)


def check_rows(op: str, name: str, t: torch.Tensor, rows: int) -> None:
    """A 1-D index tensor (dtype and rank checked already): one entry per row, contiguous, 4-byte aligned."""
    if t.size(0) != rows:
        raise fail(op, f"{name} has {t.size(0)} entries; it needs one per row of x ({rows})")
    check_contiguous(op, name, t, 4)


def weights_key(w: Any) -> Any:
    """topk_weights' part of the key: None, or dtype, device and rank (every other check is per call;
    AttributeError for a non-tensor, which is ignored without pos_to_token_topk: the checked path)."""
    return None if w is None else (w.dtype, w.is_cuda if SOLE_GPU.on else w.device, len(w.shape))


def e4m3_only(op: str, fmt: Any) -> str:
    return check_fmt(op, fmt, ("e4m3",))


def clamp_value(op: str, value: Any) -> float:
    return check_float(op, "swiglu_clamp_value", value, float("inf"))


def sf_clamp_min(op: str, value: Any) -> float:
    return check_float(op, "sf_clamp_min", value, 1e-4)


@record
class IntChoice(IntParam):
    """An int parameter that takes only ``allowed`` (bools and other types refused; None: any value
    here, checked in the op's relations), keyed as an IntParam: type and value, inline in the key."""

    allowed: Optional[tuple] = None

    def check(self, op: str, value: Any) -> Any:
        allowed = self.allowed
        if allowed is not None and (isinstance(value, bool) or not isinstance(value, int) or value not in allowed):
            raise fail(op, f"{self.name}={value!r} is not supported; supported: {', '.join(map(str, allowed))}")
        return value


# ----------------------------------------------------------------------------- per-token forward
def fwd_per_call(op: str, args: tuple) -> None:
    """x's contiguity and alignment; each given index tensor has one entry per row; the weights
    (read only through ``pos_to_token_topk``) and ``clamped_count`` as the kernel takes them."""
    x, pos_to_token_topk, pos_to_expert, clamped_count = args[0], args[3], args[5], args[10]
    if not x.is_contiguous() or not x.numel() or ptr(x) % 16:  # check_contiguous's common case, inline
        check_contiguous(op, "x", x)
    if pos_to_token_topk is not None:
        check_rows(op, "pos_to_token_topk", pos_to_token_topk, x.shape[0])
        topk_weights = args[4]
        if topk_weights is None:
            raise fail(op, "pos_to_token_topk needs topk_weights (float32 [num_tokens, num_topk])")
        check_tensor(op, "topk_weights", topk_weights, (torch.float32,), 2)
        check_contiguous(op, "topk_weights", topk_weights, 4)
    if pos_to_expert is not None:
        check_rows(op, "pos_to_expert", pos_to_expert, x.shape[0])
    if clamped_count is not None:  # (its parameter checks nothing: the op asks for a clamp first)
        if args[9] is None:
            raise fail(op, "clamped_count needs swiglu_clamp_value (there is nothing to count without a clamp)")
        check_tensor(op, "clamped_count", clamped_count, (torch.int64,), 1)
        if clamped_count.size(0) != 3:
            raise fail(op, f"clamped_count has {clamped_count.size(0)} entries; it needs 3 (gate > c, up > c, up < -c)")
        check_contiguous(op, "clamped_count", clamped_count, 16)  # written in place: never copied


def fwd_layout(op: str, values: dict) -> tuple[int, str, SfLayout]:
    """``(hidden, the kernel's sf kind, the output layout)`` of a forward call's checked values:
    x's width is ``2 * hidden``, ``hidden % 64 == 0``; ``num_per_channels`` is 128 or hidden."""
    width = values["x"].shape[1]
    if width == 0 or width % (2 * FWD_HIDDEN_ALIGN):
        raise fail(op, f"x has {width} columns; it needs 2 * hidden with hidden % {FWD_HIDDEN_ALIGN} == 0 and "
                       f"hidden > 0 (width a positive multiple of {2 * FWD_HIDDEN_ALIGN}): pad the hidden dimension")
    hidden = width // 2
    npc = values["num_per_channels"]
    if isinstance(npc, bool) or not isinstance(npc, int) or npc not in (GROUP, hidden):
        raise fail(op, f"num_per_channels={npc!r} is not supported; supported: 128, or hidden "
                       f"(= x.shape[1] // 2 = {hidden}) for one scale per row")
    col = values["use_tma_aligned_col_major_sf"]
    if npc != GROUP and col:
        raise fail(op, f"use_tma_aligned_col_major_sf=True needs num_per_channels=128 (got {npc}); "
                       "one scale per row is row-major only")
    layout = output_layout(op, (1, npc), col, values["use_packed_ue8m0"], values["round_sf"])
    return hidden, layout.kind if npc == GROUP else "full_row", layout


# -------------------------------------------------------------------------------------- backward
def bwd_pair(op: str, x: Any) -> Any:
    """The backward's forward input ``(data, sf)``: a pair whose data is e4m3, 2-D or 3-D (the rest:
    :func:`bwd_checks`)."""
    if not (isinstance(x, tuple) and len(x) == 2):
        raise fail(op, f"x must be a (data, sf) pair (the quantized forward input), got {type(x).__name__}")
    data = x[0]
    check_tensor(op, "x[0] (data)", data, (torch.float8_e4m3fn,))
    if data.dim() not in (2, 3):
        raise fail(op, f"x[0] (data) must be 2-D or 3-D, got shape {tuple(data.shape)}")
    return x


def bwd_pair_key(x: Any) -> tuple:
    """The pair's part of the memo key: data's and sf's dtype, device, rank and sizes but the first
    (TypeError or AttributeError where x is not a pair of tensors: the checked path)."""
    if type(x) is not tuple or len(x) != 2:
        raise TypeError("not a (data, sf) pair")
    data, sf = x
    d, s = data.shape, sf.shape
    one = SOLE_GPU.on  # a device's key part: is_cuda where the process has one GPU
    return (data.dtype, data.is_cuda if one else data.device, len(d), d[-1] if len(d) == 2 else d[1:], sf.dtype,
            sf.is_cuda if one else sf.device, len(s), s[-1] if len(s) == 2 else s[1:])


class CountParam(TensorParam):
    """The forward's ``clamped_count``: a TensorParam (key, device check, ``Tensor(a!)?`` schema)
    whose checks all run in :func:`fwd_per_call`, after the one between it and the clamp value."""

    def check(self, op: str, value: Any) -> Any:
        return value


def bwd_plain(x: Any, grad_out: Any, weight: Any, ptt: Any, ttp: Any, npc: int) -> bool:
    """Per call, in one expression: every check of :func:`bwd_checks` passes, for non-empty real
    tensors (stricter: an empty one, a fake one or a non-tensor sf is left to the checks)."""
    data, sf = x
    width = data.shape[-1]
    if TRACING.on or not width or width % (2 * npc) or not isinstance(sf, torch.Tensor):
        return False
    rows = data.numel() // width
    return (sf.dtype is torch.float32 and sf.shape == (rows, width // npc) and sf.is_contiguous()
            and grad_out.numel() == rows * (width // 2) and data.is_contiguous() and grad_out.is_contiguous()
            and ttp.is_contiguous() and weight.is_contiguous() and ptt.is_contiguous()
            and weight.shape == ttp.shape and ptt.shape[0] == rows and ttp.numel() > 0 and rows > 0
            and not (data.data_ptr() | grad_out.data_ptr()) % 16
            and not (ttp.data_ptr() | weight.data_ptr() | ptt.data_ptr()) % 4)


def bwd_checks(op: str, x: Any, grad_out: Any, weight: Any, pos_to_token_topk: Any, token_topk_to_pos: Any,
                npc: int) -> None:
    """What varies per call, in the op's order (each raises with its own message): data contiguous
    with ``2 * hidden`` channels, sf fp32 ``[rows, 2 * hidden / npc]`` row-major, grad_out ``rows *
    hidden`` values, the index maps and weights contiguous and matching (their dtypes and ranks
    checked already).  A call for which :func:`bwd_plain` holds passes every one of them."""
    data, sf = x
    check_contiguous(op, "x[0] (data)", data)
    width = data.size(-1)
    if width == 0 or width % (2 * npc):
        raise fail(op, f"x[0] (data) has {width} channels; it needs 2 * hidden with hidden a multiple of "
                       f"num_per_channels={npc}")
    rows = data.numel() // width
    check_tensor(op, "x[1] (sf)", sf, (torch.float32,), 2)
    if sf.shape != (rows, width // npc):
        raise fail(op, f"x[1] (sf) has shape {tuple(sf.shape)}; it must be {(rows, width // npc)} (one scale per "
                       f"row and {npc} channels)")
    if not sf.is_contiguous():
        raise fail(op, f"x[1] (sf) must be row-major contiguous (got strides {tuple(sf.stride())}); column-major "
                       "and packed UE8M0 scales are not supported here: pass sf.contiguous()")
    if grad_out.numel() != rows * (width // 2):
        raise fail(op, f"grad_out has shape {tuple(grad_out.shape)}; it must hold [{rows}, {width // 2}] values "
                       "(one row of hidden values per row of x)")
    check_contiguous(op, "grad_out", grad_out)
    check_contiguous(op, "token_topk_to_pos", token_topk_to_pos, 4)
    if weight.dim() != 2:  # here, not in weight's parameter check: the op checks token_topk_to_pos first
        raise fail(op, f"weight must be 2-D, got shape {tuple(weight.shape)}")
    if weight.shape != token_topk_to_pos.shape:
        raise fail(op, f"weight has shape {tuple(weight.shape)}; it must match token_topk_to_pos "
                       f"{tuple(token_topk_to_pos.shape)} ([num_tokens, num_topk])")
    check_contiguous(op, "weight", weight, 4)
    check_rows(op, "pos_to_token_topk", pos_to_token_topk, rows)


# --------------------------------------------------------------------------- per-channel forward
def channel_per_call(op: str, args: tuple) -> None:
    """x contiguous and aligned, its token count and width multiples of 128."""
    x = args[0]
    if not x.is_contiguous() or not x.numel() or ptr(x) % 16:  # check_contiguous's common case, inline
        check_contiguous(op, "x", x)
    tokens, width = x.shape
    if tokens % 128 or width % 128:
        raise fail(op, f"x has shape {tuple(x.shape)}; both the token count and the width (2 * hidden) must be "
                       "multiples of 128: pad the tokens (and the hidden dimension)")


__all__ = ["GROUP", "CountParam", "IntChoice", "bwd_checks", "bwd_pair",
           "bwd_pair_key", "bwd_plain", "channel_per_call", "check_contiguous", "check_float",
           "check_rows", "clamp_value", "e4m3_only", "fwd_layout", "fwd_per_call", "sf_clamp_min",
           "weights_key"]
