"""The argument checks of the per-token casts (``ops/quant/_per_token.py``), in the order and
wording the ops have always used, and the parameter kinds their ``OpSpec`` declarations use.

The casts' checks depend on one another (a quantized ``(data, sf)`` input, ``fmt='e5m6'`` with its
own wording, ``num_per_channels`` against the hidden size, scales against the token count), so
their parameters declare the schema and the memo key only (:class:`Deferred`, :func:`deferred`)
and the whole sequence runs as the specs' ``relations`` (:func:`check_config`).  The checks that
read what a memo key leaves out (token counts that must agree, strides, pointers) are separate
functions (:func:`pair_call_checks`, :func:`scales_call_checks`) that the launches run again on
every call.  No launcher, device check or kernel constant is read here (the op modules do).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch

from .._common import SOLE_GPU, check_flag, check_tensor, fail, ptr
from .._spec import Param, TensorParam
from ._sf import SfLayout, check_fmt, input_sf, output_layout

PLAIN = {torch.bfloat16: "bfloat16", torch.float32: "float32"}  # plain input dtype -> kernel key
QUANTIZED = {torch.float8_e4m3fn: "float8_e4m3fn", torch.int8: "int8"}  # quantized data dtype -> kernel key
GROUPS = (16, 32, 64, 128)
HIDDEN_ALIGN = 16
WHOLE_ROW_SHIFT = 31  # group_shift for one scale per row: every channel index >> 31 is 0
INT32_MAX = 2**31 - 1


class Deferred(TensorParam):
    """A tensor parameter checked by the op's ``relations`` (the wording and the order of its
    checks depend on other arguments), not on its own: ``check`` passes the value through.  It
    keeps TensorParam's memo key (inline in the spec's generated key) and device check."""

    def check(self, op: str, value: Any) -> Any:
        return value


class Scales(Deferred):
    """Precomputed scales ``[tokens, groups]`` (or ``[groups, tokens]`` column-major): both sizes
    and the strides are checked on every call (:func:`scales_call_checks`), so the key holds only
    the dtype, device and rank (one configuration for every token count)."""

    def key(self, t: Any) -> Any:
        return t.dtype, t.is_cuda if SOLE_GPU.on else t.device, t.dim()


def deferred(name: str, schema_type: str, default: Optional[str] = None, key_of: Any = None) -> Param:
    """A non-tensor parameter checked by the op's ``relations``: its schema type, default and key."""
    return Param(name, schema_type, None, key_of, default)


def pair_key(x: Any) -> tuple:
    """A quantized ``(data, sf)`` input's part of the memo key: what its checks read but the token
    count, the data strides and the pointers (:func:`pair_call_checks`, every call).  The sf's
    orientation (``stride(0) == 1``: column-major) and row stride rule are part of it.  TypeError,
    AttributeError or IndexError where x is no such pair (the checked path says why)."""
    if len(x) != 2:
        raise TypeError("not a (data, sf) pair")
    data, sf = x
    one = SOLE_GPU.on  # a device's key part: is_cuda where the process has one GPU
    s, st = data.shape, sf.stride()  # (a 2-D shape's last size by index: slicing a shape costs ~0.1 µs)
    return (data.dtype, data.is_cuda if one else data.device, len(s), s[-1] if len(s) == 2 else s[1:], sf.dtype,
            sf.is_cuda if one else sf.device, sf.dim(), st[0] == 1, st[1] == 1)


class Config(NamedTuple):
    """A checked configuration of a per-token cast: everything its launch needs but the tensors."""

    fmt: str
    key_in: str  # the kernels' in_dtype
    hidden: int  # logical channels per token
    group_shift: int
    whole_row: bool
    rnd: bool
    layout: SfLayout  # the scales the op writes (precomputed: the ones it reads)
    in_layout: Optional[SfLayout]  # a quantized input's scales, None for a plain input
    group: int  # channels per scale


def check_config(op: str, mode: str, values: dict) -> tuple[Config, Any, Any]:
    """Every check of a per-token cast (``mode``: ``cast``, ``sf_only`` or ``precomputed``) but the
    device, in the ops' order; returns ``(config, data, kernel_sf)`` (the input tensor, and a
    quantized input's scales in kernel orientation, else None)."""
    x, fmt, npc, x_block_size = values["x"], values["fmt"], values["num_per_channels"], values["x_block_size"]
    check_fmt(op, fmt)
    col = check_flag(op, "use_tma_aligned_col_major_sf", values["use_tma_aligned_col_major_sf"])
    rnd = check_flag(op, "round_sf", values["round_sf"])
    packed = check_flag(op, "use_packed_ue8m0", values["use_packed_ue8m0"])
    if isinstance(x, tuple):
        if mode != "cast":
            raise fail(op, "a quantized (data, sf) input is supported by per_token_cast only (as in tile_kernels); "
                           "dequantize it first or call per_token_cast")
        data, kernel_sf, in_layout, hidden = _quantized(op, x, x_block_size)
        key_in = QUANTIZED[data.dtype]
    else:
        check_tensor(op, "x", x, tuple(PLAIN), 2)
        if x_block_size is not None:
            raise fail(op, f"x_block_size={x_block_size!r} is only for a quantized (data, sf) input; pass None "
                           "with a plain bf16/fp32 tensor")
        data, kernel_sf, in_layout, hidden = x, None, None, x.size(1)
        _check_rows(op, "x", hidden)
        key_in = PLAIN[x.dtype]
    group_shift, whole_row = _groups(op, npc, hidden)
    group = hidden if whole_row else npc
    if mode == "precomputed":
        layout = _precomputed_layout(op, values["sf"], data.size(0), hidden, group, col, packed)
    else:
        layout = output_layout(op, (1, group), col, packed, rnd)
    return Config(fmt, key_in, hidden, group_shift, whole_row, rnd, layout, in_layout, group), data, kernel_sf


def _check_block(op: str, x_block_size: Any) -> tuple[int, int]:
    ok = isinstance(x_block_size, (tuple, list)) and len(x_block_size) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0 for v in x_block_size)
    if not ok or x_block_size[1] < 16:
        raise fail(op, f"x_block_size={x_block_size!r} is not supported for a quantized input; it must be a "
                       "(rows, cols) pair of powers of two with cols >= 16, e.g. (128, 128), (32, 32) or (1, 32)")
    return int(x_block_size[0]), int(x_block_size[1])


def _check_rows(op: str, name: str, hidden: int) -> None:
    if hidden % HIDDEN_ALIGN:
        raise fail(op, f"{name} has hidden size {hidden}; this op needs hidden % {HIDDEN_ALIGN} == 0 "
                       "(pad the hidden dimension)")


def _quantized(op: str, x: tuple, x_block_size: Any) -> tuple[torch.Tensor, torch.Tensor, SfLayout, int]:
    """``(data, sf in kernel orientation, its layout, logical hidden)`` of a quantized pair."""
    data, kernel_sf, layout = input_sf(op, tuple(x), _check_block(op, x_block_size))
    check_tensor(op, "x[0] (data)", data, tuple(QUANTIZED), 2)
    hidden = data.size(1) * (2 if data.dtype == torch.int8 else 1)
    _check_rows(op, "x[0] (data)", hidden)
    pair_call_checks(op, x, data, kernel_sf, layout, hidden)
    return data, kernel_sf, layout, hidden


def kernel_scales(sf: torch.Tensor, layout: SfLayout) -> torch.Tensor:
    """A quantized input's sf in kernel orientation (what :func:`._sf.input_sf` returns for it)."""
    if not layout.col_major:
        return sf
    return sf.T.view(torch.uint8) if layout.packed_ue8m0 else sf.T


def pair_call_checks(op: str, x: tuple, data: torch.Tensor, kernel_sf: torch.Tensor, layout: SfLayout,
                     hidden: int) -> None:
    """The checks of a quantized input that depend on its token count, strides and pointers."""
    tokens = data.size(0)
    vector = 16 if data.dtype == torch.float8_e4m3fn else 8  # bytes per lane load
    if data.stride(1) != 1 or (tokens > 1 and data.stride(0) % vector) or ptr(data) % 16:
        raise fail(op, f"x[0] (data) must have unit column stride, a row stride that is a multiple of {vector} "
                       f"and a 16-byte aligned pointer (got strides {tuple(data.stride())}); pass data.contiguous()")
    want = layout.shape(tokens, hidden)
    if tuple(kernel_sf.shape) != want:
        user = (_cdiv(tokens, layout.block[0]), _cdiv(_cdiv(hidden, layout.block[1]), 4 if layout.packed_ue8m0 else 1))
        raise fail(op, f"x[1] (sf) has shape {tuple(x[1].shape)}; for data {tuple(data.shape)} "
                       f"({tokens} x {hidden} values) with x_block_size={layout.block} it must be {user}")
    if ptr(kernel_sf) % kernel_sf.element_size() or not 0 < kernel_sf.stride(0) <= INT32_MAX:
        raise fail(op, f"x[1] (sf) strides {tuple(x[1].stride())} or its pointer are not usable; pass a freshly "
                       "allocated sf")


def _groups(op: str, num_per_channels: Any, hidden: int) -> tuple[int, bool]:
    """``(group_shift, whole_row)`` for the kernel."""
    if isinstance(num_per_channels, int) and not isinstance(num_per_channels, bool):
        if num_per_channels in GROUPS:
            return num_per_channels.bit_length() - 1, False
        if num_per_channels == hidden and hidden > 0:
            return WHOLE_ROW_SHIFT, True
    raise fail(op, f"num_per_channels={num_per_channels!r} is not supported; supported: "
                   f"{', '.join(map(str, GROUPS))}, or hidden ({hidden}) for one scale per token")


def _precomputed_layout(op: str, sf: Any, tokens: int, hidden: int, group: int, col: bool,
                        packed: bool) -> SfLayout:
    if packed:
        raise fail(op, "use_packed_ue8m0=True is not supported with precomputed scales: pass fp32 scales "
                       "(sf_to_fp32 of the packed ones) and use_packed_ue8m0=False")
    check_tensor(op, "sf", sf, (torch.float32,), 2)
    scales_call_checks(op, sf, tokens, hidden, group, col)
    return SfLayout((1, group), col, False)


def scales_call_checks(op: str, sf: torch.Tensor, tokens: int, hidden: int, group: int, col: bool) -> None:
    """Precomputed scales' shape against the token count, and their strides and pointer."""
    want = (_cdiv(hidden, group), tokens) if col else (tokens, _cdiv(hidden, group))
    if tuple(sf.shape) != want:
        how = "[groups, tokens] (the kernel orientation tile_kernels expects with use_tma_aligned_col_major_sf)" \
            if col else "[tokens, groups]"
        raise fail(op, f"sf has shape {tuple(sf.shape)}; it must be {how} = {want} for x of {tokens} x {hidden} "
                       f"values and {group} channels per scale")
    if (sf.stride(1) != 1 and sf.size(1) > 1) or ptr(sf) % 4 or not 0 <= sf.stride(0) <= INT32_MAX:
        raise fail(op, f"sf must have unit stride along its last dim (got strides {tuple(sf.stride())}); "
                       "pass sf.contiguous()")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["Config", "Deferred", "Scales", "check_config", "deferred", "kernel_scales", "pair_call_checks",
           "pair_key", "scales_call_checks"]
