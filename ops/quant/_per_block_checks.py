"""The argument checks of the per-block casts (``ops/quant/_per_block.py``), as OpSpec parameters
and per-call checks, in the wording those ops have always used.

``check_*`` functions run on a configuration's first call; the ``*_per_call`` functions run on
every call (the OpSpec's ``per_call``): a cheap test first (e.g. :func:`irregular`), then, only
where it fails, the first call's check, which raises the first call's message.
"""

from __future__ import annotations

from typing import Any

import torch

from .._common import SOLE_GPU, check_aligned, fail, ptr
from .._spec import Param, block_key
from ._sf import check_fmt, input_sf

BLOCKS = ((128, 128), (32, 32))
LOSSLESS_IN_BLOCK = (1, 32)
LOSSLESS_OUT_BLOCKS = ((1, 128), (32, 32), (128, 128))
HIDDEN_ALIGN = 64
_INT32_MAX = 2**31 - 1


def check_block(op: str, name: str, value: Any, allowed: tuple) -> tuple[int, int]:
    """``value`` as one of the ``allowed`` pairs of Python ints (a tuple or list of two ints;
    bools and floats refused)."""
    block = None
    if type(value) in (tuple, list) and all(type(v) is int for v in value):
        block = tuple(value)
    if block not in allowed:
        raise fail(op, f"{name}={value!r} is not supported; supported: {', '.join(map(str, allowed))}")
    return block


def block_param(name: str, allowed: tuple, pair_input: bool = False) -> Param:
    """An ``int[]`` block size, one of ``allowed`` (checked value: a tuple), keyed by ``block_key``.
    ``pair_input``: the block of a quantized ``(data, sf)`` input, which must be a tuple of two first."""

    def check(op: str, value: Any) -> tuple[int, int]:
        if pair_input and not (isinstance(value, tuple) and len(value) == 2):
            raise fail(op, f"{name} must be a (rows, cols) tuple for a quantized input, got {value!r}")
        return check_block(op, name, value, allowed)

    return Param(name, "int[]", check, key_of=block_key)


def fmt_param(allowed: tuple[str, ...] = ("e4m3", "e2m1")) -> Param:
    """``fmt``, one of ``allowed`` (a str Param without ``key_of``: OpSpec keys it inline)."""
    return Param("fmt", "str", lambda op, value: check_fmt(op, value, allowed))


def check_rows(op: str, name: str, t: torch.Tensor, hidden: int) -> None:
    """2-D contiguous data, hidden a multiple of 64, int32 element counts, 16-byte aligned."""
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (strides {tuple(t.stride())}); call {name}.contiguous()")
    if hidden % HIDDEN_ALIGN:
        raise fail(op, f"hidden={hidden} is not a multiple of {HIDDEN_ALIGN}; supported: hidden % {HIDDEN_ALIGN} == 0 "
                       f"(e.g. 576, 2048, 7168); pad the channels")
    if t.shape[0] * hidden > _INT32_MAX:
        raise fail(op, f"{name} has {t.shape[0]} x {hidden} elements, more than 2**31 - 1; split the tokens")
    check_aligned(op, name, t)


def irregular(t: torch.Tensor, align: int) -> bool:
    """What the first call's contiguity and alignment checks would refuse, or might: not
    contiguous, a pointer not ``align``-aligned, or a last-dim stride other than 1 (an empty
    tensor is "contiguous" whatever its strides, but ``check_aligned`` refuses that)."""
    return not t.is_contiguous() or ptr(t) % align or t.stride(-1) != 1 and t.size(-1) > 1


# ------------------------------------------------------------------------------ precomputed sf
def precomputed_per_call(op: str, args: tuple) -> None:
    """``sf`` has one scale per block of this call's tokens: ``[ceil(tokens / b0), ceil(hidden / b1)]``."""
    x, block, sf = args[0], args[2], args[3]
    tokens, hidden = x.shape
    want = (-(-tokens // block[0]), -(-hidden // block[1]))
    if sf.shape != want:
        raise fail(op, f"sf has shape {tuple(sf.shape)}; for x of {tokens} x {hidden} and block_size {tuple(block)} "
                       f"it must be {want} (row-major fp32, one scale per block)")


# ------------------------------------------------------------------------------------ lossless
def lossless_x(op: str, x: Any) -> Any:
    """The lossless cast's input: a ``(data, sf)`` pair (:func:`._sf.input_sf`) of packed e2m1
    2-D data; the rows and the scales' shape are checked per call (:func:`lossless_per_call`)."""
    data = input_sf(op, x, LOSSLESS_IN_BLOCK)[0]
    if data.dtype not in (torch.int8, torch.uint8):
        raise fail(op, f"data has dtype {data.dtype}; supported: int8/uint8 (packed e2m1); "
                       "the lossless cast reads e2m1 only")
    if data.dim() != 2:
        raise fail(op, f"data must be 2-D, got shape {tuple(data.shape)}")
    return x


def lossless_x_key(x: Any) -> tuple:
    """The pair's part of the memo key: data's dtype, device, rank and sizes but the first; sf's
    dtype, device, rank and the scale layout its strides give (the test :func:`._sf.input_sf`
    makes).  TypeError for anything but a pair of tensors (the checked path says why)."""
    if not isinstance(x, tuple) or len(x) != 2:
        raise TypeError("not a (data, sf) pair")
    data, sf = x
    if not isinstance(data, torch.Tensor) or not isinstance(sf, torch.Tensor):
        raise TypeError("not a pair of tensors")
    s, strides = data.shape, sf.stride()
    layout = "col" if strides[0] == 1 else strides[-1] == 1  # input_sf's test: column-major, else row-major or not
    one = SOLE_GPU.on  # a device's key part: is_cuda where the process has one GPU
    return (data.dtype, data.is_cuda if one else data.device, len(s), s[-1] if len(s) == 2 else s[1:], sf.dtype,
            sf.is_cuda if one else sf.device, len(strides), layout)


def lossless_per_call(op: str, args: tuple) -> None:
    """The data's rows (:func:`check_rows`) and the scales' shape for this call's tokens."""
    x = args[0]
    data, sf = x
    tokens, hidden = data.shape[0], data.shape[1] * 2
    if hidden % HIDDEN_ALIGN or irregular(data, 16) or tokens * hidden > _INT32_MAX:
        check_rows(op, "data", data, hidden)
    groups = -(-hidden // LOSSLESS_IN_BLOCK[1])
    packed = sf.dtype == torch.int32  # column-major packed UE8M0: four scales per int32
    if sf.shape != (tokens, -(-groups // 4) if packed else groups):  # the user-side shape of every layout
        _check_sf_shape(op, x, tokens, hidden)


def _check_sf_shape(op: str, x: tuple, tokens: int, hidden: int) -> None:
    _, x_sf, layout = input_sf(op, x, LOSSLESS_IN_BLOCK)
    want = layout.shape(tokens, hidden)
    if tuple(x_sf.shape) != want:
        raise fail(op, f"the input sf ({layout.kind} layout) has kernel-side shape {tuple(x_sf.shape)}; for data of "
                       f"{tokens} x {hidden} values and x_block_size {LOSSLESS_IN_BLOCK} it must be {want}")
