"""Argument checks of the fused MoE routing ops (``_routing``): each raises an ArgumentError naming
the op, the argument, the value received and the fix (``ops._common.fail``).  No GPU work."""

from __future__ import annotations

from typing import Any

import torch

from .._common import check_tensor, fail, ptr


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}); "
                       f"call {name}.contiguous()")


def check_rows(op: str, name: str, t: torch.Tensor) -> None:
    """Contiguous, rows of a multiple of 16 bytes, 16-byte aligned pointer (vector copies)."""
    check_contiguous(op, name, t)
    if (t.size(1) * t.element_size()) % 16:
        per = 16 // t.element_size()
        raise fail(op, f"{name} has hidden size {t.size(1)} ({str(t.dtype).removeprefix('torch.')}); this op "
                       f"needs hidden % {per} == 0 (rows of a multiple of 16 bytes): pad the hidden dimension")
    if ptr(t) % 16:
        raise fail(op, f"{name}'s data pointer {t.data_ptr():#x} is not 16-byte aligned; pass {name}.clone()")


def check_mapping(op: str, token_topk_to_pos: Any, num_tokens: int, pos_to_expert: Any) -> None:
    """The slot maps of the expand ops: both are required tensors (``None`` is an ArgumentError)."""
    check_tensor(op, "token_topk_to_pos", token_topk_to_pos, (torch.int32,), 2)
    check_contiguous(op, "token_topk_to_pos", token_topk_to_pos)
    if token_topk_to_pos.size(0) != num_tokens:
        raise fail(op, f"token_topk_to_pos has {token_topk_to_pos.size(0)} rows but x has {num_tokens} tokens; "
                       "pass the token_topk_to_pos get_fused_mapping returned for these tokens")
    check_tensor(op, "pos_to_expert", pos_to_expert, (torch.int32,), 1)
    check_contiguous(op, "pos_to_expert", pos_to_expert)


def check_reduce_out(op: str, out: Any, shape: tuple, dtype: torch.dtype) -> None:
    """reduce_fused's preallocated ``out``: ``dtype``, ``shape``, rows as :func:`check_rows` wants."""
    check_tensor(op, "out", out, (dtype,), 2)
    if tuple(out.shape) != shape:
        raise fail(op, f"out has shape {tuple(out.shape)}; it must be {shape} (num_tokens, hidden)")
    check_rows(op, "out", out)


__all__ = ["check_contiguous", "check_mapping", "check_reduce_out", "check_rows"]
