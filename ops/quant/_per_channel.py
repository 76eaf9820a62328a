"""Per-channel casts to e4m3: one scale per (``num_per_tokens`` tokens x 1 channel) block.

Same names, signatures, defaults and output layouts as ``tile_kernels.quant`` 1.0.0
(``per_channel_cast``, ``per_channel_cast_fused``, ``per_channel_cast_and_transpose``); the
results are bit-identical to ``tile_kernels.torch.cast(x, "e4m3", block_size=(num_per_tokens,
1), ...)``.  Beyond tile_kernels, any token count works (a last partial block of tokens takes
its scale from the tokens present; tile_kernels needs multiples of 128, or of 16 with
``pos_to_token``), and the hidden size needs ``hidden % 16 == 0`` (``% 64`` for the transpose).

Kernels: ``quant.per_channel_cast_bf16`` for a plain bf16 ``x`` without ``pos_to_token``,
``quant.per_channel_cast_fused`` for every other input (same parameters and bits),
``quant.per_channel_cast_and_transpose`` for the transpose.

Each op is declared by one :class:`tilebin.ops._spec.OpSpec`.  Every argument is validated
before any GPU work (:class:`tilebin.runtime.ArgumentError` naming the op, the value and the
fix; the device is checked last); a configuration (dtypes, hidden, device, the scalars with
their types, whether ``x`` is a pair and ``pos_to_token`` given) is checked once, a later call
of it checks only contiguity, pointer alignment and the input scales' row count.  The outputs
are allocated here on ``x``'s device and the kernel runs on torch's current stream.  Not
checked (it would need a device sync): the values of ``pos_to_token``; a position
``>= num_tokens`` gives a row of zeros, like a negative one, instead of reading out of bounds.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from tilebin.runtime._record import record

from .._common import TRACING, aligned_input, check_cuda, fail, launcher
from .._spec import FlagParam, OpSpec, Param, TensorParam
from .._torch import pair_to_public, pair_to_schema
from ._per_channel_checks import (HIDDEN_ALIGN, IN_GROUP, PLAIN_DTYPES, check_int, check_matrix, check_pos,
                                  fused_x, fused_x_call, fused_x_key)
from ._sf import check_fmt

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_FUSED = "quant.per_channel_cast_fused"
# plain bf16 without pos_to_token: same parameters and bits as _FUSED, which does not build that variant
_PLAIN_BF16 = "quant.per_channel_cast_bf16"
_TRANSPOSE = "quant.per_channel_cast_and_transpose"
_E4M3 = torch.float8_e4m3fn
_DTYPE_KEY = {torch.bfloat16: "bfloat16", torch.float32: "float32", _E4M3: "float8_e4m3fn"}
_TRANSPOSE_HIDDEN_ALIGN = 64  # transpose kernel: 64-channel tiles
_DUMMIES: dict[tuple, torch.Tensor] = {}  # (device, dtype, ndim) -> stand-in for an unread parameter


def _dummy(device: torch.device, dtype: torch.dtype, ndim: int) -> torch.Tensor:
    key = (device, dtype, ndim)
    if TRACING.on:  # fake tensors: never cached (a fake stand-in must not reach a real launch)
        return torch.zeros((4,) * ndim, dtype=dtype, device=device)
    t = _DUMMIES.get(key)
    if t is None:
        t = _DUMMIES[key] = torch.zeros((4,) * ndim, dtype=dtype, device=device)
    return t


@record
class _Matrix(TensorParam):
    """A 2-D tensor of ``dtypes``, contiguous, ``hidden % align == 0``, 16-byte aligned, in this
    module's wording (:func:`check_matrix`); contiguity and alignment checked on every call.
    ``pair_hint``: the message for a ``(data, sf)`` pair given where a plain tensor belongs."""

    contiguous: bool = True  # OpSpec runs check_call on every call of a parameter that says so
    align: int = HIDDEN_ALIGN
    # OpSpec's cheap test before check_call ({s}: x.shape), true whenever check_call raises (stride(1) read
    # only for an empty x)
    call_test = "not {a}.is_contiguous() or {a}.data_ptr() & 15 or not {s}[0] and {a}.stride(1) != 1 and {s}[1] > 1"
    pair_hint: Optional[str] = None

    def check(self, op: str, value: Any) -> Any:
        if self.pair_hint is not None and isinstance(value, tuple):
            raise fail(op, self.pair_hint)
        check_matrix(op, self.name, value, self.dtypes, self.align)
        return value

    def check_call(self, op: str, t: torch.Tensor) -> None:  # a replayed call: never a fake tensor (data_ptr)
        if not t.is_contiguous() or t.data_ptr() & 15 or t.stride(1) != 1 and t.shape[1] > 1:  # irregular(t, 16)
            check_matrix(op, self.name, t, self.dtypes, self.align)  # says which (the first call's message)


@record
class _Positions(TensorParam):
    """``pos_to_token``: None, or int32 ``[num_tokens_out]``, contiguous, 4-byte aligned
    (:func:`check_pos`; contiguity and alignment checked on every call)."""

    contiguous: bool = True
    call_test = "{a} is not None and (not {a}.is_contiguous() or {a}.data_ptr() & 3)"  # OpSpec: before check_call

    def check(self, op: str, value: Any) -> Any:
        if value is not None:
            check_pos(op, value)
        return value

    def check_call(self, op: str, t: Optional[torch.Tensor]) -> None:  # a replayed call: never a fake tensor
        if t is not None and (not t.is_contiguous() or t.data_ptr() & 3):  # irregular(t, 4) for a 1-D tensor
            check_pos(op, t)


def _fmt() -> Param:
    """``fmt``: 'e4m3' (a str Param without ``key_of``: OpSpec keys it inline)."""
    return Param("fmt", "str", lambda op, value: check_fmt(op, value, ("e4m3",)))


def _tokens(allowed: tuple[int, ...]) -> Param:
    """``num_per_tokens``, a Python int among ``allowed``; keyed by its type and value."""
    return Param("num_per_tokens", "int", lambda op, value: check_int(op, "num_per_tokens", value, allowed))


def _plan_fused(values: dict) -> Callable[..., QuantTensor]:
    """per_channel_cast and per_channel_cast_fused: the kernel for the configuration's form."""
    x, pos = values["x"], values.get("pos_to_token")
    pair = isinstance(x, tuple)
    data = x[0] if pair else x
    if not pair and pos is None and data.dtype == torch.bfloat16:
        fn = launcher(_PLAIN_BF16, in_dtype="bfloat16", expand=False)
    else:
        fn = launcher(_FUSED, in_dtype=_DTYPE_KEY[data.dtype], expand=pos is not None)
    round_sf, device = int(values["round_sf"]), data.device  # the device: part of the configuration
    sf_dummy = None if pair else _dummy(device, torch.float32, 2)
    pos_dummy = None if pos is not None else _dummy(device, torch.int32, 1)

    def plain(x: torch.Tensor, *_: Any) -> QuantTensor:
        num_tokens, hidden = x.shape
        out = torch.empty(num_tokens, hidden, dtype=_E4M3, device=device)
        out_sf = torch.empty(-(-num_tokens // 128), hidden, dtype=torch.float32, device=device)
        if num_tokens and hidden:
            fn(x, out, out_sf, sf_dummy, pos_dummy, round_sf)
        return out, out_sf

    def general(x: Any, _fmt: Any, _npt: Any, _round: Any, _npc: Any, pos: Optional[torch.Tensor]) -> QuantTensor:
        data, sf = x if pair else (x, None)
        num_tokens, hidden = data.shape
        num_out = num_tokens if pos is None else pos.size(0)
        out = torch.empty(num_out, hidden, dtype=_E4M3, device=device)
        out_sf = torch.empty(-(-num_out // 128), hidden, dtype=torch.float32, device=device)
        if num_out and hidden:
            fn(data, out, out_sf, aligned_input(sf) if pair else sf_dummy,
               aligned_input(pos) if pos is not None else pos_dummy, round_sf)
        return out, out_sf

    return plain if not pair and pos is None else general


PER_CHANNEL_CAST = OpSpec(
    "per_channel_cast",
    (_Matrix("x", PLAIN_DTYPES, 2, pair_hint="x must be a plain bf16/fp32 tensor; for a quantized (data, sf) input "
                                             "use per_channel_cast_fused(..., num_per_channels=128)"),
     _fmt(), _tokens((128,)), FlagParam("round_sf", "False")),
    "(Tensor, Tensor)", _plan_fused)


def per_channel_cast(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False) -> QuantTensor:
    """Cast ``x [num_tokens, hidden]`` (bf16/fp32, contiguous) to e4m3 with one scale per
    ``num_per_tokens`` (128) tokens of each channel.

    Returns ``(out [num_tokens, hidden] e4m3, out_sf [ceil(num_tokens / 128), hidden] fp32)``,
    both contiguous; ``out_sf`` holds dequantization scales.  ``round_sf`` rounds the scales up
    to powers of two.  Raises :class:`tilebin.runtime.ArgumentError` for any unsupported input.
    """
    return PER_CHANNEL_CAST.call(x, fmt, num_per_tokens, round_sf)


def _fused_relations(op: str, values: dict) -> None:
    """``num_per_channels`` goes with the form of ``x`` (128 for a pair, None for a plain tensor);
    then the device of every tensor (the pair's are not a TensorParam's)."""
    x, num_per_channels, pos = values["x"], values["num_per_channels"], values["pos_to_token"]
    if isinstance(x, tuple):
        if num_per_channels is None:
            raise fail(op, "a quantized (data, sf) input needs num_per_channels=128 (channels per input scale)")
        check_int(op, "num_per_channels", num_per_channels, (IN_GROUP,))
        data, sf = x
    else:
        if num_per_channels is not None:
            raise fail(op, f"num_per_channels={num_per_channels!r} is only for a quantized (data, sf) input; "
                           "pass num_per_channels=None with a plain tensor")
        data, sf = x, None
    check_cuda(op, x=data, sf=sf, pos_to_token=pos)


PER_CHANNEL_CAST_FUSED = OpSpec(
    "per_channel_cast_fused",
    (Param("x", "Tensor", fused_x, key_of=fused_x_key, call_check=fused_x_call), _fmt(), _tokens((128,)),
     FlagParam("round_sf", "False"),
     Param("num_per_channels", "int?", default="None"),  # checked with x (relations)
     _Positions("pos_to_token", (torch.int32,), 1, optional=True, default="None")),
    "(Tensor, Tensor)", _plan_fused, relations=_fused_relations,
    schema_args="Tensor x, Tensor? x_sf, str fmt, int num_per_tokens, bool round_sf=False, "
                "int? num_per_channels=None, Tensor? pos_to_token=None",
    torch=dict(to_schema=pair_to_schema, to_public=pair_to_public))


def per_channel_cast_fused(
    x: Union[torch.Tensor, QuantTensor],
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    num_per_channels: Optional[int] = None,
    pos_to_token: Optional[torch.Tensor] = None,
) -> QuantTensor:
    """:func:`per_channel_cast`, optionally re-quantizing and gathering rows on the way.

    ``x`` is a bf16/fp32 tensor, or a quantized pair ``(data e4m3 [num_tokens, hidden], sf fp32
    [num_tokens, ceil(hidden / 128)])`` with ``num_per_channels=128``, dequantized as
    ``data * sf`` (fp32) first.  With ``pos_to_token`` (int32 ``[num_tokens_out]``), row ``r`` of
    the result is row ``pos_to_token[r]`` of the input, or zeros where it is ``-1`` (any
    negative value).  Returns ``(out [num_tokens_out, hidden] e4m3, out_sf
    [ceil(num_tokens_out / 128), hidden] fp32)``.
    """
    return PER_CHANNEL_CAST_FUSED.call(x, fmt, num_per_tokens, round_sf, num_per_channels, pos_to_token)


def _plan_transpose(values: dict) -> Callable[..., QuantTensor]:
    num_per_tokens, round_sf, device = values["num_per_tokens"], int(values["round_sf"]), values["x"].device
    fn = launcher(_TRANSPOSE, num_per_tokens=num_per_tokens)

    def run(x: torch.Tensor, *_: Any) -> QuantTensor:
        num_tokens, hidden = x.shape
        out = torch.empty(hidden, num_tokens, dtype=_E4M3, device=device)
        out_sf = torch.empty(-(-num_tokens // num_per_tokens), hidden, dtype=torch.float32, device=device)
        if num_tokens and hidden:
            fn(x, out, out_sf, round_sf)
        return out, out_sf

    return run


PER_CHANNEL_CAST_AND_TRANSPOSE = OpSpec(
    "per_channel_cast_and_transpose",
    (_Matrix("x", (torch.bfloat16,), 2, align=_TRANSPOSE_HIDDEN_ALIGN), _fmt(), _tokens((32, 128)),
     FlagParam("round_sf", "False")),
    "(Tensor, Tensor)", _plan_transpose)


def per_channel_cast_and_transpose(x: torch.Tensor, fmt: str, num_per_tokens: int,
                                   round_sf: bool = False) -> QuantTensor:
    """Cast bf16 ``x [num_tokens, hidden]`` to e4m3 and transpose it, one scale per
    ``num_per_tokens`` (32 or 128) tokens of each channel.

    Returns ``(out [hidden, num_tokens] e4m3 contiguous, out_sf [ceil(num_tokens /
    num_per_tokens), hidden] fp32)``; ``out.T`` equals :func:`per_channel_cast`'s ``out`` for
    128.  ``hidden % 64 == 0`` is required.
    """
    return PER_CHANNEL_CAST_AND_TRANSPOSE.call(x, fmt, num_per_tokens, round_sf)


SPECS = (PER_CHANNEL_CAST, PER_CHANNEL_CAST_FUSED, PER_CHANNEL_CAST_AND_TRANSPOSE)
# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (PER_CHANNEL_CAST.torch_op(per_channel_cast), PER_CHANNEL_CAST_FUSED.torch_op(per_channel_cast_fused),
             PER_CHANNEL_CAST_AND_TRANSPOSE.torch_op(per_channel_cast_and_transpose))

__all__ = ["per_channel_cast", "per_channel_cast_fused", "per_channel_cast_and_transpose"]
