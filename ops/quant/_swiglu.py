"""SwiGLU fused with e4m3 quantization: forward with per-token or per-channel scales, backward.

Same names, signatures, defaults, return values and output layouts as ``tile_kernels.quant``
1.0.0 (``swiglu_forward_and_per_token_cast``, ``swiglu_backward_and_per_token_cast``,
``swiglu_forward_and_per_channel_cast_and_transpose``); the results are bit-identical to
``tile_kernels.torch.swiglu_forward`` / ``swiglu_backward`` followed by ``tile_kernels.torch.cast``
(the backward's ``weight_grad`` is a row sum, equal up to summation order).

Beyond tile_kernels: the per-token forward accepts ``hidden % 64 == 0`` (tile_kernels: 128; a
last group of 64 channels gets its own scale), counts clamps with any scale layout, and writes
rows dropped by ``pos_to_expert`` as zero rows (tile_kernels leaves them unwritten); the
backward also zeroes ``weight_grad`` entries when there are no expanded rows.  Clamp values are
runtime values (no kernel per value).

Every argument is validated before any GPU work (:class:`tilebin.runtime.ArgumentError` naming
the op, the value and the fix; the device is checked last); outputs are allocated here on the
input's device and the kernels run on torch's current stream.  Not checked (it would need a
device sync): the values of the index tensors (``pos_to_token_topk`` must index
``topk_weights`` / ``weight``, as in tile_kernels).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch.compiler import is_compiling

from .._common import TRACING, aligned_input, check_cuda, check_flag, check_tensor, fail, launcher, typed_key
from ..config import get_num_sms
from .._torch import TorchOp, traced, pair_to_public, pair_to_schema
from ._sf import SfLayout, check_fmt, output_layout
from ._swiglu_checks import check_bwd_x, check_contiguous, check_float, check_vector

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_FWD = "quant.swiglu_forward_and_per_token_cast"
_BWD = "quant.swiglu_backward_and_per_token_cast"
_BWD_KERNEL = _BWD
_CHANNEL = "quant.swiglu_forward_and_per_channel_cast_and_transpose"
_E4M3 = torch.float8_e4m3fn
_IN_KEY = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
_GROUP = 128
_FWD_HIDDEN_ALIGN = 64
_UNITS_PER_BLOCK = 512  # per-group forward kernel: 256 threads x 2 units of 8 channels
# resident blocks per SM of the forward kernels (register-limited), used to size their grids
_BLOCKS_PER_SM = {("group", "bfloat16"): 4, ("group", "float32"): 3, ("row", "bfloat16"): 2, ("row", "float32"): 2}
_DUMMIES: dict[tuple, torch.Tensor] = {}
_FAST_MAX = 256  # memoized swiglu_forward_and_per_token_cast configurations


def _dummy(device: torch.device, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A stand-in for an absent optional tensor (never read by the kernel)."""
    key = typed_key(device, dtype, shape)
    if TRACING.on:  # fake tensors: never cached (a fake stand-in must not reach a real launch)
        return torch.zeros(shape, dtype=dtype, device=device)
    t = _DUMMIES.get(key)
    if t is None:
        t = _DUMMIES[key] = torch.zeros(shape, dtype=dtype, device=device)
    return t


# ----------------------------------------------------------------------------- per-token forward
class _Forward:
    """The launch of ``swiglu_forward_and_per_token_cast`` for one validated configuration (dtype,
    hidden, scale kind and layout, round_sf, clamp counting): everything but the row count, the
    pointers and the clamp values.  The checked path builds one and runs it; the memo (``_FAST``)
    keeps it for later calls, so both paths allocate and launch through this one piece of code.
    """

    __slots__ = ("hidden", "layout", "sf_cols", "key", "group", "per_sm", "round_sf", "fn", "dummies")

    def __init__(self, dtype: torch.dtype, hidden: int, kind: str, layout: SfLayout, round_sf: bool,
                 count_clamp: bool) -> None:
        in_key = _IN_KEY[dtype]
        self.hidden = hidden
        self.layout = layout
        # row-major fp32 scales: SfLayout.alloc's tensor, allocated here directly
        self.sf_cols = layout.shape(1, hidden)[1] if layout.kind == "row" else None
        self.key = dict(in_dtype=in_key, sf_kind=kind, count_clamp=count_clamp)
        if kind == "full_row":  # blocks needed: one per row, or 16 units of 8 channels per group of 128
            self.group, self.per_sm = None, _BLOCKS_PER_SM[("row", in_key)]
        else:
            self.group, self.per_sm = -(-hidden // _GROUP) * 16, _BLOCKS_PER_SM[("group", in_key)]
        self.round_sf = int(round_sf)
        self.fn = None  # the launcher, looked up at the first launch
        self.dummies = None  # _dummy's stand-ins for a call without optional tensors, at the first such launch

    def __call__(self, x: torch.Tensor, pos_to_token_topk: Optional[torch.Tensor], weights: Optional[torch.Tensor],
                 pos_to_expert: Optional[torch.Tensor], clamped_count: Optional[torch.Tensor], clamp: float,
                 sf_min: float) -> QuantTensor:
        """``(out, out_sf)`` for ``x`` and the optional tensors (all validated for this configuration)."""
        rows, dev = x.shape[0], x.device
        out = torch.empty((rows, self.hidden), dtype=_E4M3, device=dev)
        if self.sf_cols is not None:
            raw_sf = torch.empty((rows, self.sf_cols), dtype=torch.float32, device=dev)
        else:
            raw_sf = self.layout.alloc(rows, self.hidden, dev)
        if rows > 0:
            needed = rows if self.group is None else -(-rows * self.group // _UNITS_PER_BLOCK)
            fn = self.fn
            if fn is None:
                fn = self.fn = launcher(_FWD, **self.key)
            if pos_to_token_topk is None and weights is None and pos_to_expert is None and clamped_count is None:
                # every plan's x is on one device (the memo key holds it): the same stand-ins each time
                dummies = self.dummies
                if dummies is None:
                    i32 = _dummy(dev, torch.int32, (1,))
                    dummies = self.dummies = (i32, _dummy(dev, torch.float32, (1, 1)), i32,
                                              _dummy(dev, torch.int64, (3,)))
            else:
                dummies = (pos_to_token_topk if pos_to_token_topk is not None else _dummy(dev, torch.int32, (1,)),
                           weights if weights is not None else _dummy(dev, torch.float32, (1, 1)),
                           pos_to_expert if pos_to_expert is not None else _dummy(dev, torch.int32, (1,)),
                           clamped_count if clamped_count is not None else _dummy(dev, torch.int64, (3,)))
            fn(x, out, raw_sf, *dummies, clamp, sf_min, self.round_sf, int(weights is not None),
               int(pos_to_expert is not None), min(needed, get_num_sms(dev) * self.per_sm))
        return out, (raw_sf if self.sf_cols is not None else self.layout.finish(raw_sf, rows))


_FAST: dict[tuple, _Forward] = {}


def _fwd_layout(op: str, hidden: int, num_per_channels: Any, col: Any, round_sf: Any, packed: Any
                ) -> tuple[str, SfLayout, bool]:
    """The kernel's sf kind and the output layout for ``num_per_channels`` (128 or ``hidden``)."""
    if isinstance(num_per_channels, bool) or not isinstance(num_per_channels, int) or \
            num_per_channels not in (_GROUP, hidden):
        raise fail(op, f"num_per_channels={num_per_channels!r} is not supported; supported: 128, or hidden "
                       f"(= x.shape[1] // 2 = {hidden}) for one scale per row")
    col = check_flag(op, "use_tma_aligned_col_major_sf", col)
    packed = check_flag(op, "use_packed_ue8m0", packed)
    round_sf = check_flag(op, "round_sf", round_sf)
    if num_per_channels != _GROUP and col:
        raise fail(op, f"use_tma_aligned_col_major_sf=True needs num_per_channels=128 (got {num_per_channels}); "
                       "one scale per row is row-major only")
    layout = output_layout(op, (1, num_per_channels), col, packed, round_sf)
    kind = layout.kind if num_per_channels == _GROUP else "full_row"
    return kind, layout, round_sf


def swiglu_forward_and_per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    pos_to_token_topk: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    pos_to_expert: Optional[torch.Tensor] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    swiglu_clamp_value: Optional[float] = None,
    clamped_count: Optional[torch.Tensor] = None,
    sf_clamp_min: Optional[float] = None,
) -> QuantTensor:
    """``silu(x[:, :h]) * x[:, h:]`` (clamped to ``swiglu_clamp_value`` first when given, scaled per
    row by ``topk_weights.flat[pos_to_token_topk]`` when given), cast to e4m3 with one scale per
    ``num_per_channels`` (128, or ``h`` for one per row) channels.

    x: bf16/fp32 ``[rows, 2 * h]`` contiguous, ``h % 64 == 0``.  Returns ``(out, out_sf)``: e4m3
    ``[rows, h]`` and the scales (row-major fp32, column-major fp32, or packed UE8M0 int32 as
    with ``tile_kernels.quant``).  Rows with ``pos_to_expert < 0`` are skipped (written as zero
    rows); ``clamped_count`` (int64 ``[3]``, needs ``swiglu_clamp_value``) gets the counts of
    gate > c, up > c and up < -c added.  ``topk_weights`` is ignored without
    ``pos_to_token_topk`` (as in tile_kernels).

    A call without ``pos_to_token_topk``, ``pos_to_expert`` and ``clamped_count`` whose
    configuration (dtype, dim, width, device, fmt, ``num_per_channels`` and the flags, with their
    types) passed the checks before skips them (a dict lookup): per call only the row count, x's
    contiguity and alignment, and the clamp values (None or a float) are read.
    """
    if is_compiling() and not TRACING.on:
        return traced("swiglu_forward_and_per_token_cast", x, fmt, num_per_channels, pos_to_token_topk,
                      topk_weights, pos_to_expert, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                      swiglu_clamp_value, clamped_count, sf_clamp_min)
    if pos_to_token_topk is None and topk_weights is None and pos_to_expert is None and clamped_count is None:
        try:  # types too: True == 1 == 1.0 hash alike, but the checks take bools and ints only
            key = typed_key(x.dtype, x.dim(), x.shape[-1], x.device, fmt, num_per_channels,
                   use_tma_aligned_col_major_sf, round_sf,
                   use_packed_ue8m0)
            plan = _FAST.get(key)
        except (AttributeError, TypeError, IndexError):  # not a tensor, an unhashable argument: the checks say
            key, plan = None, None
        # per call: what the checks read from the row count and the pointer, and the clamp values
        # (None or a plain float within float32's range, or infinite; anything else, NaN included,
        # goes through _check_float)
        if plan is not None and x.is_contiguous() and not x.data_ptr() & 15:
            clamp = math.inf if swiglu_clamp_value is None else swiglu_clamp_value
            sf_min = 1e-4 if sf_clamp_min is None else sf_clamp_min
            if type(clamp) is float and (abs(clamp) < 3.4e38 or abs(clamp) == math.inf) and \
                    type(sf_min) is float and (abs(sf_min) < 3.4e38 or abs(sf_min) == math.inf):
                return plan(x, None, None, None, None, clamp, sf_min)
    else:
        key = None
    return _forward_checked(x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert,
                            use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value,
                            clamped_count, sf_clamp_min, key)


def _forward_checked(x: Any, fmt: Any, num_per_channels: Any, pos_to_token_topk: Any, topk_weights: Any,
                     pos_to_expert: Any, use_tma_aligned_col_major_sf: Any, round_sf: Any, use_packed_ue8m0: Any,
                     swiglu_clamp_value: Any, clamped_count: Any, sf_clamp_min: Any,
                     memo_key: Optional[tuple]) -> QuantTensor:
    """:func:`swiglu_forward_and_per_token_cast` with every check; memoizes its plan under
    ``memo_key`` (when given) once every check passed."""
    op = "swiglu_forward_and_per_token_cast"
    check_tensor(op, "x", x, tuple(_IN_KEY), 2)
    check_contiguous(op, "x", x)
    rows, width = x.shape
    if width == 0 or width % (2 * _FWD_HIDDEN_ALIGN):
        raise fail(op, f"x has {width} columns; it needs 2 * hidden with hidden % {_FWD_HIDDEN_ALIGN} == 0 and "
                       f"hidden > 0 (width a positive multiple of {2 * _FWD_HIDDEN_ALIGN}): pad the hidden dimension")
    hidden = width // 2
    check_fmt(op, fmt, ("e4m3",))
    kind, layout, round_sf = _fwd_layout(op, hidden, num_per_channels, use_tma_aligned_col_major_sf, round_sf,
                               use_packed_ue8m0)
    if pos_to_token_topk is not None:
        check_vector(op, "pos_to_token_topk", pos_to_token_topk, rows)
        if topk_weights is None:
            raise fail(op, "pos_to_token_topk needs topk_weights (float32 [num_tokens, num_topk])")
        check_tensor(op, "topk_weights", topk_weights, (torch.float32,), 2)
        check_contiguous(op, "topk_weights", topk_weights, 4)
    if pos_to_expert is not None:
        check_vector(op, "pos_to_expert", pos_to_expert, rows)
    clamp = check_float(op, "swiglu_clamp_value", swiglu_clamp_value, math.inf)
    if clamped_count is not None:
        if swiglu_clamp_value is None:
            raise fail(op, "clamped_count needs swiglu_clamp_value (there is nothing to count without a clamp)")
        check_tensor(op, "clamped_count", clamped_count, (torch.int64,), 1)
        if clamped_count.size(0) != 3:
            raise fail(op, f"clamped_count has {clamped_count.size(0)} entries; it needs 3 (gate > c, up > c, up < -c)")
        check_contiguous(op, "clamped_count", clamped_count, 16)  # written in place: never copied
    sf_min = check_float(op, "sf_clamp_min", sf_clamp_min, 1e-4)
    weights = topk_weights if pos_to_token_topk is not None else None
    check_cuda(op, x=x, pos_to_token_topk=pos_to_token_topk, topk_weights=weights, pos_to_expert=pos_to_expert,
               clamped_count=clamped_count)
    pos_to_token_topk, weights, pos_to_expert = (aligned_input(pos_to_token_topk), aligned_input(weights),
                                                 aligned_input(pos_to_expert))

    plan = _Forward(x.dtype, hidden, kind, layout, round_sf, clamped_count is not None)
    result = plan(x, pos_to_token_topk, weights, pos_to_expert, clamped_count, clamp, sf_min)
    if memo_key is not None and len(_FAST) < _FAST_MAX:  # every check passed: later calls may skip them
        _FAST[memo_key] = plan
    return result


# -------------------------------------------------------------------------------------- backward
def swiglu_backward_and_per_token_cast(
    x: QuantTensor,
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor,
    num_per_channels: int,
    round_sf: bool = False,
    swiglu_clamp_value: Optional[float] = None,
) -> tuple[torch.Tensor, QuantTensor, torch.Tensor, torch.Tensor]:
    """SwiGLU backward from the e4m3 forward input ``x = (data, sf)`` (per-token scales of
    ``num_per_channels`` = 32 or 128 channels), with the input gradient also cast to e4m3.

    grad_out: bf16 ``[rows, h]``; weight: fp32 ``[tokens, topk]``; pos_to_token_topk: int32
    ``[rows]``; token_topk_to_pos: int32 ``[tokens, topk]``.  Returns ``(out, (x_grad_fp8,
    x_grad_sf), x_grad, weight_grad)``: bf16 ``[rows, h]`` (``silu(gate) * up * w``), e4m3
    ``[rows, 2h]`` with fp32 ``[rows, 2h / npc]`` scales, bf16 ``[rows, 2h]``, fp32
    ``[tokens, topk]``.
    """
    if is_compiling() and not TRACING.on:
        return traced("swiglu_backward_and_per_token_cast", x, grad_out, weight, pos_to_token_topk,
                      token_topk_to_pos, num_per_channels, round_sf, swiglu_clamp_value)
    op = "swiglu_backward_and_per_token_cast"
    if isinstance(num_per_channels, bool) or not isinstance(num_per_channels, int) or num_per_channels not in (32, 128):
        raise fail(op, f"num_per_channels={num_per_channels!r} is not supported; supported: 32, 128")
    data, sf, hidden = check_bwd_x(op, x, num_per_channels)
    rows = data.size(0)
    check_tensor(op, "grad_out", grad_out, (torch.bfloat16,))
    if grad_out.numel() != rows * hidden:
        raise fail(op, f"grad_out has shape {tuple(grad_out.shape)}; it must hold [{rows}, {hidden}] values "
                       "(one row of hidden values per row of x)")
    check_contiguous(op, "grad_out", grad_out)
    check_tensor(op, "token_topk_to_pos", token_topk_to_pos, (torch.int32,), 2)
    check_contiguous(op, "token_topk_to_pos", token_topk_to_pos, 4)
    check_tensor(op, "weight", weight, (torch.float32,), 2)
    if weight.shape != token_topk_to_pos.shape:
        raise fail(op, f"weight has shape {tuple(weight.shape)}; it must match token_topk_to_pos "
                       f"{tuple(token_topk_to_pos.shape)} ([num_tokens, num_topk])")
    check_contiguous(op, "weight", weight, 4)
    check_vector(op, "pos_to_token_topk", pos_to_token_topk, rows)
    round_sf = check_flag(op, "round_sf", round_sf)
    clamp = check_float(op, "swiglu_clamp_value", swiglu_clamp_value, math.inf)
    check_cuda(op, x=data, sf=sf, grad_out=grad_out, weight=weight, pos_to_token_topk=pos_to_token_topk,
               token_topk_to_pos=token_topk_to_pos)

    # sf, the index maps and weights are read as the manifest declares them (16-byte aligned): a view
    # that starts inside a tensor (a later chunk of tokens) is copied, never refused; after every
    # check, so a refused call does no GPU work
    sf, weight = aligned_input(sf), aligned_input(weight)
    pos_to_token_topk, token_topk_to_pos = aligned_input(pos_to_token_topk), aligned_input(token_topk_to_pos)
    dev = data.device
    out = torch.empty((rows, hidden), dtype=torch.bfloat16, device=dev)
    x_grad_fp8 = torch.empty((rows, 2 * hidden), dtype=_E4M3, device=dev)
    x_grad_sf = torch.empty((rows, 2 * hidden // num_per_channels), dtype=torch.float32, device=dev)
    x_grad = torch.empty((rows, 2 * hidden), dtype=torch.bfloat16, device=dev)
    weight_grad = torch.empty(weight.shape, dtype=torch.float32, device=dev)
    if rows > 0 or weight.numel() > 0:
        launcher(_BWD_KERNEL, num_per_channels=num_per_channels)(
            data, sf, grad_out.view(rows, hidden), weight, pos_to_token_topk, token_topk_to_pos,
            out, x_grad_fp8, x_grad_sf, x_grad, weight_grad, clamp, int(round_sf))
    return out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad


# --------------------------------------------------------------------------- per-channel forward
def swiglu_forward_and_per_channel_cast_and_transpose(
    x: torch.Tensor,
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    without_transpose: bool = False,
    swiglu_clamp_value: Optional[float] = None,
) -> QuantTensor:
    """``bf16(silu(x[:, :h]) * x[:, h:])`` (clamped first when ``swiglu_clamp_value`` is given), cast
    to e4m3 with one scale per channel and ``num_per_tokens`` (32 or 128) tokens.

    x: bf16 ``[tokens, 2h]`` contiguous, ``tokens % 128 == 0`` and ``2h % 128 == 0``.  Returns
    ``(out, out_sf)``: e4m3 ``[h, tokens]`` (or ``[tokens, h]`` with ``without_transpose``) and
    fp32 ``[tokens / num_per_tokens, h]``.
    """
    if is_compiling() and not TRACING.on:
        return traced("swiglu_forward_and_per_channel_cast_and_transpose", x, fmt, num_per_tokens, round_sf,
                      without_transpose, swiglu_clamp_value)
    op = "swiglu_forward_and_per_channel_cast_and_transpose"
    check_fmt(op, fmt, ("e4m3",))
    check_tensor(op, "x", x, (torch.bfloat16,), 2)
    check_contiguous(op, "x", x)
    tokens, width = x.shape
    if tokens % 128 or width % 128:
        raise fail(op, f"x has shape {tuple(x.shape)}; both the token count and the width (2 * hidden) must be "
                       "multiples of 128: pad the tokens (and the hidden dimension)")
    if isinstance(num_per_tokens, bool) or not isinstance(num_per_tokens, int) or num_per_tokens not in (32, 128):
        raise fail(op, f"num_per_tokens={num_per_tokens!r} is not supported; supported: 32, 128")
    round_sf = check_flag(op, "round_sf", round_sf)
    transpose = not check_flag(op, "without_transpose", without_transpose)
    clamp = check_float(op, "swiglu_clamp_value", swiglu_clamp_value, math.inf)
    check_cuda(op, x=x)

    hidden = width // 2
    out_shape = (hidden, tokens) if transpose else (tokens, hidden)
    out = torch.empty(out_shape, dtype=_E4M3, device=x.device)
    out_sf = torch.empty((tokens // num_per_tokens, hidden), dtype=torch.float32, device=x.device)
    if tokens > 0 and hidden > 0:
        launcher(_CHANNEL, num_per_tokens=num_per_tokens, transpose=transpose)(x, out, out_sf, clamp, int(round_sf))
    return out, out_sf


def _bwd_result(result: Any) -> tuple:
    out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad = result
    return out, x_grad_fp8, x_grad_sf, x_grad, weight_grad


# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (
    TorchOp("swiglu_forward_and_per_token_cast",
            "(Tensor x, str fmt, int num_per_channels, Tensor? pos_to_token_topk=None, Tensor? topk_weights=None, "
            "Tensor? pos_to_expert=None, bool use_tma_aligned_col_major_sf=False, bool round_sf=False, "
            "bool use_packed_ue8m0=False, float? swiglu_clamp_value=None, Tensor(a!)? clamped_count=None, "
            "float? sf_clamp_min=None) -> (Tensor, Tensor)",
            swiglu_forward_and_per_token_cast, lambda *a: _forward_checked(*a, None)),
    TorchOp("swiglu_backward_and_per_token_cast",
            "(Tensor x, Tensor x_sf, Tensor grad_out, Tensor weight, Tensor pos_to_token_topk, Tensor token_topk_to_pos, "
            "int num_per_channels, bool round_sf=False, float? swiglu_clamp_value=None) "
            "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
            swiglu_backward_and_per_token_cast, to_schema=pair_to_schema, to_public=pair_to_public,
            result_to_schema=_bwd_result, result_to_public=lambda r: (r[0], (r[1], r[2]), r[3], r[4])),
    TorchOp("swiglu_forward_and_per_channel_cast_and_transpose",
            "(Tensor x, str fmt, int num_per_tokens, bool round_sf=False, bool without_transpose=False, "
            "float? swiglu_clamp_value=None) -> (Tensor, Tensor)", swiglu_forward_and_per_channel_cast_and_transpose),
)


__all__ = [
    "swiglu_backward_and_per_token_cast",
    "swiglu_forward_and_per_channel_cast_and_transpose",
    "swiglu_forward_and_per_token_cast",
]
