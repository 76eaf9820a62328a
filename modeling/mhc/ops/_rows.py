"""Argument checks of the mHC stream ops (expand, pre_apply_mix, post, head_compute_mix).

Each raises :class:`tilebin.runtime.ArgumentError` through ``ops._common.fail``: the op, the
argument, the value received, what is supported and the fix.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import aligned_input, check_tensor, fail

BF16 = (torch.bfloat16,)
FP32 = (torch.float32,)
MHC_VALUES = (2, 4, 8)  # the compiled stream counts (mhc 4 is the model's)
HIDDEN_ALIGN = 8  # 16-byte vectors of bf16
MAX_ELEMENTS = 2**31 - 1  # the kernels index in int32
STASH = "grad_from_mhc_post"  # storage attribute: the residual gradient mhc_post's backward leaves


def check_mhc(op: str, name: str, mhc: int, supported: tuple = MHC_VALUES) -> int:
    """``mhc`` (a stream count read from a shape or passed as an int) is one of ``supported``."""
    if isinstance(mhc, bool) or not isinstance(mhc, int) or mhc not in supported:
        raise fail(op, f"{name}={mhc!r} is not supported; supported: mhc_mult in {supported} "
                       "(4 is the model's; other counts need a new kernel variant)")
    return mhc


def check_hidden(op: str, name: str, t: torch.Tensor) -> int:
    """The last dim of ``t`` is a positive multiple of 8 (16-byte vectors of bf16)."""
    hidden = t.shape[-1]
    if hidden <= 0 or hidden % HIDDEN_ALIGN:
        raise fail(op, f"{name} has shape {tuple(t.shape)}; its last dim (hidden={hidden}) must be a positive "
                       f"multiple of {HIDDEN_ALIGN} (1280, 2560, 4096, 7168 and every multiple of 64 up to 8192 "
                       "are tested)")
    return hidden


def check_size(op: str, name: str, t: torch.Tensor) -> None:
    """At most 2**31 - 1 elements (int32 indexing)."""
    if t.numel() > MAX_ELEMENTS:
        raise fail(op, f"{name} has {t.numel()} elements, more than 2**31 - 1; split the tokens into chunks")


def check_shape(op: str, name: str, t: torch.Tensor, shape: tuple, why: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise fail(op, f"{name} has shape {tuple(t.shape)}, want {tuple(shape)} ({why})")


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    """A bf16 stream input the kernels read in 16-byte vectors must be contiguous (a view that
    starts at a misaligned address is fine: :func:`aligned_input` copies it after the checks)."""
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}); "
                       f"call {name}.contiguous()")


def small_input(t: torch.Tensor) -> torch.Tensor:
    """A small fp32 mix tensor as the kernels read it: contiguous and 16-byte aligned (copied if
    not: a few bytes per token)."""
    return aligned_input(t.contiguous())


def check_out(op: str, out: Any, shape: tuple, dtype: torch.dtype, device: torch.device,
              inputs: dict) -> None:
    """A preallocated output: a contiguous tensor of ``shape`` and ``dtype`` on ``device``,
    16-byte aligned, overlapping no input."""
    check_tensor(op, "out", out, (dtype,), len(shape))
    check_shape(op, "out", out, shape, "the shape the op returns")
    if not out.is_contiguous():
        raise fail(op, f"out must be contiguous (strides {tuple(out.stride())}); pass a fresh torch.empty of shape "
                       f"{tuple(shape)}")
    if out.numel() and out.data_ptr() % 16:
        raise fail(op, f"out's data pointer {out.data_ptr():#x} is not 16-byte aligned; pass a fresh torch.empty")
    if out.device != device:
        raise fail(op, f"out is on {out.device} but the inputs are on {device}; allocate it on {device}")
    if out.numel():
        lo, hi = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        for name, t in inputs.items():
            if t is not None and t.numel() and t.device == out.device:
                a = t.data_ptr()
                b = a + t.numel() * t.element_size()
                if a < hi and lo < b:
                    raise fail(op, f"out overlaps {name} in memory; the op is not in place: pass a separate tensor")


_B16, _F32 = torch.bfloat16, torch.float32


def device_ok(t: torch.Tensor) -> bool:
    """The fast paths' device test (a CUDA tensor); the CPU tests replace it to run those paths."""
    return t.is_cuda


def plain(*tensors: torch.Tensor) -> bool:
    """The fast paths' shared facts: every tensor contiguous, 16-byte aligned, on one CUDA device,
    at most 2**31 - 1 elements.  (Shapes and dtypes are each op's own test.)  Stricter than the
    checks is safe: a False only costs the checked path, which raises what it always raised."""
    dev = None
    for t in tensors:
        if not (t.is_contiguous() and device_ok(t) and not t.data_ptr() % 16 and t.numel() <= MAX_ELEMENTS):
            return False
        d = t.get_device()
        if dev is None:
            dev = d
        elif d != dev:
            return False
    return True


def plain_streams(t: Any) -> tuple[int, int] | None:
    """``(mhc, hidden)`` of a bf16 ``[..., M, H]`` tensor with ``M`` in :data:`MHC_VALUES` and ``H``
    a positive multiple of 8, else None (the caller then takes the checked path)."""
    if not isinstance(t, torch.Tensor) or t.dtype is not _B16 or t.dim() < 2:
        return None
    m, h = t.shape[-2:]
    if m not in MHC_VALUES or h <= 0 or h % HIDDEN_ALIGN:
        return None
    return m, h


__all__ = ["BF16", "FP32", "MAX_ELEMENTS", "MHC_VALUES", "STASH", "aligned_input", "check_contiguous",
           "check_hidden", "check_mhc", "check_out", "check_shape", "check_size", "device_ok", "plain",
           "plain_streams", "small_input"]
