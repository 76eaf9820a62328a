"""Dequantization: ``cast_back``, ``per_token_cast_back`` and ``unpack_from_e2m1fn_x2``.

Same names, signatures, defaults and outputs as ``tile_kernels.quant`` 1.0.0.  ``cast_back``
turns a quantized ``(data, sf)`` pair back into a contiguous bf16 (``fmt='bf16'``) or fp32
(``'fp32'``) tensor ``[tokens, hidden]``: ``decode(data) * sf`` of the element's block, one fp32
multiply rounded once to the output dtype, bit-identical to ``tile_kernels.torch.cast_back`` /
``cast_back_from_e5m6``.  Data: float8_e4m3fn, int8 packing two e2m1 values per byte (low nibble
first), or with ``x_special_fmt='e5m6'`` uint8 ``[tokens, hidden * 3 // 2]`` of packed E5M6.
Scales: fp32 row-major, fp32 column-major (``sf.stride(0) == 1``) or packed-UE8M0 int32
(column-major), shaped for ``x_block_size = (tokens per scale, channels per scale)``.

Supported: e4m3 / e2m1 with ``hidden % 64 == 0`` (as tile_kernels), e5m6 with ``hidden % 8 ==
0``; each block dimension a power of two, or at least the whole dimension (e.g. ``(1, hidden)``).

Every argument is validated before any GPU work (:class:`tilebin.runtime.ArgumentError` naming
the op, the value received, what is supported and the fix; the device is checked last).  Data
that is not contiguous or not 16-byte aligned is copied first.  The kernels run on torch's
current stream.

Each op is declared by an :class:`~tilebin.ops._spec.OpSpec`.  ``per_token_cast_back`` is
``cast_back`` with ``(1, num_per_channels)`` blocks: its own spec and custom op, the same checks
(whose messages name ``cast_back``).  A configuration of the pair (data dtype, device and width;
sf dtype, device, width and orientation; fmt; the block sizes with their types; x_special_fmt)
is checked once; later calls check only what the token count decides (the sf's rows, the 32-bit
element limit, a token block that is not a power of two spanning every token).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .._common import SOLE_GPU, TRACING, aligned_input, check_cuda, fail, launcher, ptr
from .._spec import OpSpec, Param, block_key
from .._torch import pair_to_public, pair_to_schema
from ._sf import input_sf

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_OP = "cast_back"  # the op the checks name (per_token_cast_back's too, as when it called cast_back)
_OUT = {"bf16": (torch.bfloat16, "bfloat16"), "fp32": (torch.float32, "float32")}
_DATA_FMT = {torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}
_INT32_MAX = 2**31 - 1
_SURE_ELEMENTS = _INT32_MAX // 2  # tokens * data width up to this: the output is within 32-bit indexing
_WHOLE = 31  # shift for a block spanning its dimension: every index maps to block 0
# e2m1 code -> value; code 8 is -0.0 (sign bit set on a zero magnitude)
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------- the checks
def _check_out_fmt(op: str, fmt: Any) -> str:
    if not isinstance(fmt, str) or fmt not in _OUT:
        raise fail(_OP, f"fmt={fmt!r} is not supported; supported: 'bf16', 'fp32' (the output dtype)")
    return fmt


def _check_special(op: str, special: Any) -> Optional[str]:
    if special not in (None, "e5m6"):
        raise fail(_OP, f"x_special_fmt={special!r} is not supported; supported: None, 'e5m6'")
    return special


def _block_shift(what: str, size: Any, extent: int) -> int:
    """Shift that maps an index to its block: log2 of a power-of-two block, or ``_WHOLE``."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise fail(_OP, f"x_block_size {what} must be a positive int, got {size!r}")
    if size & (size - 1) == 0:
        return size.bit_length() - 1
    if size >= extent:
        return _WHOLE
    raise fail(_OP, f"x_block_size {what}={size} is not supported for a dimension of {extent}: a block must be "
                    f"a power of two or span the whole dimension (use e.g. {1 << (size.bit_length() - 1)})")


def _check_sf(user_sf: torch.Tensor, sf: torch.Tensor, layout, tokens: int, hidden: int) -> None:
    """The kernel-orientation ``sf`` has the shape ``layout`` gives for a tokens x hidden input."""
    if tuple(sf.shape) != tuple(layout.shape(tokens, hidden)):
        m, k = layout.blocks(tokens, hidden)
        want = (m, _cdiv(k, 4)) if layout.packed_ue8m0 else (m, k)
        raise fail(_OP, f"x's sf has shape {tuple(user_sf.shape)} but blocks {tuple(layout.block)} of a {tokens} x "
                        f"{hidden} input need {want} ({layout.kind} layout); pass the sf the cast returned for "
                        "this x_block_size")


def _data_fmt(data: torch.Tensor, special: Optional[str]) -> tuple[str, int]:
    """The data's format and the hidden size it holds."""
    if special == "e5m6":
        if data.dtype != torch.uint8:
            raise fail(_OP, f"x_special_fmt='e5m6' needs uint8 packed data, got {data.dtype}")
        if data.size(1) % 12:
            raise fail(_OP, f"E5M6 data has {data.size(1)} bytes per row; it must be a multiple of 12 "
                            "(hidden % 8 == 0, 8 values in 12 bytes)")
        return "e5m6", data.size(1) * 2 // 3
    if data.dtype not in _DATA_FMT:
        raise fail(_OP, f"x's data has dtype {data.dtype}; supported: float8_e4m3fn (e4m3), int8 (packed e2m1); "
                        "uint8 is packed E5M6: pass x_special_fmt='e5m6'")
    fmt = _DATA_FMT[data.dtype]
    hidden = data.size(1) * (2 if fmt == "e2m1" else 1)
    if hidden % 64:
        raise fail(_OP, f"hidden={hidden} is not supported: e4m3/e2m1 cast_back needs hidden % 64 == 0")
    return fmt, hidden


def _read_input(x: Any, x_block_size: Any, special: Optional[str]):
    """Validate a (data, sf) input; returns (data, kernel sf, layout, data fmt, tokens, hidden,
    (shift_t, shift_c))."""
    if not isinstance(x, tuple) or len(x) != 2:
        raise fail(_OP, f"x must be a (data, sf) tuple, got {type(x).__name__}")
    data, sf, layout = input_sf(_OP, x, x_block_size)
    if data.dim() != 2:
        raise fail(_OP, f"x's data must be 2-D [tokens, hidden], got shape {tuple(data.shape)}")
    tokens = data.size(0)
    fmt, hidden = _data_fmt(data, special)
    shifts = (_block_shift("tokens per scale", x_block_size[0], tokens),
              _block_shift("channels per scale", x_block_size[1], hidden))
    _check_sf(x[1], sf, layout, tokens, hidden)
    if tokens * hidden > _INT32_MAX:
        raise fail(_OP, f"the output has {tokens * hidden} elements; at most {_INT32_MAX} (32-bit indexing): "
                        "split the tokens into smaller calls")
    return data, sf, layout, fmt, tokens, hidden, shifts


def _relations(block_of: Callable[[Any], tuple]) -> Callable[[str, dict], None]:
    """Every check of the pair against the block sizes and x_special_fmt, then its device."""
    def relations(op: str, values: dict) -> None:
        data, sf, *_ = _read_input(values["x"], block_of(values), values["x_special_fmt"])
        check_cuda(_OP, data=data, sf=sf)

    return relations


# --------------------------------------------------------------------------------- the memo keys
def _pair_key(x: Any) -> tuple:
    """The pair's part of a configuration: data dtype, device and sizes but the token count; sf
    dtype, device and sizes but the first, whether it is column-major (``stride(0) == 1``) and
    whether it is that or has unit column stride (a row-major sf must).  TypeError for anything
    but a 2-tuple (the checked path)."""
    if type(x) is not tuple or len(x) != 2:
        raise TypeError("not a (data, sf) tuple")
    data, sf = x
    st = sf.stride()
    col = st[0] == 1
    one, ds, ss = SOLE_GPU.on, data.shape, sf.shape  # a device: is_cuda where the process has one GPU
    return (data.dtype, data.is_cuda if one else data.device, len(ds), ds[-1] if len(ds) == 2 else ds[1:],
            sf.dtype, sf.is_cuda if one else sf.device, len(ss), ss[-1] if len(ss) == 2 else ss[1:], col,
            col or st[1] == 1)


# ------------------------------------------------------------------------------------ the launch
def _prepare_data(data: torch.Tensor) -> torch.Tensor:
    """``data`` contiguous with a 16-byte aligned pointer (a copy only when needed)."""
    if not data.is_contiguous():
        data = data.contiguous()
    if ptr(data) % 16:
        data = data.clone()
    return data


def _plan(block_of: Callable[[dict], tuple]) -> Callable[[dict], Callable[..., torch.Tensor]]:
    """The launch of one configuration (data format and width, scale layout and block, output
    dtype): its kernel, shifts and output row width fixed; per call the output for the call's
    token count, the sf in the kernel's orientation and the data contiguous and aligned."""
    def plan(values: dict) -> Callable[..., torch.Tensor]:
        _, _, layout, in_fmt, _, hidden, (shift_t, shift_c) = _read_input(
            values["x"], block_of(values), values["x_special_fmt"])
        out_dtype, out_key = _OUT[values["fmt"]]
        if in_fmt == "e5m6":
            fn = launcher("quant.cast_back_e5m6", out_dtype=out_key, sf_kind=layout.kind)
        else:
            fn = launcher("quant.cast_back", in_fmt=in_fmt, out_dtype=out_key, sf_kind=layout.kind)
        col, packed = layout.col_major, layout.packed_ue8m0

        device = values["x"][0].device  # part of the configuration
        # the per-call test (no spec per_call: relations run _read_input on a first call, before the
        # devices): the sf has a row per token block, and the token count is within what the output's
        # 32-bit indexing and (a token block that is not a power of two) the block allow; else _read_input
        block, special = block_of(values), values["x_special_fmt"]
        rows_per_scale, width = block[0], values["x"][0].shape[1]
        most_tokens = _SURE_ELEMENTS // max(1, width)
        if rows_per_scale & (rows_per_scale - 1):
            most_tokens = min(most_tokens, rows_per_scale)

        def run(x: QuantTensor, *_: Any) -> torch.Tensor:
            data, sf = x
            tokens = data.shape[0]
            if sf.shape[0] != -(-tokens // rows_per_scale) or tokens > most_tokens:
                _read_input(x, block, special)  # raises today's message (or passes: the test is stricter)
            out = torch.empty(tokens, hidden, dtype=out_dtype, device=device)
            if tokens:
                if col:  # as input_sf: the kernel reads the transpose (packed UE8M0: its bytes)
                    sf = sf.T.view(torch.uint8) if packed else sf.T
                if not data.is_contiguous() or not TRACING.on and (data.data_ptr() | sf.data_ptr()) % 16:
                    data, sf = _prepare_data(data), aligned_input(sf)
                fn(data, sf, out, shift_t, shift_c)
            return out

        return run

    return plan


def _blocks(values: dict) -> tuple:
    return values["x_block_size"]


def _per_token_blocks(values: dict) -> tuple:
    return 1, values["num_per_channels"]


# ------------------------------------------------------------------------------------- the specs
_PAIR = Param("x", "Tensor", key_of=_pair_key)
# (no key_of: the spec keys a str or int parameter by its type and value inline, no call per argument)
_FMT = Param("fmt", "str", _check_out_fmt)
_SPECIAL = Param("x_special_fmt", "str?", _check_special, default="None")
_PAIR_TORCH = dict(to_schema=pair_to_schema, to_public=pair_to_public)

CAST_BACK = OpSpec(
    "cast_back", (_PAIR, _FMT, Param("x_block_size", "int[]", key_of=block_key), _SPECIAL), "Tensor",
    _plan(_blocks), relations=_relations(_blocks),
    schema_args="Tensor x, Tensor x_sf, str fmt, int[] x_block_size, str? x_special_fmt=None", torch=_PAIR_TORCH)
PER_TOKEN_CAST_BACK = OpSpec(
    "per_token_cast_back", (_PAIR, _FMT, Param("num_per_channels", "int"), _SPECIAL),
    "Tensor", _plan(_per_token_blocks), relations=_relations(_per_token_blocks),
    schema_args="Tensor x, Tensor x_sf, str fmt, int num_per_channels, str? x_special_fmt=None", torch=_PAIR_TORCH)


def cast_back(
    x: QuantTensor,
    fmt: str,
    x_block_size: tuple[int, int],
    x_special_fmt: Optional[str] = None,
) -> torch.Tensor:
    """Dequantize ``x = (data, sf)`` to a new contiguous ``[tokens, hidden]`` tensor of ``fmt``
    ('bf16' or 'fp32'); ``x_block_size = (tokens, channels)`` per scale; ``x_special_fmt``
    None (e4m3 / packed e2m1 data) or 'e5m6' (packed E5M6 uint8 data).  See the module docstring.

    A configuration whose checks passed before (data dtype, width and device; sf dtype, width,
    device and orientation; fmt; x_block_size with its types; x_special_fmt) skips them: per
    call only the sf's rows against the token count, the 32-bit element limit and (a token block
    that is not a power of two) the token count against the block are checked."""
    return CAST_BACK.call(x, fmt, x_block_size, x_special_fmt)


def per_token_cast_back(
    x: QuantTensor,
    fmt: str,
    num_per_channels: int,
    x_special_fmt: Optional[str] = None,
) -> torch.Tensor:
    """``cast_back(x, fmt, (1, num_per_channels), x_special_fmt)``: one scale per token and group."""
    return PER_TOKEN_CAST_BACK.call(x, fmt, num_per_channels, x_special_fmt)


# --------------------------------------------------------------------------- unpack_from_e2m1fn_x2
def _check_packed(op: str, x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise fail(op, f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in (torch.int8, torch.uint8):
        raise fail(op, f"x has dtype {x.dtype}; supported: int8, uint8 (two e2m1 values per byte)")
    if x.dim() == 0:
        raise fail(op, "x must have at least 1 dimension (the packed one, doubled in the output)")
    return x


def _check_out_dtype(op: str, out_dtype: Any) -> torch.dtype:
    if not isinstance(out_dtype, torch.dtype):
        raise fail(op, f"out_dtype must be a torch.dtype, got {out_dtype!r}")
    return out_dtype


def _packed_key(x: Any) -> tuple:
    """x's part of a configuration: dtype, device and rank (its sizes are read per call)."""
    return x.dtype, x.is_cuda if SOLE_GPU.on else x.device, x.dim()


_UNPACK_KERNEL = "quant.unpack_e2m1"
_UNPACK_OUT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}  # its variants
UNPACK_KERNEL_MAX_BYTES = 2**30  # its output (two values a byte) within int32 element indices; larger: torch ops


def _plan_unpack(values: dict) -> Callable[..., torch.Tensor]:
    """On a CUDA device with an fp32 / bf16 / fp16 output: ``quant.unpack_e2m1`` (one kernel; x as
    ``[rows, bytes]``, copied first when it is not contiguous or its pointer not 16-byte aligned).
    Anything else (a CPU tensor, another output dtype): torch ops on x's device, a table of the
    two ``out_dtype`` values of each of the 256 bytes (low nibble first; each value converted from
    float32 as ``.to`` would), gathered by byte."""
    x, out_dtype = values["x"], values["out_dtype"]
    device = x.device
    table: list[torch.Tensor] = []  # [256, 2], made at the first call that gathers (none on the kernel's path)

    def gather(x: torch.Tensor, *_: Any) -> torch.Tensor:
        if not table:
            codes = torch.arange(256)
            values_f32 = torch.tensor(_E2M1_VALUES, dtype=torch.float32)
            table.append(values_f32[torch.stack((codes & 0xF, codes >> 4), dim=-1)].to(out_dtype).to(device))
        byte = x.reshape(-1).view(torch.uint8).to(torch.int32)
        return table[0].index_select(0, byte).view(*x.shape[:-1], x.shape[-1] * 2)

    if device.type == "cuda" and out_dtype in _UNPACK_OUT:
        return _unpack_kernel_run(device, out_dtype, launcher(
            _UNPACK_KERNEL, in_dtype="uint8" if x.dtype == torch.uint8 else "int8", out_dtype=_UNPACK_OUT[out_dtype]),
            gather)
    return gather


def _unpack_kernel_run(device: torch.device, out_dtype: torch.dtype, fn: Any,
                       gather: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The kernel's launch; x of more than ``UNPACK_KERNEL_MAX_BYTES`` bytes (an output past the
    kernel's 32-bit element indices) takes ``gather``, the torch path."""
    def run(x: torch.Tensor, *_: Any) -> torch.Tensor:
        if x.numel() > UNPACK_KERNEL_MAX_BYTES:
            return gather(x)
        shape = x.shape
        if len(shape) == 2:  # the common case, without the general case's views
            rows, cols = shape
            out = torch.empty(rows, 2 * cols, dtype=out_dtype, device=device)
            if rows and cols:
                fn(x if x.is_contiguous() and not ptr(x) & 15 else _prepare_data(x), out)
            return out
        cols = shape[-1]
        out = torch.empty(*shape[:-1], 2 * cols, dtype=out_dtype, device=device)
        if out.numel():  # [..., cols] as [rows, cols] (views of contiguous tensors)
            fn(_prepare_data(x).view(-1, cols), out.view(-1, 2 * cols))
        return out

    return run


UNPACK_FROM_E2M1FN_X2 = OpSpec(
    "unpack_from_e2m1fn_x2", (Param("x", "Tensor", _check_packed, key_of=_packed_key),
                              Param("out_dtype", "ScalarType", _check_out_dtype)),
    "Tensor", _plan_unpack)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed e2m1 bytes (int8 / uint8 ``[..., k]``, low nibble first) into ``out_dtype``
    values ``[..., 2 k]`` (contiguous) on ``x``'s device; code 8 gives -0.0.  One kernel on a CUDA
    device for fp32 / bf16 / fp16 outputs, torch ops otherwise (any device, any dtype ``.to`` takes)."""
    return UNPACK_FROM_E2M1FN_X2.call(x, out_dtype)


SPECS = (CAST_BACK, PER_TOKEN_CAST_BACK, UNPACK_FROM_E2M1FN_X2)
# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (CAST_BACK.torch_op(cast_back), PER_TOKEN_CAST_BACK.torch_op(per_token_cast_back),
             UNPACK_FROM_E2M1FN_X2.torch_op(unpack_from_e2m1fn_x2))

__all__ = ["cast_back", "per_token_cast_back", "unpack_from_e2m1fn_x2"]
