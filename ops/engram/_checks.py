"""Argument checks shared by the Engram ops: each raises an ArgumentError naming the op, the
argument, the value received, what is supported and the fix (``ops._common.fail``)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .._common import TRACING, check_tensor, fail, ptr
from .._spec import Param

MAX_HIDDEN = 8192  # the gate kernels keep a row in registers: hidden <= 256 threads x 32 values
HIDDEN_ALIGN = 8  # 16-byte vectors of bf16
MAX_ELEMENTS = 2**31 - 1
_INT32_MAX = 2**31 - 1
_FP32_MAX = 3.4028234663852886e38
BF16 = (torch.bfloat16,)
FP32 = (torch.float32,)


def check_float(op: str, name: str, value: Any, lo: float = 0.0) -> float:
    """``value`` as a Python float: an int or float (bool refused), finite in fp32, ``>= lo``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(op, f"{name} must be a float, got {type(value).__name__} {value!r}")
    value = float(value)
    if not (math.isfinite(value) and abs(value) <= _FP32_MAX and value >= lo):
        raise fail(op, f"{name}={value!r} is out of range; supported: a finite float32 value >= {lo}")
    return value


def check_bool(op: str, name: str, value: Any) -> bool:
    """``value`` must be a bool (``True``/``False``; ints are refused, as in a typed signature)."""
    if type(value) is not bool:
        raise fail(op, f"{name} must be a bool, got {type(value).__name__} {value!r}; pass True or False")
    return value


def float_param(name: str) -> Param:
    """A float parameter checked by :func:`check_float` (keyed by type and bits, inline: OpSpec's key)."""
    return Param(name, "float", lambda op, value: check_float(op, name, value))


def bool_param(name: str, default: str) -> Param:
    """A bool parameter checked by :func:`check_bool` (ints refused); ``default`` as the schema writes it."""
    return Param(name, "bool", lambda op, value: check_bool(op, name, value), default=default)


def aligned(*tensors: torch.Tensor, align: int = 16) -> bool:
    """Every tensor's data pointer is a multiple of ``align`` bytes (True for fake tensors while
    tracing: they have no memory).  A per-call test; the checks below say what is wrong."""
    if TRACING.on:
        return True
    bits = 0
    for t in tensors:
        bits |= t.data_ptr()
    return not bits % align


def rows_ok(t: torch.Tensor) -> bool:
    """A per-call test stricter than :func:`check_strided_rows`' stride rules: contiguous, or the last
    stride 1 and every other stride a non-negative multiple of 8 below 2**31 (whatever its size)."""
    if t.is_contiguous():
        return True
    *lead, last = t.stride()
    return last == 1 and all(0 <= s <= _INT32_MAX and not s % HIDDEN_ALIGN for s in lead)


def check_contiguous(op: str, name: str, t: torch.Tensor, dtypes: tuple, shape: tuple | None = None,
                     ndim: int | None = None, align: int = 16) -> None:
    """A contiguous, ``align``-byte aligned tensor of ``dtypes`` with ``ndim`` dims (or exactly ``shape``)."""
    check_tensor(op, name, t, dtypes, len(shape) if shape is not None else ndim)
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise fail(op, f"{name} has shape {tuple(t.shape)}, want {tuple(shape)} (it must match the other arguments)")
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}); "
                       f"call {name}.contiguous()")
    check_base(op, name, t, align)


def check_base(op: str, name: str, t: torch.Tensor, align: int = 16) -> None:
    """``align``-byte aligned data and at most 2**31 - 1 elements."""
    if t.numel() > MAX_ELEMENTS:
        raise fail(op, f"{name} has {t.numel()} elements, more than 2**31 - 1; split the tokens")
    if t.numel() and ptr(t) % align:
        raise fail(op, f"{name}'s data pointer {t.data_ptr():#x} is not {align}-byte aligned; pass {name}.clone()")


def check_hidden(op: str, name: str, hidden: int, max_hidden: int | None = MAX_HIDDEN) -> None:
    """``hidden`` is a positive multiple of 8 (and at most ``max_hidden``)."""
    top = max_hidden if max_hidden is not None else MAX_ELEMENTS
    if hidden <= 0 or hidden % HIDDEN_ALIGN or hidden > top:
        limit = f" up to {max_hidden}" if max_hidden is not None else ""
        raise fail(op, f"{name} has hidden size {hidden}; supported: multiples of {HIDDEN_ALIGN}{limit} "
                       "(every multiple of 64 from 576 to 8192 is tested)")


def check_strided_rows(op: str, name: str, t: torch.Tensor, shape: tuple) -> tuple[int, ...]:
    """A bf16 tensor of exactly ``shape`` whose last dim is contiguous and whose other strides are
    non-negative multiples of 8 elements below 2**31 (dims of size 1 may have any stride; 0 is
    reported for them); 16-byte aligned.  Returns the strides the kernel is given."""
    check_tensor(op, name, t, BF16, len(shape))
    if tuple(t.shape) != tuple(shape):
        raise fail(op, f"{name} has shape {tuple(t.shape)}, want {tuple(shape)} (it must match hidden_states)")
    if t.is_contiguous():  # the common case: every stride is a multiple of hidden (checked by the caller)
        check_base(op, name, t)
        return tuple(t.stride())
    strides = []
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise fail(op, f"{name} has strides {tuple(t.stride())}; supported: dim {len(shape) - 1} stride 1 "
                       f"(the last dim contiguous); pass {name}.contiguous()")
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if size <= 1:
            strides.append(0 if d < len(shape) - 1 else 1)
            continue
        want_unit = d == len(shape) - 1
        if (stride != 1) if want_unit else (stride < 0 or stride % HIDDEN_ALIGN or stride > _INT32_MAX):
            need = "1" if want_unit else "non-negative multiples of 8 elements (16 bytes) below 2**31"
            raise fail(op, f"{name} has strides {tuple(t.stride())}; supported: dim {d} stride {need} "
                           f"(the last dim contiguous); pass {name}.contiguous()")
        strides.append(stride)
    if t.numel() and ptr(t) % 16:
        raise fail(op, f"{name}'s data pointer {t.data_ptr():#x} is not 16-byte aligned (vector loads); "
                       f"pass {name}.contiguous() of an aligned copy ({name}.clone())")
    return tuple(strides)


def check_disjoint(op: str, outputs: dict, inputs: dict) -> None:
    """In-place outputs overlap neither each other nor any input (byte ranges of the storages).
    Fake tensors (tracing) have no addresses: nothing to check."""
    if TRACING.on:
        return
    def span(t):
        return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()

    names = list(outputs.items())
    others = names + list(inputs.items())
    for i, (name, t) in enumerate(names):
        if not t.numel():
            continue
        lo, hi = span(t)
        for other, u in others[i + 1:]:
            if u.numel() and u.device == t.device:
                a, b = span(u)
                if a < hi and lo < b:
                    raise fail(op, f"{name} overlaps {other} in memory; it is written in place: pass separate tensors")


__all__ = ["BF16", "FP32", "MAX_HIDDEN", "aligned", "bool_param", "check_base", "check_bool", "check_contiguous",
           "check_disjoint", "check_float", "check_hidden", "check_strided_rows", "float_param", "rows_ok"]
