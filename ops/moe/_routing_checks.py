"""Argument checks of the fused MoE routing ops (``_routing``): each raises an ArgumentError naming
the op, the argument, the value received and the fix (``ops._common.fail``).  No GPU work.

Besides the checks themselves: the ``(data, sf)`` / ``(x, x_sf)`` pairs' memo-key parts (a pair
is a ``Param``, whose tensors the spec does not key by itself) and each op's ``per_call`` check:
what a memoized configuration still checks on every call (token counts that must agree,
strides, data pointers; the expand and reduce ops declare their tensors without ``contiguous``
so that all of these run here, in one screen).  On any doubt a ``per_call`` runs the full
checks in the first call's order, so a refusal reads as on the first call.
"""

from __future__ import annotations

from typing import Any

import torch

from .._common import SOLE_GPU, check_int, check_tensor, fail, ptr

EXPAND_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float8_e4m3fn: "float8_e4m3fn"}
EXPAND_SF_DTYPES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.bfloat16: "bfloat16"}
SF_DTYPES = {torch.float32: "float32", torch.int32: "int32"}
REDUCE_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
_INT32_MAX = 2**31 - 1
_MAX_SLOTS = 2**30


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}); "
                       f"call {name}.contiguous()")


def check_rows(op: str, name: str, t: torch.Tensor) -> None:
    """Contiguous, rows of a multiple of 16 bytes, 16-byte aligned pointer (vector copies)."""
    check_contiguous(op, name, t)
    check_row_bytes(op, name, t)
    check_pointer(op, name, t)


def check_row_bytes(op: str, name: str, t: torch.Tensor) -> None:
    """Rows of a multiple of 16 bytes (the hidden size and dtype: part of a configuration)."""
    if (t.size(1) * t.element_size()) % 16:
        per = 16 // t.element_size()
        raise fail(op, f"{name} has hidden size {t.size(1)} ({str(t.dtype).removeprefix('torch.')}); this op "
                       f"needs hidden % {per} == 0 (rows of a multiple of 16 bytes): pad the hidden dimension")


def check_pointer(op: str, name: str, t: torch.Tensor) -> None:
    """A 16-byte aligned data pointer (vector copies; 0 while tracing)."""
    if ptr(t) % 16:
        raise fail(op, f"{name}'s data pointer {t.data_ptr():#x} is not 16-byte aligned; pass {name}.clone()")


def check_token_rows(op: str, token_topk_to_pos: torch.Tensor, num_tokens: int) -> None:
    """The expand ops' slot map has a row per token of x."""
    if token_topk_to_pos.shape[0] != num_tokens:
        raise fail(op, f"token_topk_to_pos has {token_topk_to_pos.shape[0]} rows but x has {num_tokens} tokens; "
                       "pass the token_topk_to_pos get_fused_mapping returned for these tokens")


def check_reduce_out(op: str, out: Any, shape: tuple, dtype: torch.dtype) -> None:
    """reduce_fused's preallocated ``out``: ``dtype``, ``shape``, rows as :func:`check_rows` wants."""
    check_tensor(op, "out", out, (dtype,), 2)
    if tuple(out.shape) != shape:
        raise fail(op, f"out has shape {tuple(out.shape)}; it must be {shape} (num_tokens, hidden)")
    check_rows(op, "out", out)


# ---------------------------------------------------------------- get_fused_mapping
def check_expanded(op: str, value: Any) -> int:
    return check_int(op, "num_expanded_tokens", value, 0)


def mapping_per_call(op: str, args: tuple) -> None:
    """num_expanded_tokens (only its type is in the memo key) and the slot count, on every call."""
    topk_idx, num_experts, num_expanded_tokens, alignment, _ = args
    if type(num_expanded_tokens) is not int or not 0 <= num_expanded_tokens <= _INT32_MAX:
        check_expanded(op, num_expanded_tokens)  # raises, or accepts an integer-like (a numpy int)
    if topk_idx.numel() + num_experts * (alignment - 1) > _MAX_SLOTS:
        num_tokens, num_topk = topk_idx.shape
        raise fail(op, f"{num_tokens} x {num_topk} entries plus {num_experts} x (alignment {alignment} - 1) padding "
                       "exceed 2**30 slots; split the tokens or lower the alignment")


# ---------------------------------------------------------------- expand_to_fused(_with_sf)
def expand_per_call(op: str, args: tuple) -> None:
    """Every call: the three tensors' strides, x's pointer, a slot-map row per token of x."""
    x, token_topk_to_pos, pos_to_expert = args
    if (not x.is_contiguous() or ptr(x) % 16 or not token_topk_to_pos.is_contiguous()
            or token_topk_to_pos.shape[0] != x.shape[0] or not pos_to_expert.is_contiguous()):
        check_contiguous(op, "x", x)
        check_pointer(op, "x", x)
        check_slot_maps(op, token_topk_to_pos, x.shape[0], pos_to_expert)


def check_slot_maps(op: str, token_topk_to_pos: torch.Tensor, num_tokens: int, pos_to_expert: torch.Tensor) -> None:
    """The expand ops' slot maps (dtypes and ranks checked): contiguous, a row per token."""
    check_contiguous(op, "token_topk_to_pos", token_topk_to_pos)
    check_token_rows(op, token_topk_to_pos, num_tokens)
    check_contiguous(op, "pos_to_expert", pos_to_expert)


def check_sf_pair(op: str, x: Any) -> tuple:
    """expand_to_fused_with_sf's ``(data, sf)``: each tensor's own checks."""
    if not (isinstance(x, tuple) and len(x) == 2):
        raise fail(op, f"x must be a (data, sf) tuple, got {type(x).__name__}; use expand_to_fused for a plain tensor")
    data, x_sf = x
    check_tensor(op, "x[0] (data)", data, tuple(EXPAND_SF_DTYPES), 2)
    check_rows(op, "x[0] (data)", data)
    check_tensor(op, "x[1] (sf)", x_sf, tuple(SF_DTYPES), 2)
    check_contiguous(op, "x[1] (sf)", x_sf)
    return x


def check_num_per_channels(op: str, value: Any) -> int:
    if type(value) is not int or value not in (32, 128):
        raise fail(op, f"num_per_channels={value!r} is not supported; supported: 32, 128")
    return value


def check_sf_layout(op: str, data: torch.Tensor, x_sf: torch.Tensor, num_per_channels: int, col: bool) -> None:
    """sf holds one row per token and the columns ``num_per_channels`` and its dtype give."""
    num_tokens, hidden = data.shape
    sf_cols = -(-hidden // num_per_channels)
    if x_sf.dtype == torch.int32:
        if not col:
            raise fail(op, "packed UE8M0 scales (int32 sf) need use_tma_aligned_col_major_sf=True (as in tile_kernels)")
        sf_cols = -(-sf_cols // 4)
    if tuple(x_sf.shape) != (num_tokens, sf_cols):
        raise fail(op, f"x[1] (sf) has shape {tuple(x_sf.shape)}; for data {tuple(data.shape)} with "
                       f"num_per_channels={num_per_channels} ({str(x_sf.dtype).removeprefix('torch.')}) it must be "
                       f"{(num_tokens, sf_cols)}; pass a row-major (.contiguous()) sf")


def sf_pair_key(x: Any) -> tuple:
    """The pair's memo-key part: each tensor's dtype, device, rank and last size (the checks want
    both 2-D: no other rank is ever stored); TypeError, AttributeError or IndexError (the checked
    path) for anything but a 2-tuple of tensors."""
    if type(x) is not tuple or len(x) != 2:
        raise TypeError("not a (data, sf) pair")
    data, x_sf = x
    ds, ss = data.shape, x_sf.shape
    one = SOLE_GPU.on  # a device's key part: is_cuda where the process has one GPU
    return (data.dtype, data.is_cuda if one else data.device, len(ds), ds[-1], x_sf.dtype,
            x_sf.is_cuda if one else x_sf.device, len(ss), ss[-1])


def expand_sf_per_call(op: str, args: tuple) -> None:
    """Every call: strides, data's pointer, and a row of sf and of the slot map per token of data."""
    (data, x_sf), num_per_channels, token_topk_to_pos, pos_to_expert, col = args
    num_tokens = data.shape[0]
    if (not data.is_contiguous() or ptr(data) % 16 or not x_sf.is_contiguous() or x_sf.shape[0] != num_tokens
            or not token_topk_to_pos.is_contiguous() or token_topk_to_pos.shape[0] != num_tokens
            or not pos_to_expert.is_contiguous()):
        check_sf_pair(op, args[0])
        if x_sf.shape[0] != num_tokens:
            check_sf_layout(op, data, x_sf, num_per_channels, col)
        check_slot_maps(op, token_topk_to_pos, num_tokens, pos_to_expert)


# ---------------------------------------------------------------- reduce_fused
def check_reduce_x(op: str, x: Any) -> Any:
    """reduce_fused's ``x``: fp32 / bf16 rows, or an ``(x, x_sf)`` pair with one fp32 scale per row."""
    data, x_sf = x, None
    if isinstance(x, tuple):
        if len(x) != 2:
            raise fail(op, f"a quantized x must be an (x, x_sf) pair, got a tuple of {len(x)}")
        data, x_sf = x
        if x_sf is None:
            raise fail(op, "x is an (x, x_sf) pair with x_sf None; pass the plain tensor x for unscaled rows, or "
                           "fp32 x_sf [slots]")
    check_tensor(op, "x", data, tuple(REDUCE_DTYPES), 2)
    check_rows(op, "x", data)
    if x_sf is not None:
        check_tensor(op, "x_sf", x_sf, (torch.float32,), 1)
        check_contiguous(op, "x_sf", x_sf)
        if x_sf.size(0) != data.size(0):
            raise fail(op, f"x_sf has {x_sf.size(0)} scales but x has {data.size(0)} rows; pass one fp32 scale per row")
    return x


def reduce_x_key(x: Any) -> tuple:
    """x's memo-key part: dtype, device, rank and last size (x is 2-D: no other rank is ever
    stored), and a pair's x_sf dtype, device and rank; TypeError, AttributeError or IndexError
    (the checked path) for anything else."""
    if type(x) is tuple:
        if len(x) != 2:
            raise TypeError("not an (x, x_sf) pair")
        data, x_sf = x
        s = data.shape
        one = SOLE_GPU.on
        return (tuple, data.dtype, data.is_cuda if one else data.device, len(s), s[-1], x_sf.dtype,
                x_sf.is_cuda if one else x_sf.device, x_sf.dim())
    s = x.shape
    return x.dtype, x.is_cuda if SOLE_GPU.on else x.device, len(s), s[-1]


def out_key(out: Any) -> Any:
    """reduce_fused's ``out``: None, or its dtype, device, rank and last size (2-D, as x)."""
    if out is None:
        return None
    s = out.shape
    return out.dtype, out.is_cuda if SOLE_GPU.on else out.device, len(s), s[-1]


def check_fp8_format(op: str, value: Any) -> str:
    if value != "" and value != "e4m3":
        raise fail(op, f"fp8_format={value!r} is not supported; supported: '' (x's dtype), 'e4m3'")
    return value


def reduce_out_dtype(fp8_format: str, data: torch.Tensor) -> torch.dtype:
    return torch.float8_e4m3fn if fp8_format == "e4m3" else data.dtype


def reduce_per_call(op: str, args: tuple) -> None:
    """Every call: x's and x_sf's strides, pointer and row counts, the strides of token_topk_to_pos
    and topk_weights, topk_weights' and out's token counts, out's strides and pointer."""
    x, topk_weights, token_topk_to_pos, fp8_format, _, out = args
    if isinstance(x, tuple):
        data, x_sf = x
        bad = x_sf.shape[0] != data.shape[0] or not x_sf.is_contiguous()
    else:
        data, bad = x, False
    if bad or not data.is_contiguous() or ptr(data) % 16:
        check_reduce_x(op, x)  # raises as the first call does
    if not token_topk_to_pos.is_contiguous():
        check_contiguous(op, "token_topk_to_pos", token_topk_to_pos)
    if topk_weights is not None:
        if not topk_weights.is_contiguous():
            check_contiguous(op, "topk_weights", topk_weights)
        if topk_weights.shape != token_topk_to_pos.shape:
            raise fail(op, f"topk_weights has shape {tuple(topk_weights.shape)} but token_topk_to_pos has "
                           f"{tuple(token_topk_to_pos.shape)}; they must match")
    if out is not None:
        num_tokens = token_topk_to_pos.shape[0]
        if (not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != num_tokens
                or not out.is_contiguous() or ptr(out) % 16):
            check_reduce_out(op, out, (num_tokens, data.shape[1]), reduce_out_dtype(fp8_format, data))


__all__ = ["EXPAND_DTYPES", "EXPAND_SF_DTYPES", "REDUCE_DTYPES", "SF_DTYPES", "check_contiguous", "check_expanded",
           "check_fp8_format", "check_num_per_channels", "check_pointer", "check_reduce_out", "check_reduce_x",
           "check_row_bytes", "check_rows", "check_sf_layout", "check_sf_pair", "check_slot_maps", "check_token_rows",
           "expand_per_call", "expand_sf_per_call", "mapping_per_call", "out_key", "reduce_out_dtype",
           "reduce_per_call", "reduce_x_key", "sf_pair_key"]
