"""Fused MoE routing (``tile_kernels.moe`` 1.0.0 API): ``get_fused_mapping``, ``expand_to_fused``,
``expand_to_fused_with_sf`` and ``reduce_fused``.

Every op validates all arguments before touching the GPU (device last) and raises
:class:`tilebin.runtime.ArgumentError` naming the op, the value, what is supported and the fix.
Outputs have tile_kernels' dtypes, shapes and strides; launches go on torch's current stream,
asynchronously (``get_fused_mapping`` syncs with the host only when tile_kernels does: when
``num_expanded_tokens == 0`` and not ``force_no_sync``).  Sizes, hidden sizes, top-k, expert
counts (<= 1024) and alignments are run-time values.

Where tilebin is stricter or more defined than tile_kernels:

* ``get_fused_mapping``'s slot order within an expert is the order of the flattened
  ``topk_idx`` (tile_kernels' depends on the SM count); results are identical under any
  :func:`tilebin.ops.config.set_num_sms`.  Entries outside ``[0, num_experts)`` are ignored
  (``token_topk_to_pos = -1``); slots past a caller-given ``num_expanded_tokens`` are not written.
* ``expand_to_fused*`` zero-fill padding rows even for 0 tokens; rows need ``hidden * itemsize``
  to be a multiple of 16 bytes.  ``reduce_fused`` needs ``hidden % 8`` (bf16) / ``% 4`` (fp32)
  instead of ``% 256``; its e4m3 output saturates at +-448 (as tile_kernels' kernel does).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch.compiler import is_compiling

from .._common import (TRACING, aligned_input, check_cuda, check_flag, check_int, check_tensor, fail, kernel_meta,
                       launcher, memo_table, typed_key)
from .._torch import TorchOp, traced, pair_to_public, pair_to_schema
from ..config import get_num_sms
from ._routing_checks import check_contiguous, check_mapping, check_reduce_out, check_rows

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_MAPPING = "moe.get_fused_mapping"  # its meta: max_experts (the op's limit), max_blocks (its grid cap)
_ENTRIES_PER_BLOCK = 1024  # 8 warps x 128 entries: one trip per warp
_REDUNDANT_ENTRIES = 2048  # up to this many entries: the barrier-free (redundant) variant
_REDUNDANT_BLOCKS = 32
_INT32_MAX = 2**31 - 1
_EXPAND_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float8_e4m3fn: "float8_e4m3fn"}
_EXPAND_SF_DTYPES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.bfloat16: "bfloat16"}
_SF_DTYPES = {torch.float32: "float32", torch.int32: "int32"}
_REDUCE_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
# Below _REDUCE_SPLIT_TOKENS tokens reduce_fused launches moe.reduce_fused_few_tokens (a token spread over
# hidden / 1024 blocks; H200 decode: 2.2 us vs 20.0 at 1 token, 38.7 vs 42.3 at 1024), from there on
# moe.reduce_fused (a block per token, one row in flight: at ~17k tokens 1.6x the bytes per second).
_REDUCE_SPLIT_TOKENS = 1024
_INT32 = (torch.int32,)
_OUT_KEYS = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_FAST: dict[tuple, Any] = {}  # validated configurations (see _fast_table)
_FAST_DEPS: list[Any] = [None, None]
_FAST_MAX = 256


def _fast_table() -> dict[tuple, Any]:
    """The memo of validated configurations, emptied when the launcher or the device check it
    was filled under changed (tests stub both; a stubbed device check lets CPU tensors in)."""
    return memo_table(_FAST, _FAST_DEPS, launcher, check_cuda)


def _remember(key: Optional[tuple], value: Any) -> None:
    if key is not None:
        table = _fast_table()
        if len(table) < _FAST_MAX:
            table[key] = value


# ---------------------------------------------------------------- get_fused_mapping
def get_fused_mapping(
    topk_idx: torch.Tensor,
    num_experts: int,
    num_expanded_tokens: int,
    alignment: int,
    force_no_sync: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           list[int]]:
    """Map ``topk_idx`` (int64 ``[num_tokens, num_topk]``, contiguous, -1 = no expert) onto the fused
    expert-major layout where expert ``e`` owns ``count(e)`` rounded up to ``alignment`` slots.

    Returns ``(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
    expert_end, num_tokens_per_expert, num_tokens_per_expert_list)``: int32 slot maps of length
    ``num_expanded_tokens`` (-1 in unused slots), int32 ``[num_tokens, num_topk]`` slot of each
    entry (-1: none), int32 ``[num_experts]`` ranges and aligned counts.  ``num_expanded_tokens=0``
    sizes the buffers to fit; unless ``force_no_sync``, it then reads the counts back (a host
    sync), trims the slot maps to their sum and returns the counts as a list (else ``[]``).
    """
    if is_compiling() and not TRACING.on:
        return traced("get_fused_mapping", topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)
    try:  # a configuration seen before: only the token-count-dependent checks (the slow path says why not)
        shape = topk_idx.shape
        dev = topk_idx.device
        key = typed_key("get_fused_mapping", topk_idx.dtype, dev, shape[1:], num_experts, alignment, force_no_sync)
        fn = _fast_table().get(key)
    except (AttributeError, TypeError, IndexError):
        key = fn = None
    if (fn is not None and type(num_expanded_tokens) is int and 0 <= num_expanded_tokens <= _INT32_MAX
            and topk_idx.is_contiguous()):
        num_tokens, num_topk = shape
        numel = num_tokens * num_topk
        if numel + num_experts * (alignment - 1) <= 2**30:
            should_sync = num_expanded_tokens == 0 and not force_no_sync
            if should_sync:
                num_expanded_tokens = (numel + (alignment - 1) * num_experts) // alignment * alignment
            return _fused_mapping(fn, topk_idx, num_tokens, num_topk, numel, num_experts, num_expanded_tokens,
                                  alignment, should_sync, dev)
    op = "get_fused_mapping"
    check_tensor(op, "topk_idx", topk_idx, (torch.int64,), 2)
    check_contiguous(op, "topk_idx", topk_idx)
    num_experts = check_int(op, "num_experts", num_experts, 1, kernel_meta(_MAPPING, "max_experts"))
    num_expanded_tokens = check_int(op, "num_expanded_tokens", num_expanded_tokens, 0)
    alignment = check_int(op, "alignment", alignment, 1)
    force_no_sync = check_flag(op, "force_no_sync", force_no_sync)
    num_tokens, num_topk = topk_idx.shape
    numel = num_tokens * num_topk
    if numel + num_experts * (alignment - 1) > 2**30:
        raise fail(op, f"{num_tokens} x {num_topk} entries plus {num_experts} x (alignment {alignment} - 1) padding "
                       "exceed 2**30 slots; split the tokens or lower the alignment")
    check_cuda(op, topk_idx=topk_idx)
    should_sync = num_expanded_tokens == 0 and not force_no_sync
    if should_sync:
        num_expanded_tokens = (numel + (alignment - 1) * num_experts) // alignment * alignment
    fn = {redundant: launcher(_MAPPING, redundant=redundant) for redundant in (False, True)}
    result = _fused_mapping(fn, topk_idx, num_tokens, num_topk, numel, num_experts, num_expanded_tokens, alignment,
                            should_sync, topk_idx.device)
    # memoized only when the call's raw arguments are exactly the validated values (types included)
    if key is not None and key == typed_key("get_fused_mapping", topk_idx.dtype, topk_idx.device, topk_idx.shape[1:],
                                            num_experts, alignment, force_no_sync):
        _remember(key, fn)
    return result


def _fused_mapping(fn: Any, topk_idx: torch.Tensor, num_tokens: int, num_topk: int, numel: int, num_experts: int,
                   num_expanded_tokens: int, alignment: int, should_sync: bool, dev: torch.device) -> tuple:
    """Allocate, launch and (``should_sync``) trim: get_fused_mapping past its checks (``fn``: the
    launcher per ``redundant`` variant)."""
    blocks, redundant = _mapping_grid(numel, num_experts, num_expanded_tokens, dev)
    slots = torch.empty((3, num_expanded_tokens), dtype=torch.int32, device=dev)
    token_topk_to_pos = torch.empty((num_tokens, num_topk), dtype=torch.int32, device=dev)
    per_expert = torch.empty((3, num_experts), dtype=torch.int32, device=dev)
    workspace = torch.empty((blocks + 1, num_experts), dtype=torch.int32, device=dev)
    pos_to_expert, pos_to_token, pos_to_token_topk = slots.unbind(0)
    expert_start, expert_end, num_tokens_per_expert = per_expert.unbind(0)
    fn[redundant](topk_idx, pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
                  expert_end, num_tokens_per_expert, workspace, alignment)
    counts: list[int] = []
    if should_sync:
        counts = num_tokens_per_expert.tolist()
        used = sum(counts)
        pos_to_expert, pos_to_token, pos_to_token_topk = (pos_to_expert[:used], pos_to_token[:used],
                                                          pos_to_token_topk[:used])
    return (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
            num_tokens_per_expert, counts)


def _mapping_grid(numel: int, num_experts: int, slots: int, dev: torch.device) -> tuple[int, bool]:
    """(blocks, redundant) of moe.get_fused_mapping: up to _REDUNDANT_ENTRIES entries, a plain launch
    whose blocks each count everything (one per 128-entry warp run to walk, one per 2048 slots to fill);
    else a cooperative grid of as few blocks as give the fewest trips per warp, and at least one warp per expert
    for phase 2."""
    cap = min(get_num_sms(dev), kernel_meta(_MAPPING, "max_blocks"))  # dev's own SM count
    if numel <= _REDUNDANT_ENTRIES:
        return max(1, min(cap, _REDUNDANT_BLOCKS, max(_cdiv(numel, 128), _cdiv(slots, 2048)))), True
    per_trip = cap * _ENTRIES_PER_BLOCK
    blocks = _cdiv(numel, _cdiv(numel, per_trip) * _ENTRIES_PER_BLOCK)
    return max(1, blocks, min(cap, _cdiv(num_experts, 8))), False


# ---------------------------------------------------------------- expand_to_fused
def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """Copy row ``t`` of ``x`` (bf16 / fp32 / e4m3 ``[num_tokens, hidden]``, contiguous) to row
    ``token_topk_to_pos[t, k]`` of a new ``[len(pos_to_expert), hidden]`` tensor for every slot
    ``>= 0``; rows whose ``pos_to_expert`` is negative are zeros."""
    if is_compiling() and not TRACING.on:
        return traced("expand_to_fused", x, token_topk_to_pos, pos_to_expert)
    try:  # a configuration seen before: only the token-count-dependent checks (the slow path says why not)
        shape = x.shape
        dtype = x.dtype
        dev = x.device
        key = typed_key("expand_to_fused", dtype, dev, shape[1:], token_topk_to_pos.dtype, token_topk_to_pos.device,
               token_topk_to_pos.dim(), pos_to_expert.dtype, pos_to_expert.device, pos_to_expert.dim())
        fn = _fast_table().get(key)
    except (AttributeError, TypeError, IndexError):
        key = fn = None
    if (fn is not None and x.is_contiguous() and token_topk_to_pos.shape[0] == shape[0]
            and token_topk_to_pos.is_contiguous() and pos_to_expert.is_contiguous()
            and not (x.data_ptr() | token_topk_to_pos.data_ptr() | pos_to_expert.data_ptr()) & 15):
        out = torch.empty((pos_to_expert.shape[0], shape[1]), dtype=dtype, device=dev)
        fn(x, out, token_topk_to_pos, pos_to_expert)
        return out
    op = "expand_to_fused"
    check_tensor(op, "x", x, tuple(_EXPAND_DTYPES), 2)
    check_rows(op, "x", x)
    check_mapping(op, token_topk_to_pos, x.size(0), pos_to_expert)
    check_cuda(op, x=x, token_topk_to_pos=token_topk_to_pos, pos_to_expert=pos_to_expert)
    token_topk_to_pos, pos_to_expert = aligned_input(token_topk_to_pos), aligned_input(pos_to_expert)
    out = torch.empty((pos_to_expert.size(0), x.size(1)), dtype=x.dtype, device=x.device)
    fn = launcher("moe.expand_to_fused", dtype=_EXPAND_DTYPES[x.dtype], sf="none")
    fn(x, out, token_topk_to_pos, pos_to_expert)
    _remember(key, fn)
    return out


def expand_to_fused_with_sf(
    x: QuantTensor,
    num_per_channels: int,
    token_topk_to_pos: torch.Tensor,
    pos_to_expert: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`expand_to_fused` of a quantized ``(data, sf)`` pair: data e4m3 (or bf16)
    ``[num_tokens, hidden]``; sf contiguous, fp32 ``[num_tokens, ceil(hidden / num_per_channels)]``
    or packed UE8M0 int32 ``[num_tokens, ceil(ceil(hidden / num_per_channels) / 4)]`` (needs
    ``use_tma_aligned_col_major_sf``); ``num_per_channels`` 32 or 128.  Returns ``(out, out_sf)``;
    out_sf is row-major ``[slots, sf_cols]``, or with ``use_tma_aligned_col_major_sf`` the same
    shape with strides ``(1, align(slots, 4))``; padding rows of both are zeros."""
    if is_compiling() and not TRACING.on:
        return traced("expand_to_fused_with_sf", x, num_per_channels, token_topk_to_pos, pos_to_expert,
                      use_tma_aligned_col_major_sf)
    op = "expand_to_fused_with_sf"
    if not (isinstance(x, tuple) and len(x) == 2):
        raise fail(op, f"x must be a (data, sf) tuple, got {type(x).__name__}; use expand_to_fused for a plain tensor")
    data, x_sf = x
    check_tensor(op, "x[0] (data)", data, tuple(_EXPAND_SF_DTYPES), 2)
    check_rows(op, "x[0] (data)", data)
    check_tensor(op, "x[1] (sf)", x_sf, tuple(_SF_DTYPES), 2)
    check_contiguous(op, "x[1] (sf)", x_sf)
    if type(num_per_channels) is not int or num_per_channels not in (32, 128):
        raise fail(op, f"num_per_channels={num_per_channels!r} is not supported; supported: 32, 128")
    col = check_flag(op, "use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf)
    num_tokens, hidden = data.shape
    sf_cols = _cdiv(hidden, num_per_channels)
    if x_sf.dtype == torch.int32:
        if not col:
            raise fail(op, "packed UE8M0 scales (int32 sf) need use_tma_aligned_col_major_sf=True (as in tile_kernels)")
        sf_cols = _cdiv(sf_cols, 4)
    if tuple(x_sf.shape) != (num_tokens, sf_cols):
        raise fail(op, f"x[1] (sf) has shape {tuple(x_sf.shape)}; for data {tuple(data.shape)} with "
                       f"num_per_channels={num_per_channels} ({str(x_sf.dtype).removeprefix('torch.')}) it must be "
                       f"{(num_tokens, sf_cols)}; pass a row-major (.contiguous()) sf")
    check_mapping(op, token_topk_to_pos, num_tokens, pos_to_expert)
    check_cuda(op, data=data, sf=x_sf, token_topk_to_pos=token_topk_to_pos, pos_to_expert=pos_to_expert)
    x_sf, token_topk_to_pos, pos_to_expert = (aligned_input(x_sf), aligned_input(token_topk_to_pos),
                                              aligned_input(pos_to_expert))
    slots = pos_to_expert.size(0)
    out = torch.empty((slots, hidden), dtype=data.dtype, device=data.device)
    if col:
        out_sf = torch.empty((sf_cols, _cdiv(slots, 4) * 4), dtype=x_sf.dtype, device=data.device)[:, :slots].T
    else:
        out_sf = torch.empty((slots, sf_cols), dtype=x_sf.dtype, device=data.device)
    launcher("moe.expand_to_fused_with_sf", dtype=_EXPAND_SF_DTYPES[data.dtype], sf=_SF_DTYPES[x_sf.dtype])(
        data, x_sf, out, out_sf, token_topk_to_pos, pos_to_expert)
    return out, out_sf


# ---------------------------------------------------------------- reduce_fused
def reduce_fused(
    x: Union[torch.Tensor, QuantTensor],
    topk_weights: Optional[torch.Tensor],
    token_topk_to_pos: torch.Tensor,
    fp8_format: str = "",
    sf: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``out[t] = sum_k x[token_topk_to_pos[t, k]] * topk_weights[t, k] * x_sf[pos]`` over the slots
    ``>= 0``, in fp32 with one FMA per term in top-k order, then ``* sf[0]`` and cast.

    x: fp32 / bf16 ``[slots, hidden]`` contiguous, or ``(x, x_sf)`` with x_sf fp32 ``[slots]``;
    topk_weights: None or fp32 ``[num_tokens, num_topk]``; fp8_format ``''`` (output of x's
    dtype) or ``'e4m3'``; sf: fp32 ``[1]``, e4m3 output only; out: optional preallocated
    ``[num_tokens, hidden]`` output (contiguous, of the output dtype).  Returns the output.
    """
    if is_compiling() and not TRACING.on:
        if out is None:
            return traced("reduce_fused", x, topk_weights, token_topk_to_pos, fp8_format, sf, out)
        traced("reduce_fused_out", x, topk_weights, token_topk_to_pos, fp8_format, sf, out)
        return out
    try:  # a configuration seen before: only the token-count-dependent checks (the slow path says why not)
        xs, x_sf = x if isinstance(x, tuple) else (x, None)
        shape = xs.shape
        dev = xs.device
        key = typed_key("reduce_fused", type(x), xs.dtype, dev, shape[1:], token_topk_to_pos.dtype,
               token_topk_to_pos.device, token_topk_to_pos.shape[1:], fp8_format,
               None if x_sf is None else (x_sf.dtype, x_sf.dim(), x_sf.device),
               None if topk_weights is None else (topk_weights.dtype, topk_weights.device, topk_weights.shape[1:]),
               None if sf is None else (sf.dtype, sf.shape, sf.device),
               None if out is None else (out.dtype, out.device, out.shape[1:]))
        fast = _fast_table().get(key)
    except (AttributeError, TypeError, IndexError, ValueError):
        key = fast = None
    if fast is not None:
        result = fast(xs, x_sf, shape, dev, topk_weights, token_topk_to_pos, sf, out)
        if result is not None:
            return result
    op = "reduce_fused"
    x_sf = None
    if isinstance(x, tuple):
        if len(x) != 2:
            raise fail(op, f"a quantized x must be an (x, x_sf) pair, got a tuple of {len(x)}")
        x, x_sf = x
        if x_sf is None:
            raise fail(op, "x is an (x, x_sf) pair with x_sf None; pass the plain tensor x for unscaled rows, or "
                           "fp32 x_sf [slots]")
    check_tensor(op, "x", x, tuple(_REDUCE_DTYPES), 2)
    check_rows(op, "x", x)
    slots, hidden = x.shape
    if x_sf is not None:
        check_tensor(op, "x_sf", x_sf, (torch.float32,), 1)
        check_contiguous(op, "x_sf", x_sf)
        if x_sf.size(0) != slots:
            raise fail(op, f"x_sf has {x_sf.size(0)} scales but x has {slots} rows; pass one fp32 scale per row")
    check_tensor(op, "token_topk_to_pos", token_topk_to_pos, _INT32, 2)
    check_contiguous(op, "token_topk_to_pos", token_topk_to_pos)
    num_tokens = token_topk_to_pos.size(0)
    if topk_weights is not None:
        check_tensor(op, "topk_weights", topk_weights, (torch.float32,), 2)
        check_contiguous(op, "topk_weights", topk_weights)
        if topk_weights.shape != token_topk_to_pos.shape:
            raise fail(op, f"topk_weights has shape {tuple(topk_weights.shape)} but token_topk_to_pos has "
                           f"{tuple(token_topk_to_pos.shape)}; they must match")
    if fp8_format == "e4m3":
        out_dtype = torch.float8_e4m3fn
    elif fp8_format == "":
        out_dtype = x.dtype
        if sf is not None:
            raise fail(op, "sf is supported with fp8_format='e4m3' only (as in tile_kernels); pass sf=None")
    else:
        raise fail(op, f"fp8_format={fp8_format!r} is not supported; supported: '' (x's dtype), 'e4m3'")
    if sf is not None:
        check_tensor(op, "sf", sf, (torch.float32,), 1)
        if sf.size(0) != 1:
            raise fail(op, f"sf has shape {tuple(sf.shape)}; it must be a [1] fp32 tensor")
    if out is not None:
        check_reduce_out(op, out, (num_tokens, hidden), out_dtype)
    check_cuda(op, x=x, x_sf=x_sf, topk_weights=topk_weights, token_topk_to_pos=token_topk_to_pos, sf=sf, out=out)
    # read-only inputs in a view that starts inside a tensor (a later chunk of tokens): copied
    x_sf, topk_weights, token_topk_to_pos, sf = (aligned_input(x_sf), aligned_input(topk_weights),
                                                 aligned_input(token_topk_to_pos), aligned_input(sf))
    if out is None:
        out = torch.empty((num_tokens, hidden), dtype=out_dtype, device=x.device)
    # absent optional tensors: stand-ins of the right rank, never read (their flag is 0)
    variant = {"in_dtype": _REDUCE_DTYPES[x.dtype], "out_dtype": _OUT_KEYS[out_dtype]}
    fn, fn_few = launcher("moe.reduce_fused", **variant), launcher("moe.reduce_fused_few_tokens", **variant)
    flags = (int(topk_weights is not None), int(x_sf is not None), int(sf is not None))
    (fn if num_tokens >= _REDUCE_SPLIT_TOKENS else fn_few)(
        x, token_topk_to_pos if topk_weights is None else topk_weights, token_topk_to_pos, out,
        x if sf is None else sf, x if x_sf is None else x_sf, *flags)
    _remember(key, _Reduce(fn, out_dtype, flags, fn_few))
    return out


class _Reduce:
    """A validated reduce_fused configuration (all but the token/slot counts, pointers and strides)."""

    __slots__ = ("fn", "out_dtype", "flags", "fn_few")

    def __init__(self, fn: Any, out_dtype: torch.dtype, flags: tuple, fn_few: Any) -> None:
        """``fn``: moe.reduce_fused; ``fn_few``: moe.reduce_fused_few_tokens, launched below
        ``_REDUCE_SPLIT_TOKENS`` tokens."""
        self.fn, self.out_dtype, self.flags, self.fn_few = fn, out_dtype, flags, fn_few

    def __call__(self, x: torch.Tensor, x_sf: Any, shape: Any, dev: torch.device, topk_weights: Any,
                 token_topk_to_pos: torch.Tensor, sf: Any, out: Any) -> Optional[torch.Tensor]:
        """The output, or None when a per-call check fails (the slow path then says why)."""
        if not x.is_contiguous() or (x.data_ptr() | token_topk_to_pos.data_ptr()) & 15 \
                or not token_topk_to_pos.is_contiguous() or (sf is not None and sf.data_ptr() & 15):
            return None
        num_tokens = token_topk_to_pos.shape[0]
        if x_sf is None:
            x_sf = x
        elif x_sf.shape[0] != shape[0] or not x_sf.is_contiguous() or x_sf.data_ptr() & 15:
            return None
        if topk_weights is None:
            topk_weights = token_topk_to_pos
        elif topk_weights.shape[0] != num_tokens or not topk_weights.is_contiguous() or topk_weights.data_ptr() & 15:
            return None
        if out is None:
            out = torch.empty((num_tokens, shape[1]), dtype=self.out_dtype, device=dev)
        elif out.shape[0] != num_tokens or not out.is_contiguous() or out.data_ptr() & 15:
            return None
        fn = self.fn if num_tokens >= _REDUCE_SPLIT_TOKENS else self.fn_few
        fn(x, topk_weights, token_topk_to_pos, out, x if sf is None else sf, x_sf, *self.flags)
        return out


def _mapping_to_schema(result: tuple) -> tuple:
    """get_fused_mapping's outputs without aliases: the three slot maps are rows of one [3, n]
    tensor and the per-expert vectors rows of one [3, num_experts] tensor (a custom op's outputs
    may not alias each other): return those two."""
    return _rows_base(result[0], 3), result[3], _rows_base(result[4], 3)


def _rows_base(first: torch.Tensor, rows: int) -> torch.Tensor:
    """The ``[rows, n]`` tensor whose first row is ``first`` (rows of one contiguous allocation;
    ``first._base`` is not kept inside a fake implementation)."""
    n = first.shape[0]
    return first.as_strided((rows, n), (n, 1), first.storage_offset())


def _mapping_to_public(outputs: tuple) -> tuple:
    slots, token_topk_to_pos, per_expert = outputs
    return (*slots.unbind(0), token_topk_to_pos, *per_expert.unbind(0), [])


def _syncs(topk_idx: Any, num_experts: Any, num_expanded_tokens: Any, alignment: Any, force_no_sync: Any) -> bool:
    """get_fused_mapping sizes its outputs from the data (a host sync): not traceable."""
    return num_expanded_tokens == 0 and not force_no_sync


# the tilebin::<op> declarations (ops/_torch.py), registered through ops/moe/_torch_ops.py
TORCH_OPS = (
    TorchOp("get_fused_mapping", "(Tensor topk_idx, int num_experts, int num_expanded_tokens, int alignment, "
                                 "bool force_no_sync=False) -> (Tensor, Tensor, Tensor)",
            get_fused_mapping, result_to_schema=_mapping_to_schema, result_to_public=_mapping_to_public,
            eager_only=_syncs),
    TorchOp("expand_to_fused", "(Tensor x, Tensor token_topk_to_pos, Tensor pos_to_expert) -> Tensor", expand_to_fused),
    TorchOp("expand_to_fused_with_sf", "(Tensor x, Tensor x_sf, int num_per_channels, Tensor token_topk_to_pos, "
                                       "Tensor pos_to_expert, bool use_tma_aligned_col_major_sf=False) -> (Tensor, Tensor)",
            expand_to_fused_with_sf, to_schema=pair_to_schema, to_public=lambda x, s, *r: ((x, s), *r)),
    # reduce_fused with a preallocated out writes it: its own op, which mutates out and returns nothing
    TorchOp("reduce_fused", "(Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, "
                            "str fp8_format=\"\", Tensor? sf=None) -> Tensor",
            lambda *a: reduce_fused(*a, None), to_schema=lambda *a: pair_to_schema(*a[:-1]),
            to_public=pair_to_public),
    TorchOp("reduce_fused_out", "(Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, "
                                "str fp8_format, Tensor? sf, Tensor(a!) out) -> ()",
            reduce_fused, to_schema=pair_to_schema,
            to_public=pair_to_public, result_to_schema=lambda r: None),
)


__all__ = ["expand_to_fused", "expand_to_fused_with_sf", "get_fused_mapping", "reduce_fused"]
