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

Every argument is validated before any GPU work (:class:`tilebin.runtime.ArgumentError`
naming the op, the value and the fix; the device is checked last); the outputs are allocated
here on ``x``'s device and the kernel runs on torch's current stream.  Not checked (it would
need a device sync): the values of ``pos_to_token``; a position ``>= num_tokens`` gives a
row of zeros, like a negative one, instead of reading out of bounds.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch.compiler import is_compiling

from .._common import TRACING, aligned_input, check_aligned, check_cuda, check_flag, check_tensor, fail, launcher
from .._torch import TorchOp, traced, pair_to_public, pair_to_schema
from ._sf import check_fmt

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_FUSED = "quant.per_channel_cast_fused"
# plain bf16 without pos_to_token: same parameters and bits as _FUSED, which does not build that variant
_PLAIN_BF16 = "quant.per_channel_cast_bf16"
_TRANSPOSE = "quant.per_channel_cast_and_transpose"
_E4M3 = torch.float8_e4m3fn
_PLAIN_DTYPES = (torch.bfloat16, torch.float32)
_DTYPE_KEY = {torch.bfloat16: "bfloat16", torch.float32: "float32", _E4M3: "float8_e4m3fn"}
_IN_GROUP = 128  # channels per input scale of a quantized input (num_per_channels)
_HIDDEN_ALIGN = 16  # fused kernel: 16 channels per thread (16-byte e4m3 stores)
_TRANSPOSE_HIDDEN_ALIGN = 64  # transpose kernel: 64-channel tiles
_DUMMIES: dict[tuple, torch.Tensor] = {}  # (device, dtype, ndim) -> stand-in for an unread parameter


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _dummy(device: torch.device, dtype: torch.dtype, ndim: int) -> torch.Tensor:
    key = (device, dtype, ndim)
    if TRACING.on:  # fake tensors: never cached (a fake stand-in must not reach a real launch)
        return torch.zeros((4,) * ndim, dtype=dtype, device=device)
    t = _DUMMIES.get(key)
    if t is None:
        t = _DUMMIES[key] = torch.zeros((4,) * ndim, dtype=dtype, device=device)
    return t


def _check_int(op: str, name: str, value: Any, allowed: tuple[int, ...]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise fail(op, f"{name}={value!r} is not supported; supported: {', '.join(map(str, allowed))}")
    return value


def _check_matrix(op: str, name: str, t: Any, dtypes: tuple, align: int) -> None:
    """A 2-D contiguous tensor of ``dtypes`` with ``hidden % align == 0`` and an aligned pointer."""
    check_tensor(op, name, t, dtypes, 2)
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (got strides {tuple(t.stride())} for shape {tuple(t.shape)}); "
                       f"pass {name}.contiguous()")
    if t.size(1) % align:
        raise fail(op, f"{name} has hidden size {t.size(1)}; this op needs a multiple of {align} "
                       f"(pad the hidden dimension)")
    check_aligned(op, name, t)


def _check_quantized(op: str, x: tuple, num_per_channels: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``(data, sf)`` input: e4m3 data, fp32 row-major sf of one scale per 128 channels."""
    if len(x) != 2:
        raise fail(op, f"a quantized input must be a (data, sf) pair, got a tuple of {len(x)}")
    if num_per_channels is None:
        raise fail(op, "a quantized (data, sf) input needs num_per_channels=128 (channels per input scale)")
    _check_int(op, "num_per_channels", num_per_channels, (_IN_GROUP,))
    data, sf = x
    _check_matrix(op, "x[0] (data)", data, (_E4M3,), _HIDDEN_ALIGN)
    check_tensor(op, "x[1] (sf)", sf, (torch.float32,), 2)
    want = (data.size(0), _cdiv(data.size(1), _IN_GROUP))
    if tuple(sf.shape) != want:
        raise fail(op, f"x[1] (sf) has shape {tuple(sf.shape)}; for data of shape {tuple(data.shape)} with "
                       f"{_IN_GROUP} channels per scale it must be {want} (one scale per token and 128 channels)")
    if not sf.is_contiguous():
        raise fail(op, f"x[1] (sf) must be row-major contiguous (got strides {tuple(sf.stride())}); column-major "
                       f"and packed UE8M0 input scales are not supported here: pass sf.contiguous()")
    check_aligned(op, "x[1] (sf)", sf, 4)
    return data, sf


def _check_pos(op: str, pos_to_token: Any) -> None:
    check_tensor(op, "pos_to_token", pos_to_token, (torch.int32,), 1)
    if not pos_to_token.is_contiguous():
        raise fail(op, f"pos_to_token must be contiguous (stride {pos_to_token.stride(0)}); "
                       "pass pos_to_token.contiguous()")
    check_aligned(op, "pos_to_token", pos_to_token, 4)


def _fused(op: str, x: Any, fmt: Any, num_per_tokens: Any, round_sf: Any, num_per_channels: Any,
           pos_to_token: Any) -> QuantTensor:
    check_fmt(op, fmt, ("e4m3",))
    _check_int(op, "num_per_tokens", num_per_tokens, (128,))
    round_sf = check_flag(op, "round_sf", round_sf)
    if isinstance(x, tuple):
        data, sf = _check_quantized(op, x, num_per_channels)
    else:
        if num_per_channels is not None:
            raise fail(op, f"num_per_channels={num_per_channels!r} is only for a quantized (data, sf) input; "
                           "pass num_per_channels=None with a plain tensor")
        _check_matrix(op, "x", x, _PLAIN_DTYPES, _HIDDEN_ALIGN)
        data, sf = x, None
    if pos_to_token is not None:
        _check_pos(op, pos_to_token)
    check_cuda(op, x=data, sf=sf, pos_to_token=pos_to_token)

    num_tokens, hidden = data.shape
    num_out = num_tokens if pos_to_token is None else pos_to_token.size(0)
    out = torch.empty((num_out, hidden), dtype=_E4M3, device=data.device)
    out_sf = torch.empty((_cdiv(num_out, 128), hidden), dtype=torch.float32, device=data.device)
    if num_out and hidden:
        if sf is None and pos_to_token is None and data.dtype == torch.bfloat16:
            fn = launcher(_PLAIN_BF16, in_dtype="bfloat16", expand=False)
        else:
            fn = launcher(_FUSED, in_dtype=_DTYPE_KEY[data.dtype], expand=pos_to_token is not None)
        fn(data, out, out_sf,
           aligned_input(sf) if sf is not None else _dummy(data.device, torch.float32, 2),
           aligned_input(pos_to_token) if pos_to_token is not None else _dummy(data.device, torch.int32, 1),
           int(round_sf))
    return out, out_sf


def per_channel_cast(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False) -> QuantTensor:
    """Cast ``x [num_tokens, hidden]`` (bf16/fp32, contiguous) to e4m3 with one scale per
    ``num_per_tokens`` (128) tokens of each channel.

    Returns ``(out [num_tokens, hidden] e4m3, out_sf [ceil(num_tokens / 128), hidden] fp32)``,
    both contiguous; ``out_sf`` holds dequantization scales.  ``round_sf`` rounds the scales up
    to powers of two.  Raises :class:`tilebin.runtime.ArgumentError` for any unsupported input.
    """
    if is_compiling() and not TRACING.on:
        return traced("per_channel_cast", x, fmt, num_per_tokens, round_sf)
    if isinstance(x, tuple):
        raise fail("per_channel_cast", "x must be a plain bf16/fp32 tensor; for a quantized (data, sf) input "
                                       "use per_channel_cast_fused(..., num_per_channels=128)")
    return _fused("per_channel_cast", x, fmt, num_per_tokens, round_sf, None, None)


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
    if is_compiling() and not TRACING.on:
        return traced("per_channel_cast_fused", x, fmt, num_per_tokens, round_sf, num_per_channels, pos_to_token)
    return _fused("per_channel_cast_fused", x, fmt, num_per_tokens, round_sf, num_per_channels, pos_to_token)


def per_channel_cast_and_transpose(x: torch.Tensor, fmt: str, num_per_tokens: int,
                                   round_sf: bool = False) -> QuantTensor:
    """Cast bf16 ``x [num_tokens, hidden]`` to e4m3 and transpose it, one scale per
    ``num_per_tokens`` (32 or 128) tokens of each channel.

    Returns ``(out [hidden, num_tokens] e4m3 contiguous, out_sf [ceil(num_tokens /
    num_per_tokens), hidden] fp32)``; ``out.T`` equals :func:`per_channel_cast`'s ``out`` for
    128.  ``hidden % 64 == 0`` is required.
    """
    if is_compiling() and not TRACING.on:
        return traced("per_channel_cast_and_transpose", x, fmt, num_per_tokens, round_sf)
    op = "per_channel_cast_and_transpose"
    check_fmt(op, fmt, ("e4m3",))
    _check_int(op, "num_per_tokens", num_per_tokens, (32, 128))
    round_sf = check_flag(op, "round_sf", round_sf)
    _check_matrix(op, "x", x, (torch.bfloat16,), _TRANSPOSE_HIDDEN_ALIGN)
    check_cuda(op, x=x)

    num_tokens, hidden = x.shape
    out = torch.empty((hidden, num_tokens), dtype=_E4M3, device=x.device)
    out_sf = torch.empty((_cdiv(num_tokens, num_per_tokens), hidden), dtype=torch.float32, device=x.device)
    if num_tokens and hidden:
        launcher(_TRANSPOSE, num_per_tokens=num_per_tokens)(x, out, out_sf, int(round_sf))
    return out, out_sf


# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (
    TorchOp("per_channel_cast", "(Tensor x, str fmt, int num_per_tokens, bool round_sf=False) -> (Tensor, Tensor)",
            per_channel_cast),
    TorchOp("per_channel_cast_fused", "(Tensor x, Tensor? x_sf, str fmt, int num_per_tokens, bool round_sf=False, "
                                      "int? num_per_channels=None, Tensor? pos_to_token=None) -> (Tensor, Tensor)",
            per_channel_cast_fused, to_schema=pair_to_schema, to_public=pair_to_public),
    TorchOp("per_channel_cast_and_transpose", "(Tensor x, str fmt, int num_per_tokens, bool round_sf=False) -> "
                                              "(Tensor, Tensor)", per_channel_cast_and_transpose),
)


__all__ = ["per_channel_cast", "per_channel_cast_fused", "per_channel_cast_and_transpose"]
