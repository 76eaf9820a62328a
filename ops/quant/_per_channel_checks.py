"""The argument checks of the per-channel casts (``ops/quant/_per_channel.py``), in the wording
those ops have always used.

``check_*`` and :func:`fused_x` run on a configuration's first call; :func:`fused_x_call` on
every later one (the ``x`` Param's ``call_check``): a cheap test first (:func:`irregular`), then,
only where it fails, the first call's check, which raises the first call's message.
"""

from __future__ import annotations

from typing import Any

import torch

from .._common import SOLE_GPU, check_aligned, check_tensor, fail
from ._per_block_checks import irregular

IN_GROUP = 128  # channels per input scale of a quantized input (num_per_channels)
HIDDEN_ALIGN = 16  # fused kernel: 16 channels per thread (16-byte e4m3 stores)
PLAIN_DTYPES = (torch.bfloat16, torch.float32)
_E4M3 = torch.float8_e4m3fn


def check_int(op: str, name: str, value: Any, allowed: tuple[int, ...]) -> int:
    """``value``, a Python int (bools refused) among ``allowed``."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
        raise fail(op, f"{name}={value!r} is not supported; supported: {', '.join(map(str, allowed))}")
    return value


def check_matrix(op: str, name: str, t: Any, dtypes: tuple, align: int) -> None:
    """A 2-D contiguous tensor of ``dtypes`` with ``hidden % align == 0`` and an aligned pointer."""
    check_tensor(op, name, t, dtypes, 2)
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (got strides {tuple(t.stride())} for shape {tuple(t.shape)}); "
                       f"pass {name}.contiguous()")
    if t.size(1) % align:
        raise fail(op, f"{name} has hidden size {t.size(1)}; this op needs a multiple of {align} "
                       f"(pad the hidden dimension)")
    check_aligned(op, name, t)


def check_pos(op: str, pos_to_token: Any) -> None:
    check_tensor(op, "pos_to_token", pos_to_token, (torch.int32,), 1)
    if not pos_to_token.is_contiguous():
        raise fail(op, f"pos_to_token must be contiguous (stride {pos_to_token.stride(0)}); "
                       "pass pos_to_token.contiguous()")
    check_aligned(op, "pos_to_token", pos_to_token, 4)


def _check_pair(op: str, x: tuple) -> None:
    """A ``(data, sf)`` input: e4m3 data, fp32 row-major sf of one scale per 128 channels."""
    data, sf = x
    check_matrix(op, "x[0] (data)", data, (_E4M3,), HIDDEN_ALIGN)
    check_tensor(op, "x[1] (sf)", sf, (torch.float32,), 2)
    want = (data.size(0), -(-data.size(1) // IN_GROUP))
    if tuple(sf.shape) != want:
        raise fail(op, f"x[1] (sf) has shape {tuple(sf.shape)}; for data of shape {tuple(data.shape)} with "
                       f"{IN_GROUP} channels per scale it must be {want} (one scale per token and 128 channels)")
    if not sf.is_contiguous():
        raise fail(op, f"x[1] (sf) must be row-major contiguous (got strides {tuple(sf.stride())}); column-major "
                       f"and packed UE8M0 input scales are not supported here: pass sf.contiguous()")
    check_aligned(op, "x[1] (sf)", sf, 4)


def fused_x(op: str, x: Any) -> Any:
    """per_channel_cast_fused's ``x``: a bf16/fp32 tensor, or a ``(data, sf)`` pair
    (``num_per_channels`` is checked against its form in the op's relations)."""
    if isinstance(x, tuple):
        if len(x) != 2:
            raise fail(op, f"a quantized input must be a (data, sf) pair, got a tuple of {len(x)}")
        _check_pair(op, x)
    else:
        check_matrix(op, "x", x, PLAIN_DTYPES, HIDDEN_ALIGN)
    return x


def fused_x_key(x: Any) -> tuple:
    """``x``'s part of the memo key: dtype, device, rank and sizes but the first of the tensor, or
    of both tensors of a pair.  TypeError for anything else (the checked path says why)."""
    if isinstance(x, tuple):
        if len(x) != 2:
            raise TypeError("not a (data, sf) pair")
        data, sf = x
        if not isinstance(data, torch.Tensor) or not isinstance(sf, torch.Tensor):
            raise TypeError("not a pair of tensors")
        s, t = data.shape, sf.shape
        one = SOLE_GPU.on  # a device's key part: is_cuda where the process has one GPU
        return (data.dtype, data.is_cuda if one else data.device, len(s), s[-1] if len(s) == 2 else s[1:],
                sf.dtype, sf.is_cuda if one else sf.device, len(t), t[-1] if len(t) == 2 else t[1:])
    if not isinstance(x, torch.Tensor):
        raise TypeError("not a tensor")
    s = x.shape
    return x.dtype, x.is_cuda if SOLE_GPU.on else x.device, len(s), s[-1] if len(s) == 2 else s[1:]


def fused_x_call(op: str, x: Any) -> None:
    """What a replayed call checks of ``x`` (its Param's ``call_check``, never given fake
    tensors): the tensor (or the pair's data) contiguous and 16-byte aligned; a pair's sf of this
    call's token count, contiguous and 4-byte aligned."""
    if isinstance(x, tuple):
        data, sf = x
        if irregular(data, 16) or sf.shape[0] != data.shape[0] or irregular(sf, 4):
            _check_pair(op, x)
    elif not x.is_contiguous() or x.data_ptr() & 15 or x.stride(1) != 1 and x.shape[1] > 1:  # irregular(x, 16)
        check_matrix(op, "x", x, PLAIN_DTYPES, HIDDEN_ALIGN)
