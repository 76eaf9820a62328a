"""Per-token casts: one scale per token and ``num_per_channels`` channels.

Same names, signatures, defaults and outputs as ``tile_kernels.quant`` 1.0.0
(``per_token_cast``, ``per_token_cast_with_sf_only``, ``per_token_cast_with_precomputed_sf``),
bit-identical to ``tile_kernels.torch.cast(x, fmt, (1, num_per_channels), ...)``:

* ``fmt``: ``'e4m3'`` (float8_e4m3fn ``[tokens, hidden]``) or ``'e2m1'`` (two values per int8
  byte, ``[tokens, hidden // 2]``); ``per_token_cast`` also takes ``'e5m6'``, which runs
  ``per_token_cast_to_e5m6`` (``ops/quant/_e5m6.py``).
* ``x``: bf16 / fp32 ``[tokens, hidden]`` (any row stride), or a quantized pair ``(data, sf)``
  (data e4m3, or e2m1 packed in int8; sf fp32 row- or column-major, or packed UE8M0 int32)
  with ``x_block_size = (rows, cols)``, powers of two, ``cols >= 16``: dequantized as
  ``data * sf`` (fp32) first.  Only ``per_token_cast`` takes a quantized pair (as tile_kernels).
* ``num_per_channels``: 16, 32, 64, 128, or ``hidden`` (one scale per token).
* ``hidden % 16 == 0`` (576 and other sizes that are not multiples of the group work: the last
  group is partial).
* scales (dequantization multipliers): fp32 ``[tokens, groups]`` row-major;
  ``use_tma_aligned_col_major_sf``: the same values column-major (strides ``(1, pad4(tokens))``);
  ``use_packed_ue8m0`` (needs the column-major flag and ``round_sf``): int32 ``[tokens,
  ceil(groups / 4)]`` holding exponent bytes.  ``round_sf`` rounds scales up to powers of two.
* ``per_token_cast_with_precomputed_sf``: ``sf`` fp32, one scale per token and group, given
  ``[tokens, groups]`` (stride(1) == 1), or with ``use_tma_aligned_col_major_sf`` in the
  kernel's orientation ``[groups, tokens]`` (stride(1) == 1), as tile_kernels passes it; packed
  UE8M0 is refused (tile_kernels reads it as a number); ``round_sf`` is ignored.  Returns the
  cast of ``x * (1 / sf)``.

Every argument is validated before any GPU work (:class:`tilebin.runtime.ArgumentError` naming
the op, the value, what is supported and the fix; the device is checked last).  A plain input
whose row stride is not a multiple of 16 bytes, whose column stride is not 1 or whose pointer is
not 16-byte aligned costs a copy of x.  Kernels run on torch's current stream.

Kernels: ``quant.per_token_cast`` (plain input), ``quant.per_token_cast_quantized``,
``quant.per_token_cast_sf_only``, ``quant.per_token_cast_precomputed``; and for up to
``meta["max_tokens"]`` (256) tokens of a plain input cast to e4m3 with fp32 scales and 16..128
channels per scale, ``quant.per_token_cast_decode`` (same parameters and bits as
``quant.per_token_cast``, one scale group per lane: faster at decode sizes).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch.compiler import is_compiling

from .._common import TRACING, aligned_input, check_cuda, check_flag, check_tensor, fail, kernel_meta, launcher, ptr
from .._torch import TorchOp, traced, pair_to_public, pair_to_schema
from ._sf import SCHEMA_FLAGS as _FLAGS, FMT_DTYPES, SfLayout, check_fmt, input_sf, output_layout

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_KERNEL = {"cast": "quant.per_token_cast", "quantized": "quant.per_token_cast_quantized",
           "sf_only": "quant.per_token_cast_sf_only", "precomputed": "quant.per_token_cast_precomputed"}
# per_token_cast of plain bf16/fp32 -> e4m3 with fp32 scales (row- or column-major) and 16..128 channels
# per scale, up to its meta "max_tokens" tokens (decode): same parameters and bits as _KERNEL["cast"]
_CAST_DECODE = "quant.per_token_cast_decode"
_PLAIN = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
_QUANTIZED = {torch.float8_e4m3fn: "float8_e4m3fn", torch.int8: "int8"}
_GROUPS = (16, 32, 64, 128)
_HIDDEN_ALIGN = 16
_WHOLE_ROW_SHIFT = 31  # group_shift for one scale per row: every channel index >> 31 is 0
_INT32_MAX = 2**31 - 1
_FAST_MAX = 256  # memoized per_token_cast configurations (see per_token_cast)


def _chunk(in_dtype: str) -> int:
    """Channels one thread block covers for this input dtype (the kernel's ``meta``)."""
    return kernel_meta("quant.per_token_cast", f"chunk_{in_dtype}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_shift(value: int) -> int:
    return value.bit_length() - 1


def _check_block(op: str, x_block_size: Any) -> tuple[int, int]:
    ok = isinstance(x_block_size, (tuple, list)) and len(x_block_size) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0 for v in x_block_size)
    if not ok or x_block_size[1] < 16:
        raise fail(op, f"x_block_size={x_block_size!r} is not supported for a quantized input; it must be a "
                       "(rows, cols) pair of powers of two with cols >= 16, e.g. (128, 128), (32, 32) or (1, 32)")
    return int(x_block_size[0]), int(x_block_size[1])


def _check_rows(op: str, name: str, t: torch.Tensor, hidden: int) -> None:
    if hidden % _HIDDEN_ALIGN:
        raise fail(op, f"{name} has hidden size {hidden}; this op needs hidden % {_HIDDEN_ALIGN} == 0 "
                       "(pad the hidden dimension)")


def _quantized(op: str, x: tuple, x_block_size: Any) -> tuple[torch.Tensor, torch.Tensor, SfLayout, int]:
    """``(data, sf in kernel orientation, its layout, logical hidden)`` of a quantized pair."""
    data, kernel_sf, layout = input_sf(op, tuple(x), _check_block(op, x_block_size))
    check_tensor(op, "x[0] (data)", data, tuple(_QUANTIZED), 2)
    tokens, hidden = data.size(0), data.size(1) * (2 if data.dtype == torch.int8 else 1)
    _check_rows(op, "x[0] (data)", data, hidden)
    vector = 16 if data.dtype == torch.float8_e4m3fn else 8  # bytes per lane load
    if data.stride(1) != 1 or (tokens > 1 and data.stride(0) % vector) or ptr(data) % 16:
        raise fail(op, f"x[0] (data) must have unit column stride, a row stride that is a multiple of {vector} "
                       f"and a 16-byte aligned pointer (got strides {tuple(data.stride())}); pass data.contiguous()")
    want = layout.shape(tokens, hidden)
    if tuple(kernel_sf.shape) != want:
        user = (_cdiv(tokens, layout.block[0]), _cdiv(_cdiv(hidden, layout.block[1]), 4 if layout.packed_ue8m0 else 1))
        raise fail(op, f"x[1] (sf) has shape {tuple(x[1].shape)}; for data {tuple(data.shape)} "
                       f"({tokens} x {hidden} values) with x_block_size={layout.block} it must be {user}")
    if ptr(kernel_sf) % kernel_sf.element_size() or not 0 < kernel_sf.stride(0) <= _INT32_MAX:
        raise fail(op, f"x[1] (sf) strides {tuple(x[1].stride())} or its pointer are not usable; pass a freshly "
                       "allocated sf")
    return data, kernel_sf, layout, hidden


def _kernel_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its rows are 16-byte aligned with unit column stride, else a copy."""
    per_vector = 16 // x.element_size()
    stride = x.stride(0)
    rows_ok = x.size(0) <= 1 or 0 < stride <= _INT32_MAX and stride % per_vector == 0
    if (x.stride(1) == 1 or x.size(1) <= 1) and rows_ok and ptr(x) % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _groups(op: str, num_per_channels: Any, hidden: int) -> tuple[int, bool]:
    """``(group_shift, whole_row)`` for the kernel."""
    if isinstance(num_per_channels, int) and not isinstance(num_per_channels, bool):
        if num_per_channels in _GROUPS:
            return _pow2_shift(num_per_channels), False
        if num_per_channels == hidden and hidden > 0:
            return _WHOLE_ROW_SHIFT, True
    raise fail(op, f"num_per_channels={num_per_channels!r} is not supported; supported: "
                   f"{', '.join(map(str, _GROUPS))}, or hidden ({hidden}) for one scale per token")


def _flags(op: str, col: Any, rnd: Any, packed: Any) -> tuple[bool, bool, bool]:
    return (check_flag(op, "use_tma_aligned_col_major_sf", col), check_flag(op, "round_sf", rnd),
            check_flag(op, "use_packed_ue8m0", packed))


def _run(op: str, mode: str, x: Any, fmt: Any, num_per_channels: Any, x_block_size: Any, col: Any, rnd: Any,
         packed: Any, sf: Optional[torch.Tensor] = None, memo_key: Optional[tuple] = None) -> Any:
    check_fmt(op, fmt)
    col, rnd, packed = _flags(op, col, rnd, packed)
    if isinstance(x, tuple):
        if mode != "cast":
            raise fail(op, "a quantized (data, sf) input is supported by per_token_cast only (as in tile_kernels); "
                           "dequantize it first or call per_token_cast")
        data, x_sf, in_layout, hidden = _quantized(op, x, x_block_size)
        key_in = _QUANTIZED[data.dtype]
    else:
        check_tensor(op, "x", x, tuple(_PLAIN), 2)
        if x_block_size is not None:
            raise fail(op, f"x_block_size={x_block_size!r} is only for a quantized (data, sf) input; pass None "
                           "with a plain bf16/fp32 tensor")
        data, x_sf, in_layout, hidden = x, None, None, x.size(1)
        _check_rows(op, "x", x, hidden)
        key_in = _PLAIN[x.dtype]
    tokens = data.size(0)
    group_shift, whole_row = _groups(op, num_per_channels, hidden)
    group = hidden if whole_row else num_per_channels
    if mode == "precomputed":
        layout = _precomputed_layout(op, sf, tokens, hidden, group, col, packed)
    else:
        layout = output_layout(op, (1, group), col, packed, rnd)
    check_cuda(op, x=data, x_sf=x_sf, sf=sf)
    return _launch(mode, data, x_sf, in_layout, sf, layout, fmt, key_in, tokens, hidden, group_shift, whole_row,
                   rnd, memo_key)


def _precomputed_layout(op: str, sf: Any, tokens: int, hidden: int, group: int, col: bool,
                        packed: bool) -> SfLayout:
    if packed:
        raise fail(op, "use_packed_ue8m0=True is not supported with precomputed scales: pass fp32 scales "
                       "(sf_to_fp32 of the packed ones) and use_packed_ue8m0=False")
    check_tensor(op, "sf", sf, (torch.float32,), 2)
    groups = _cdiv(hidden, group)
    want = (groups, tokens) if col else (tokens, groups)
    if tuple(sf.shape) != want:
        how = "[groups, tokens] (the kernel orientation tile_kernels expects with use_tma_aligned_col_major_sf)" \
            if col else "[tokens, groups]"
        raise fail(op, f"sf has shape {tuple(sf.shape)}; it must be {how} = {want} for x of {tokens} x {hidden} "
                       f"values and {group} channels per scale")
    if (sf.stride(1) != 1 and sf.size(1) > 1) or ptr(sf) % 4 or not 0 <= sf.stride(0) <= _INT32_MAX:
        raise fail(op, f"sf must have unit stride along its last dim (got strides {tuple(sf.stride())}); "
                       "pass sf.contiguous()")
    return SfLayout((1, group), col, False)


class _Plain:
    """The launch of ``per_token_cast`` for a plain bf16/fp32 ``x`` of one validated configuration
    (dtype, hidden, fmt, group, flags): everything but the token count and the pointer.

    The checked path (:func:`_run`) builds one after validating and runs it; :func:`per_token_cast`
    keeps it (``_FAST``) and runs it directly for a later call with the same configuration, so
    both paths allocate and launch through this one piece of code.
    """

    __slots__ = ("hidden", "out_cols", "out_dtype", "layout", "sf_cols", "key", "args", "fn", "decode")

    def __init__(self, fmt: str, key_in: str, hidden: int, layout: SfLayout, group_shift: int, whole_row: bool,
                 rnd: bool) -> None:
        self.hidden = hidden
        self.out_cols = hidden if fmt == "e4m3" else hidden // 2
        self.out_dtype = FMT_DTYPES[fmt]
        self.layout = layout
        # row-major fp32 scales (the common layout): SfLayout.alloc's tensor, allocated here directly
        self.sf_cols = layout.shape(1, hidden)[1] if layout.kind == "row" else None
        self.key = dict(in_dtype=key_in, fmt=fmt, sf="ue8m0" if layout.packed_ue8m0 else "f32", mode="cast",
                        in_sf="none")
        col_blocks = 1 if whole_row else _cdiv(hidden, _chunk(key_in))
        self.args = (group_shift, int(whole_row), int(rnd), int(layout.col_major), col_blocks)
        self.fn = None  # the launcher, looked up at the first launch
        # quant.per_token_cast_decode where it applies: [launcher or None, its args, max tokens]
        self.decode = None
        if fmt == "e4m3" and not layout.packed_ue8m0 and not whole_row:
            chunk = kernel_meta(_CAST_DECODE, f"chunk_{key_in}")
            self.decode = [None, self.args[:4] + (_cdiv(hidden, chunk),), kernel_meta(_CAST_DECODE, "max_tokens")]

    def __call__(self, x: torch.Tensor) -> QuantTensor:
        """``(out, out_sf)`` for ``x`` (already validated for this configuration)."""
        return self.run(x, x.shape[0], x.device)

    def run(self, x: torch.Tensor, tokens: int, device: torch.device) -> QuantTensor:
        """:meth:`__call__` with ``x``'s token count and device already read (the memo hit reads them)."""
        out = torch.empty((tokens, self.out_cols), dtype=self.out_dtype, device=device)
        if self.sf_cols is not None:
            raw_sf = torch.empty((tokens, self.sf_cols), dtype=torch.float32, device=device)
        else:
            raw_sf = self.layout.alloc(tokens, self.hidden, device)
        if tokens and self.hidden and not TRACING.on:  # fake tensors (tracing): nothing to read or launch
            # contiguous and 16-byte aligned: what _kernel_input passes through as is (hidden % 16 == 0)
            x_in = x if x.is_contiguous() and not x.data_ptr() & 15 else _kernel_input(x)
            decode = self.decode
            if decode is not None and tokens <= decode[2]:
                if decode[0] is None:
                    decode[0] = launcher(_CAST_DECODE, **self.key)
                decode[0](x_in, out, raw_sf, *decode[1])
            else:
                fn = self.fn
                if fn is None:
                    fn = self.fn = launcher(_KERNEL["cast"], **self.key)
                fn(x_in, out, raw_sf, *self.args)
        return out, (raw_sf if self.sf_cols is not None else self.layout.finish(raw_sf, tokens))


_FAST: dict[tuple, _Plain] = {}


def _launch(mode: str, data: torch.Tensor, x_sf: Optional[torch.Tensor], in_layout: Optional[SfLayout],
            sf: Optional[torch.Tensor], layout: SfLayout, fmt: str, key_in: str, tokens: int, hidden: int,
            group_shift: int, whole_row: bool, rnd: bool, memo_key: Optional[tuple] = None) -> Any:
    if mode == "cast" and x_sf is None:
        plan = _Plain(fmt, key_in, hidden, layout, group_shift, whole_row, rnd)
        result = plan(data)
        if memo_key is not None and len(_FAST) < _FAST_MAX:  # every check passed: later calls may skip them
            _FAST[memo_key] = plan
        return result
    device = data.device
    col_blocks = 1 if whole_row and mode != "precomputed" else _cdiv(hidden, _chunk(key_in))
    out = None
    if mode != "sf_only":
        out = torch.empty((tokens, hidden if fmt == "e4m3" else hidden // 2), dtype=FMT_DTYPES[fmt], device=device)
    raw_sf = layout.alloc(tokens, hidden, device) if mode != "precomputed" else sf
    if tokens and hidden:
        x_in = _kernel_input(data) if x_sf is None else data
        key = dict(in_dtype=key_in, fmt=fmt, sf="ue8m0" if layout.packed_ue8m0 else "f32", mode=mode,
                   in_sf="none" if in_layout is None else ("ue8m0" if in_layout.packed_ue8m0 else "f32"))
        fn = launcher(_KERNEL["quantized" if x_sf is not None else mode], **key)
        col = int(layout.col_major)
        if mode == "precomputed":
            fn(x_in, aligned_input(raw_sf), out, group_shift, col, col_blocks)
        elif mode == "sf_only":
            fn(x_in, raw_sf, group_shift, int(whole_row), int(rnd), col, col_blocks)
        elif x_sf is None:
            fn(x_in, out, raw_sf, group_shift, int(whole_row), int(rnd), col, col_blocks)
        else:
            fn(x_in, aligned_input(x_sf), out, raw_sf, group_shift, int(whole_row), int(rnd), col, col_blocks,
               int(in_layout.col_major), _pow2_shift(in_layout.block[0]), _pow2_shift(in_layout.block[1]))
    if mode == "precomputed":
        return out
    out_sf = layout.finish(raw_sf, tokens)
    return out_sf if mode == "sf_only" else (out, out_sf)


def per_token_cast(
    x: Union[torch.Tensor, QuantTensor],
    fmt: str,
    num_per_channels: int,
    x_block_size: Optional[tuple[int, int]] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> QuantTensor:
    """Cast ``x`` to ``fmt`` with one scale per token and ``num_per_channels`` channels; returns
    ``(out, out_sf)`` (layouts and rules: the module docstring).  ``fmt='e5m6'`` runs
    ``per_token_cast_to_e5m6`` (``x_block_size`` must then be None).

    A plain ``x`` whose configuration (dtype, dim, hidden, device, fmt, ``num_per_channels`` and
    the flags, with their types) passed the checks before skips them (a dict lookup): only the
    token count, the row layout (copy or not) and the pointer are read per call."""
    if is_compiling() and not TRACING.on:
        return traced("per_token_cast", x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                      round_sf, use_packed_ue8m0)
    if fmt == "e5m6":
        if x_block_size is not None:
            raise fail("per_token_cast", f"x_block_size={x_block_size!r} is not supported with fmt='e5m6' "
                                         "(a plain bf16/fp32 input only); pass None")
        from ._e5m6 import per_token_cast_to_e5m6  # imported here: the module is optional at import time

        return per_token_cast_to_e5m6(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    key = None
    if x_block_size is None:
        try:  # typed_key's flat form, inline: the parts and their types (True == 1 == 1.0 hash alike, but the
            # checks take bools and ints only); a float, tuple or list part fails the checks, so a key holding
            # one is never stored and needs no element-wise tags
            shape, device = x.shape, x.device
            parts = (x.dtype, len(shape), shape[-1], device, fmt, num_per_channels, use_tma_aligned_col_major_sf,
                     round_sf, use_packed_ue8m0)
            key = parts + tuple(map(type, parts))
            plan = _FAST.get(key)
        except (AttributeError, TypeError, IndexError):  # not a tensor (a quantized pair), unhashable: the checks say
            key, plan = None, None
        if plan is not None:
            return plan.run(x, shape[0], device)
    return _run("per_token_cast", "cast", x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                round_sf, use_packed_ue8m0, memo_key=key)


def per_token_cast_with_sf_only(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    x_block_size: Optional[tuple[int, int]] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """The scales :func:`per_token_cast` would return for a bf16/fp32 ``x``, without the cast."""
    if is_compiling() and not TRACING.on:
        return traced("per_token_cast_with_sf_only", x, fmt, num_per_channels, x_block_size,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return _run("per_token_cast_with_sf_only", "sf_only", x, fmt, num_per_channels, x_block_size,
                use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def per_token_cast_with_precomputed_sf(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    sf: torch.Tensor,
    x_block_size: Optional[tuple[int, int]] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> torch.Tensor:
    """Cast bf16/fp32 ``x`` with given fp32 scales ``sf`` (one per token and group): returns
    ``out`` = ``fmt`` of ``x * (1 / sf)`` (see the module docstring for ``sf``'s layout)."""
    if is_compiling() and not TRACING.on:
        return traced("per_token_cast_with_precomputed_sf", x, fmt, num_per_channels, sf, x_block_size,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
    return _run("per_token_cast_with_precomputed_sf", "precomputed", x, fmt, num_per_channels, x_block_size,
                use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, sf=sf)


def _cast_checked(x: Any, fmt: Any, num_per_channels: Any, x_block_size: Any, col: Any, rnd: Any, packed: Any) -> Any:
    """per_token_cast without its memo (the fake implementation)."""
    if fmt == "e5m6":
        return per_token_cast(x, fmt, num_per_channels, x_block_size, col, rnd, packed)
    return _run("per_token_cast", "cast", x, fmt, num_per_channels, x_block_size, col, rnd, packed)


# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (
    TorchOp("per_token_cast", f"(Tensor x, Tensor? x_sf, str fmt, int num_per_channels, int[]? x_block_size=None, "
                              f"{_FLAGS}) -> (Tensor, Tensor)",
            per_token_cast, _cast_checked, pair_to_schema, pair_to_public),
    TorchOp("per_token_cast_with_sf_only", f"(Tensor x, str fmt, int num_per_channels, int[]? x_block_size=None, "
                                           f"{_FLAGS}) -> Tensor",
            per_token_cast_with_sf_only),
    TorchOp("per_token_cast_with_precomputed_sf", f"(Tensor x, str fmt, int num_per_channels, Tensor sf, "
                                                  f"int[]? x_block_size=None, {_FLAGS}) -> Tensor",
            per_token_cast_with_precomputed_sf),
)


__all__ = ["per_token_cast", "per_token_cast_with_precomputed_sf", "per_token_cast_with_sf_only"]
