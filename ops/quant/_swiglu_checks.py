"""Argument checks of the SwiGLU ops (``_swiglu``): each raises an ArgumentError naming the op, the
argument, the value received and the fix (``ops._common.fail``).  No GPU work."""

from __future__ import annotations

from typing import Any

import torch

from .._common import check_aligned, check_float32, check_tensor, fail


def check_float(op: str, name: str, value: Any, default: float) -> float:
    """``value`` as a float (``default`` when None); real numbers only, NaN refused."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise fail(op, f"{name} must be a float or None, got {type(value).__name__} {value!r}")
    return check_float32(op, name, value)  # beyond float32's range: +-inf, as the kernel's float32 holds it


def check_contiguous(op: str, name: str, t: torch.Tensor, align: int = 16) -> None:
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (got strides {tuple(t.stride())} for shape {tuple(t.shape)}); "
                       f"pass {name}.contiguous()")
    check_aligned(op, name, t, align)


def check_vector(op: str, name: str, t: Any, length: int, dtype: torch.dtype = torch.int32) -> None:
    check_tensor(op, name, t, (dtype,), 1)
    if t.size(0) != length:
        raise fail(op, f"{name} has {t.size(0)} entries; it needs one per row of x ({length})")
    check_contiguous(op, name, t, 4)


def check_bwd_x(op: str, x: Any, num_per_channels: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The backward's forward input ``(data, sf)``: e4m3 ``[..., 2h]`` (2-D or 3-D), fp32
    ``[rows, 2h / npc]``.  Returns ``(data as [rows, 2h], sf, h)``."""
    if not (isinstance(x, tuple) and len(x) == 2):
        raise fail(op, f"x must be a (data, sf) pair (the quantized forward input), got {type(x).__name__}")
    data, sf = x
    check_tensor(op, "x[0] (data)", data, (torch.float8_e4m3fn,))
    if data.dim() not in (2, 3):
        raise fail(op, f"x[0] (data) must be 2-D or 3-D, got shape {tuple(data.shape)}")
    check_contiguous(op, "x[0] (data)", data)
    if data.size(-1) == 0 or data.size(-1) % (2 * num_per_channels):
        raise fail(op, f"x[0] (data) has {data.size(-1)} channels; it needs 2 * hidden with hidden a multiple of "
                       f"num_per_channels={num_per_channels}")
    hidden = data.size(-1) // 2
    rows = data.numel() // max(data.size(-1), 1)
    check_tensor(op, "x[1] (sf)", sf, (torch.float32,), 2)
    want = (rows, 2 * hidden // num_per_channels)
    if tuple(sf.shape) != want:
        raise fail(op, f"x[1] (sf) has shape {tuple(sf.shape)}; it must be {want} (one scale per row and "
                       f"{num_per_channels} channels)")
    if not sf.is_contiguous():
        raise fail(op, f"x[1] (sf) must be row-major contiguous (got strides {tuple(sf.stride())}); column-major "
                       "and packed UE8M0 scales are not supported here: pass sf.contiguous()")
    return data.view(rows, 2 * hidden), sf, hidden


__all__ = ["check_bwd_x", "check_contiguous", "check_float", "check_vector"]
