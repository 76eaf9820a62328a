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
runtime values (no kernel per value).  ``tilebin.modeling.swiglu`` pairs the per-token forward
with the backward as an autograd Function.

Each op is declared once (an :class:`~tilebin.ops._spec.OpSpec`): every argument is validated
before any GPU work (:class:`tilebin.runtime.ArgumentError` naming the op, the value and the fix;
the device is checked last), once per configuration (dtypes, widths, devices, which optional
tensors are given, the scalars with their types); later calls of a configuration check only what
varies per call (row counts, contiguity, alignment: ``_swiglu_checks``).  Outputs are allocated
here on the input's device and the kernels run on torch's current stream.  Not checked (it would
need a device sync): the values of the index tensors (``pos_to_token_topk`` must index
``topk_weights`` / ``weight``, as in tile_kernels).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .._common import TRACING, aligned_input, check_cuda, launcher
from .._spec import FlagParam, OpSpec, Param, TensorParam
from .._torch import pair_to_public, pair_to_schema
from ..config import get_num_sms
from . import _swiglu_checks as ck
from ._sf import SfLayout

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_FWD = "quant.swiglu_forward_and_per_token_cast"
_BWD = "quant.swiglu_backward_and_per_token_cast"
_BWD_KERNEL = _BWD
_CHANNEL = "quant.swiglu_forward_and_per_channel_cast_and_transpose"
_E4M3 = torch.float8_e4m3fn
_IN_KEY = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
_UNITS_PER_BLOCK = 512  # per-group forward kernel: 256 threads x 2 units of 8 channels
# resident blocks per SM of the forward kernels (register-limited), used to size their grids
_BLOCKS_PER_SM = {("group", "bfloat16"): 4, ("group", "float32"): 3, ("row", "bfloat16"): 2, ("row", "float32"): 2}
_DUMMIES: dict[tuple, torch.Tensor] = {}


def _dummy(device: torch.device, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A stand-in for an absent optional tensor (never read by the kernel)."""
    key = (device, dtype, shape)  # (shapes: int literals of this module)
    if TRACING.on:  # fake tensors: never cached (a fake stand-in must not reach a real launch)
        return torch.zeros(shape, dtype=dtype, device=device)
    t = _DUMMIES.get(key)
    if t is None:
        t = _DUMMIES[key] = torch.zeros(shape, dtype=dtype, device=device)
    return t


def _stand_ins(dev: torch.device, pos_to_token_topk: Any, weights: Any, pos_to_expert: Any,
               clamped_count: Any) -> tuple:
    """The forward kernel's four optional tensors: the given ones (read-only ones 16-byte aligned,
    copied if not), stand-ins for the others."""
    i32 = _dummy(dev, torch.int32, (1,))
    return (i32 if pos_to_token_topk is None else aligned_input(pos_to_token_topk),
            _dummy(dev, torch.float32, (1, 1)) if weights is None else aligned_input(weights),
            i32 if pos_to_expert is None else aligned_input(pos_to_expert),
            _dummy(dev, torch.int64, (3,)) if clamped_count is None else clamped_count)


# ----------------------------------------------------------------------------- per-token forward
def _fwd_relations(op: str, values: dict) -> None:
    """x's width, ``num_per_channels`` and the layout flags together; then every tensor's device
    (topk_weights, read only through pos_to_token_topk, is not a TensorParam)."""
    ck.fwd_layout(op, values)
    ptt = values["pos_to_token_topk"]
    check_cuda(op, x=values["x"], pos_to_token_topk=ptt, topk_weights=None if ptt is None else values["topk_weights"],
               pos_to_expert=values["pos_to_expert"], clamped_count=values["clamped_count"])


def _plan_fwd(values: dict) -> Callable[..., QuantTensor]:
    """The launch of one configuration: everything but the row count, the pointers (and which
    stand-ins a call without optional tensors uses, made at its first launch)."""
    hidden, kind, layout = ck.fwd_layout(_FWD, values)
    in_key = _IN_KEY[values["x"].dtype]
    fn = launcher(_FWD, in_dtype=in_key, sf_kind=kind, count_clamp=values["clamped_count"] is not None)
    # blocks needed: one per row, or 16 units of 8 channels per group of 128 (512 units per block)
    group = None if kind == "full_row" else -(-hidden // ck.GROUP) * 16
    per_sm = _BLOCKS_PER_SM[("row" if group is None else "group", in_key)]
    scales = _scales(layout, hidden)
    scalars = (values["swiglu_clamp_value"], values["sf_clamp_min"], int(values["round_sf"]))
    hot: list = []  # the stand-ins of a call without optional tensors (x's device is in the key)

    def run(x: torch.Tensor, _fmt: Any, _npc: Any, ptt: Any, weights: Any, p2e: Any, _col: Any, _round: Any,
            _packed: Any, _clamp: Any, clamped_count: Any, _sf_min: Any) -> QuantTensor:
        rows, dev = x.shape[0], x.device
        out = torch.empty(rows, hidden, dtype=_E4M3, device=dev)
        raw_sf, out_sf = scales(rows, dev)
        if rows > 0:
            needed = rows if group is None else -(-rows * group // _UNITS_PER_BLOCK)
            blocks = min(needed, get_num_sms(dev) * per_sm)
            if ptt is None and p2e is None and clamped_count is None:  # topk_weights: ignored without ptt
                if not hot:
                    hot.append(_stand_ins(dev, None, None, None, None))
                fn(x, out, raw_sf, *hot[0], *scalars, 0, 0, blocks)
            else:
                fn(x, out, raw_sf, *_stand_ins(dev, ptt, None if ptt is None else weights, p2e, clamped_count),
                   *scalars, int(ptt is not None), int(p2e is not None), blocks)
        return out, out_sf

    return run


def _scales(layout: SfLayout, hidden: int) -> Callable[[int, torch.device], tuple[torch.Tensor, torch.Tensor]]:
    """``(kernel-side scales, the scales returned)`` for ``rows`` rows: ``layout.alloc`` and
    ``layout.finish`` with what does not depend on the row count computed once."""
    if layout.kind == "row":  # fp32 [rows, groups]
        groups = layout.shape(1, hidden)[1]

        def row(rows: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
            raw = torch.empty(rows, groups, dtype=torch.float32, device=dev)
            return raw, raw

        return row
    # column-major: [groups (/ 4 packed), rows (* 4 bytes packed)], the row count padded to 16 bytes
    packed = layout.packed_ue8m0
    groups, per_row, pad, dtype = layout.shape(1, hidden)[0], 4 if packed else 1, 16 if packed else 4, layout.dtype

    def col(rows: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        n = rows * per_row
        raw = torch.empty(groups, -(-n // pad) * pad, dtype=dtype, device=dev)[:, :n]
        if not packed:
            return raw, raw.T
        return raw, (raw.view(torch.int32).T if rows else torch.empty(groups, 0, dtype=torch.int32, device=dev).T)

    return col


def _index(name: str) -> TensorParam:
    return TensorParam(name, (torch.int32,), 1, optional=True, default="None")


SWIGLU_FWD = OpSpec(
    "swiglu_forward_and_per_token_cast",
    (TensorParam("x", tuple(_IN_KEY), 2), Param("fmt", "str", ck.e4m3_only),
     ck.IntChoice("num_per_channels"), _index("pos_to_token_topk"),
     Param("topk_weights", "Tensor?", key_of=ck.weights_key, default="None"), _index("pos_to_expert"),
     FlagParam("use_tma_aligned_col_major_sf", "False"), FlagParam("round_sf", "False"),
     FlagParam("use_packed_ue8m0", "False"),
     Param("swiglu_clamp_value", "float?", ck.clamp_value, default="None"),
     ck.CountParam("clamped_count", (torch.int64,), 1, mutated=True, optional=True, rows_vary=False, default="None"),
     Param("sf_clamp_min", "float?", ck.sf_clamp_min, default="None")),
    "(Tensor, Tensor)", _plan_fwd, relations=_fwd_relations, per_call=ck.fwd_per_call)


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
    """
    return SWIGLU_FWD.call(x, fmt, num_per_channels, pos_to_token_topk, topk_weights, pos_to_expert,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, swiglu_clamp_value, clamped_count,
                      sf_clamp_min)


# -------------------------------------------------------------------------------------- backward
def _bwd_relations(op: str, values: dict) -> None:
    """What varies per call (:func:`._swiglu_checks.bwd_checks`), then every tensor's device, the
    pair's included, in the op's order.  (A replayed call runs the per-call test in its ``run``.)"""
    ck.bwd_checks(op, *(values[name] for name in _BWD_PER_CALL))
    data, sf = values["x"]
    check_cuda(op, x=data, sf=sf, grad_out=values["grad_out"], weight=values["weight"],
               pos_to_token_topk=values["pos_to_token_topk"], token_topk_to_pos=values["token_topk_to_pos"])


_BWD_OP = "swiglu_backward_and_per_token_cast"  # the op's name in its messages
_BWD_PER_CALL = ("x", "grad_out", "weight", "pos_to_token_topk", "token_topk_to_pos", "num_per_channels")


def _plan_bwd(values: dict) -> Callable[..., Any]:
    npc = values["num_per_channels"]
    fn = launcher(_BWD_KERNEL, num_per_channels=npc)
    scalars = (values["swiglu_clamp_value"], int(values["round_sf"]))
    dev = values["x"][0].device  # every tensor's device is part of the configuration
    plain, checks, tracing = ck.bwd_plain, ck.bwd_checks, TRACING

    def run(x: QuantTensor, grad_out: torch.Tensor, weight: torch.Tensor, ptt: torch.Tensor, ttp: torch.Tensor,
            *_: Any) -> tuple[torch.Tensor, QuantTensor, torch.Tensor, torch.Tensor]:
        # per call (here, not a spec per_call: one frame less): the one-expression test, else the ordered checks
        if not plain(x, grad_out, weight, ptt, ttp, npc):
            checks(_BWD_OP, x, grad_out, weight, ptt, ttp, npc)
        data, sf = x
        width = data.shape[-1]
        rows, hidden = data.numel() // width, width // 2
        # sf, the index maps and weights are read as the manifest declares them (16-byte aligned): a
        # view that starts inside a tensor (a later chunk of tokens) is copied, never refused
        if not tracing.on and (sf.data_ptr() | weight.data_ptr() | ptt.data_ptr() | ttp.data_ptr()) % 16:
            sf, weight, ptt, ttp = aligned_input(sf), aligned_input(weight), aligned_input(ptt), aligned_input(ttp)
        out = torch.empty(rows, hidden, dtype=torch.bfloat16, device=dev)
        x_grad_fp8 = torch.empty(rows, width, dtype=_E4M3, device=dev)
        x_grad_sf = torch.empty(rows, width // npc, dtype=torch.float32, device=dev)
        x_grad = torch.empty(rows, width, dtype=torch.bfloat16, device=dev)
        ws = weight.shape  # 2-D (checked)
        weight_grad = torch.empty(ws[0], ws[1], dtype=torch.float32, device=dev)
        if rows > 0 or weight.numel() > 0:
            if data.dim() != 2:  # [..., width] as [rows, width] (a view: per_call checked it contiguous)
                data = data.view(rows, width)
            if grad_out.dim() != 2 or grad_out.shape[0] != rows:
                grad_out = grad_out.view(rows, hidden)
            fn(data, sf, grad_out, weight, ptt, ttp, out, x_grad_fp8, x_grad_sf, x_grad, weight_grad, *scalars)
        return out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad

    return run


def _bwd_result(result: Any) -> tuple:
    out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad = result
    return out, x_grad_fp8, x_grad_sf, x_grad, weight_grad


SWIGLU_BWD = OpSpec(
    "swiglu_backward_and_per_token_cast",
    (Param("x", "Tensor", ck.bwd_pair, ck.bwd_pair_key), TensorParam("grad_out", (torch.bfloat16,)),
     TensorParam("weight", (torch.float32,)), TensorParam("pos_to_token_topk", (torch.int32,), 1),
     TensorParam("token_topk_to_pos", (torch.int32,), 2),
     ck.IntChoice("num_per_channels", allowed=(32, 128)),
     FlagParam("round_sf", "False"), Param("swiglu_clamp_value", "float?", ck.clamp_value, default="None")),
    "(Tensor, Tensor, Tensor, Tensor, Tensor)", _plan_bwd, relations=_bwd_relations,
    schema_args="Tensor x, Tensor x_sf, Tensor grad_out, Tensor weight, Tensor pos_to_token_topk, "
                "Tensor token_topk_to_pos, int num_per_channels, bool round_sf=False, float? swiglu_clamp_value=None",
    torch=dict(to_schema=pair_to_schema, to_public=pair_to_public, result_to_schema=_bwd_result,
               result_to_public=lambda r: (r[0], (r[1], r[2]), r[3], r[4])))


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
    return SWIGLU_BWD.call(x, grad_out, weight, pos_to_token_topk, token_topk_to_pos, num_per_channels, round_sf,
                      swiglu_clamp_value)


# --------------------------------------------------------------------------- per-channel forward
def _plan_channel(values: dict) -> Callable[..., QuantTensor]:
    npt, transpose = values["num_per_tokens"], not values["without_transpose"]
    fn = launcher(_CHANNEL, num_per_tokens=npt, transpose=transpose)
    scalars = (values["swiglu_clamp_value"], int(values["round_sf"]))

    def run(x: torch.Tensor, *_: Any) -> QuantTensor:
        tokens, width = x.shape
        hidden = width // 2
        out = torch.empty((hidden, tokens) if transpose else (tokens, hidden), dtype=_E4M3, device=x.device)
        out_sf = torch.empty(tokens // npt, hidden, dtype=torch.float32, device=x.device)
        if tokens > 0 and hidden > 0:
            fn(x, out, out_sf, *scalars)
        return out, out_sf

    return run


SWIGLU_CHANNEL = OpSpec(
    "swiglu_forward_and_per_channel_cast_and_transpose",
    (TensorParam("x", (torch.bfloat16,), 2), Param("fmt", "str", ck.e4m3_only),
     ck.IntChoice("num_per_tokens", allowed=(32, 128)), FlagParam("round_sf", "False"),
     FlagParam("without_transpose", "False"),
     Param("swiglu_clamp_value", "float?", ck.clamp_value, default="None")),
    "(Tensor, Tensor)", _plan_channel, per_call=ck.channel_per_call)


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
    return SWIGLU_CHANNEL.call(x, fmt, num_per_tokens, round_sf, without_transpose, swiglu_clamp_value)


SPECS = (SWIGLU_FWD, SWIGLU_BWD, SWIGLU_CHANNEL)
# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (SWIGLU_FWD.torch_op(swiglu_forward_and_per_token_cast),
             SWIGLU_BWD.torch_op(swiglu_backward_and_per_token_cast),
             SWIGLU_CHANNEL.torch_op(swiglu_forward_and_per_channel_cast_and_transpose))


__all__ = [
    "swiglu_backward_and_per_token_cast",
    "swiglu_forward_and_per_channel_cast_and_transpose",
    "swiglu_forward_and_per_token_cast",
]
