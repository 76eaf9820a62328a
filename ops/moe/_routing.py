"""Fused MoE routing (``tile_kernels.moe`` 1.0.0 API): ``get_fused_mapping``, ``expand_to_fused``,
``expand_to_fused_with_sf`` and ``reduce_fused``.

Each op is declared by one :class:`tilebin.ops._spec.OpSpec`: every argument is validated before
any GPU work (device last); a refusal is a :class:`tilebin.runtime.ArgumentError` naming the op,
the value, what is supported and the fix.  A configuration (dtypes, devices, ranks, sizes but the
token / slot counts, scalars with their types; ``num_expanded_tokens`` by its type only) is
checked once; a later call checks only what depends on counts, strides and pointers
(``_routing_checks``' ``*_per_call``).  Outputs have tile_kernels' dtypes, shapes and strides;
launches go on torch's current stream, asynchronously (``get_fused_mapping`` syncs with the host
only when tile_kernels does: ``num_expanded_tokens == 0`` and not ``force_no_sync``; that form
sizes its outputs from the data, so under ``torch.compile`` it runs eagerly: a graph break on
purpose).  Sizes, hidden sizes, top-k, expert counts (<= 1024) and alignments are run-time values.

Where tilebin is stricter or more defined than tile_kernels:

* ``get_fused_mapping``'s slot order within an expert is the order of the flattened
  ``topk_idx`` (tile_kernels' depends on the SM count); results are identical under any
  :func:`tilebin.ops.config.set_num_sms`.  Entries outside ``[0, num_experts)`` are ignored
  (``token_topk_to_pos = -1``); slots past a caller-given ``num_expanded_tokens`` are not written.
* ``expand_to_fused*`` zero-fill padding rows even for 0 tokens; rows need ``hidden * itemsize``
  to be a multiple of 16 bytes.  ``reduce_fused`` needs ``hidden % 8`` (bf16) / ``% 4`` (fp32)
  instead of ``% 256``; its e4m3 output saturates at +-448 (as tile_kernels' kernel does).
* Read-only maps, weights and scales not 16-byte aligned (a view into a tensor) are copied first.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional, Union

import torch
from torch.compiler import is_compiling

from .._common import TRACING, aligned_input, check_cuda, check_int, check_tensor, fail, kernel_meta, launcher
from .._spec import FlagParam, IntParam, OpSpec, Param, TensorParam
from .._torch import TorchOp, pair_to_public, pair_to_schema, traced
from ..config import get_num_sms
from ._routing_checks import (EXPAND_DTYPES, EXPAND_SF_DTYPES, REDUCE_DTYPES, SF_DTYPES,
                              check_fp8_format, check_num_per_channels, check_reduce_out, check_reduce_x,
                              check_row_bytes, check_sf_layout, check_sf_pair, expand_per_call, expand_sf_per_call,
                              mapping_per_call, out_key, reduce_out_dtype, reduce_per_call, reduce_x_key, sf_pair_key)
from ._routing_torch import (REDUCE_OUT_SCHEMA, mapping_syncs, mapping_to_public, mapping_to_schema, no_outputs,
                             reduce_to_public, reduce_to_schema, sf_pair_to_public)

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_MAPPING = "moe.get_fused_mapping"  # its meta: max_experts (the op's limit), max_blocks (its grid cap)
_ENTRIES_PER_BLOCK = 1024  # 8 warps x 128 entries: one trip per warp (unroll 4)
_SHORT_RUN = 256  # 8 warps x one 32-entry trip: up to cap x this many entries, the unroll-1 variant
_REDUNDANT_ENTRIES = 2048  # up to this many entries: the barrier-free (redundant) variant
_REDUNDANT_BLOCKS = 32
# Below _REDUCE_SPLIT_TOKENS tokens reduce_fused launches moe.reduce_fused_few_tokens (a token spread over
# hidden / 1024 blocks; H200 decode: 2.2 us vs 20.0 at 1 token, 38.7 vs 42.3 at 1024), from there on
# moe.reduce_fused (a block per token, one row in flight: at ~17k tokens 1.6x the bytes per second), or for rows
# of at most _PAIRED_ROW_BYTES moe.reduce_fused_paired (two rows in flight; H200, ~17.6k tokens, top-k 6, e4m3 + sf:
# 2048 bf16 51.5 -> 44.7 us, 3072 fp32 104.0 -> 97.7, but 7168 fp32 213.4 -> 217.6).
_REDUCE_SPLIT_TOKENS = 1024
_PAIRED_ROW_BYTES = 12288
_INT32 = (torch.int32,)
_OUT_KEYS = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _slot_map(name: str, ndim: int) -> TensorParam:
    """An int32 slot map of get_fused_mapping (first size: tokens or slots); its contiguity: the
    op's per_call (with the other per-call checks, in the first call's order)."""
    return TensorParam(name, _INT32, ndim)


class _NumPerChannels(IntParam):
    """expand_to_fused_with_sf's ``num_per_channels``: a Python int, 32 or 128; keyed as an IntParam."""

    def check(self, op: str, value: Any) -> int:
        return check_num_per_channels(op, value)


# ---------------------------------------------------------------- get_fused_mapping
class _NumExperts(IntParam):
    """``1 <= num_experts <=`` moe.get_fused_mapping's ``max_experts`` (its manifest meta, read at
    the call: no manifest at import); keyed as an IntParam (type and value)."""

    def check(self, op: str, value: Any) -> int:
        return check_int(op, self.name, value, 1, kernel_meta(_MAPPING, "max_experts"))


class _TypeKeyed(IntParam):
    """An int whose value is no part of the configuration, only its type (``num_expanded_tokens``:
    its range is re-checked on every call, by the op's per_call)."""

    key = staticmethod(type)


def _plan_mapping(values: dict) -> Callable[..., tuple]:
    """A call allocates the maps, launches moe.get_fused_mapping (the variant and grid its entry
    and slot counts pick) and, when it sizes the maps itself, reads the counts back and trims."""
    num_experts, alignment = values["num_experts"], values["alignment"]
    sync_if_zero = not values["force_no_sync"]
    padding = (alignment - 1) * num_experts
    fns = {(redundant, unroll): launcher(_MAPPING, redundant=redundant, unroll=unroll)
           for redundant, unroll in ((False, 4), (False, 1), (True, 4))}
    max_blocks = kernel_meta(_MAPPING, "max_blocks")
    dev = values["topk_idx"].device  # part of the configuration

    def run(topk_idx: torch.Tensor, _experts: Any, num_expanded_tokens: Any, _alignment: Any, _no_sync: Any) -> tuple:
        if type(num_expanded_tokens) is not int:  # an integer-like (per_call checked it)
            num_expanded_tokens = operator.index(num_expanded_tokens)
        num_tokens, num_topk = topk_idx.shape
        numel = num_tokens * num_topk
        should_sync = num_expanded_tokens == 0 and sync_if_zero
        if should_sync:
            num_expanded_tokens = (numel + padding) // alignment * alignment
        cap = min(get_num_sms(dev), max_blocks)  # the device's own SM count, per call
        blocks, redundant, unroll = _mapping_grid(numel, num_experts, num_expanded_tokens, cap)
        return _fused_mapping(fns[redundant, unroll], topk_idx, (num_tokens, num_topk), dev, num_expanded_tokens, num_experts,
                              blocks, alignment, should_sync)

    return run


def _fused_mapping(fn: Any, topk_idx: torch.Tensor, entries: tuple[int, int], dev: torch.device,
                   num_expanded_tokens: int, num_experts: int, blocks: int, alignment: int, should_sync: bool) -> tuple:
    """Allocate on ``dev``, launch ``fn`` and (``should_sync``) trim the slot maps to the counts' sum
    (``entries``: topk_idx's shape).  Every output is its own allocation: a view costs more host time
    than an allocation (H200 host: ``unbind`` 3.3 us, ``torch.empty`` of ints 1.9 us)."""
    slots = num_expanded_tokens
    pos_to_expert, pos_to_token, pos_to_token_topk = (torch.empty(slots, dtype=torch.int32, device=dev),
                                                      torch.empty(slots, dtype=torch.int32, device=dev),
                                                      torch.empty(slots, dtype=torch.int32, device=dev))
    token_topk_to_pos = torch.empty(*entries, dtype=torch.int32, device=dev)
    expert_start, expert_end, num_tokens_per_expert = (torch.empty(num_experts, dtype=torch.int32, device=dev),
                                                       torch.empty(num_experts, dtype=torch.int32, device=dev),
                                                       torch.empty(num_experts, dtype=torch.int32, device=dev))
    workspace = torch.empty(blocks + 1, num_experts, dtype=torch.int32, device=dev)
    fn(topk_idx, pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start,
       expert_end, num_tokens_per_expert, workspace, alignment)
    counts: list[int] = []
    if should_sync:
        counts = num_tokens_per_expert.tolist()
        used = sum(counts)
        pos_to_expert, pos_to_token, pos_to_token_topk = (pos_to_expert[:used], pos_to_token[:used],
                                                          pos_to_token_topk[:used])
    return (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
            num_tokens_per_expert, counts)


def _mapping_grid(numel: int, num_experts: int, slots: int, cap: int) -> tuple[int, bool, int]:
    """(blocks, redundant, unroll) of moe.get_fused_mapping (``cap``: the SM count, at most its max_blocks):
    up to _REDUNDANT_ENTRIES entries, a plain launch whose blocks each count everything (one per 128-entry
    warp run to walk, one per 2048 slots to fill); up to ``cap * _SHORT_RUN``, one 32-entry trip per
    warp on at most ``cap`` blocks, a cooperative grid of such warps (unroll 1: the walk spread over 4x the SMs);
    else a cooperative grid of as few blocks as give the fewest 128-entry trips per warp.  Always at least
    one warp per expert for phase 2."""
    if numel <= _REDUNDANT_ENTRIES:
        return max(1, min(cap, _REDUNDANT_BLOCKS, max(_cdiv(numel, 128), _cdiv(slots, 2048)))), True, 4
    unroll = 1 if numel <= cap * _SHORT_RUN else 4
    per_block = _ENTRIES_PER_BLOCK * unroll // 4
    blocks = _cdiv(numel, _cdiv(numel, cap * per_block) * per_block)
    return max(1, blocks, min(cap, _cdiv(num_experts, 8))), False, unroll


GET_FUSED_MAPPING = OpSpec(
    "get_fused_mapping",
    (TensorParam("topk_idx", (torch.int64,), 2, contiguous=True),
     _NumExperts("num_experts"),
     _TypeKeyed("num_expanded_tokens", 0),
     IntParam("alignment", 1), FlagParam("force_no_sync", default="False")),
    "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)", _plan_mapping, per_call=mapping_per_call,
    torch=dict(result_to_schema=mapping_to_schema, result_to_public=mapping_to_public, eager_only=mapping_syncs))


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
    return GET_FUSED_MAPPING.call(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)


# ---------------------------------------------------------------- expand_to_fused
def _expand_relations(op: str, values: dict) -> None:
    """What varies per call (``expand_per_call``: a replayed call runs it from its ``run``), then x's row bytes."""
    expand_per_call(op, tuple(values.values()))
    check_row_bytes(op, "x", values["x"])


def _plan_expand(values: dict) -> Callable[..., torch.Tensor]:
    x = values["x"]
    hidden, dtype, dev = x.shape[1], x.dtype, x.device
    fn = launcher("moe.expand_to_fused", dtype=EXPAND_DTYPES[dtype], sf="none")

    def run(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
        # per call (here, not a spec per_call): expand_per_call, unless its facts plainly hold and the
        # slot maps are 16-byte aligned too; a slot map that is a view into a tensor is copied
        if TRACING.on or not (x.is_contiguous() and token_topk_to_pos.is_contiguous() and pos_to_expert.is_contiguous()
                              and token_topk_to_pos.shape[0] == x.shape[0]) or (
                x.data_ptr() | token_topk_to_pos.data_ptr() | pos_to_expert.data_ptr()) & 15:
            expand_per_call("expand_to_fused", (x, token_topk_to_pos, pos_to_expert))
            if TRACING.on or (token_topk_to_pos.data_ptr() | pos_to_expert.data_ptr()) & 15:
                token_topk_to_pos, pos_to_expert = aligned_input(token_topk_to_pos), aligned_input(pos_to_expert)
        out = torch.empty(pos_to_expert.shape[0], hidden, dtype=dtype, device=dev)
        fn(x, out, token_topk_to_pos, pos_to_expert)
        return out

    return run


EXPAND_TO_FUSED = OpSpec(
    "expand_to_fused",
    (TensorParam("x", tuple(EXPAND_DTYPES), 2), _slot_map("token_topk_to_pos", 2),
     _slot_map("pos_to_expert", 1)),
    "Tensor", _plan_expand, relations=_expand_relations)


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """Copy row ``t`` of ``x`` (bf16 / fp32 / e4m3 ``[num_tokens, hidden]``, contiguous) to row
    ``token_topk_to_pos[t, k]`` of a new ``[len(pos_to_expert), hidden]`` tensor for every slot
    ``>= 0``; rows whose ``pos_to_expert`` is negative are zeros."""
    return EXPAND_TO_FUSED.call(x, token_topk_to_pos, pos_to_expert)


def _expand_sf_relations(op: str, values: dict) -> None:
    """What varies per call (``expand_sf_per_call``: a replayed call runs it from its ``run``), the
    scales' layout, then every device."""
    expand_sf_per_call(op, tuple(values.values()))
    data, x_sf = values["x"]
    check_sf_layout(op, data, x_sf, values["num_per_channels"], values["use_tma_aligned_col_major_sf"])
    check_cuda(op, data=data, sf=x_sf, token_topk_to_pos=values["token_topk_to_pos"],
               pos_to_expert=values["pos_to_expert"])  # the pair's tensors: the spec checks TensorParams only


def _plan_expand_sf(values: dict) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    data, x_sf = values["x"]
    hidden, dtype, dev = data.shape[1], data.dtype, data.device
    sf_cols, sf_dtype = x_sf.shape[1], x_sf.dtype
    col = values["use_tma_aligned_col_major_sf"]
    fn = launcher("moe.expand_to_fused_with_sf", dtype=EXPAND_SF_DTYPES[dtype], sf=SF_DTYPES[sf_dtype])

    def run(x: QuantTensor, npc: Any, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
            col_arg: Any) -> tuple[torch.Tensor, torch.Tensor]:
        data, x_sf = x
        # per call (here, not a spec per_call): expand_sf_per_call, unless its facts plainly hold and every
        # pointer is 16-byte aligned; a read-only input that is a view into a tensor is copied
        n = data.shape[0]
        if TRACING.on or not (data.is_contiguous() and x_sf.is_contiguous() and x_sf.shape[0] == n
                              and token_topk_to_pos.is_contiguous() and token_topk_to_pos.shape[0] == n
                              and pos_to_expert.is_contiguous()) or (
                data.data_ptr() | x_sf.data_ptr() | token_topk_to_pos.data_ptr() | pos_to_expert.data_ptr()) & 15:
            expand_sf_per_call("expand_to_fused_with_sf", (x, npc, token_topk_to_pos, pos_to_expert, col_arg))
            if TRACING.on or (x_sf.data_ptr() | token_topk_to_pos.data_ptr() | pos_to_expert.data_ptr()) & 15:
                x_sf, token_topk_to_pos, pos_to_expert = (aligned_input(x_sf), aligned_input(token_topk_to_pos),
                                                          aligned_input(pos_to_expert))
        slots = pos_to_expert.shape[0]
        out = torch.empty(slots, hidden, dtype=dtype, device=dev)
        if col:
            out_sf = torch.empty(sf_cols, _cdiv(slots, 4) * 4, dtype=sf_dtype, device=dev)[:, :slots].T
        else:
            out_sf = torch.empty(slots, sf_cols, dtype=sf_dtype, device=dev)
        fn(data, x_sf, out, out_sf, token_topk_to_pos, pos_to_expert)
        return out, out_sf

    return run


EXPAND_TO_FUSED_WITH_SF = OpSpec(
    "expand_to_fused_with_sf",
    (Param("x", "Tensor", check_sf_pair, key_of=sf_pair_key),
     _NumPerChannels("num_per_channels"),
     _slot_map("token_topk_to_pos", 2), _slot_map("pos_to_expert", 1),
     FlagParam("use_tma_aligned_col_major_sf", default="False")),
    "(Tensor, Tensor)", _plan_expand_sf, relations=_expand_sf_relations,
    schema_args=("Tensor x, Tensor x_sf, int num_per_channels, Tensor token_topk_to_pos, Tensor pos_to_expert, "
                 "bool use_tma_aligned_col_major_sf=False"),
    torch=dict(to_schema=pair_to_schema, to_public=sf_pair_to_public))


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
    return EXPAND_TO_FUSED_WITH_SF.call(x, num_per_channels, token_topk_to_pos, pos_to_expert,
                                        use_tma_aligned_col_major_sf)


# ---------------------------------------------------------------- reduce_fused
class _CheckedLater(TensorParam):
    """A tensor its op's ``relations`` check (after what they depend on), keyed as a TensorParam."""

    def check(self, op: str, value: Any) -> Any:
        return value


def _reduce_relations(op: str, values: dict) -> None:
    """What varies per call (``reduce_per_call``: a replayed call runs it from its ``run``); sf only
    with e4m3 output, an fp32 [1]; out's dtype, shape and rows; every device."""
    reduce_per_call(op, tuple(values.values()))
    x, fp8_format, sf, out = values["x"], values["fp8_format"], values["sf"], values["out"]
    data, x_sf = x if isinstance(x, tuple) else (x, None)
    if sf is not None:
        if fp8_format == "":
            raise fail(op, "sf is supported with fp8_format='e4m3' only (as in tile_kernels); pass sf=None")
        check_tensor(op, "sf", sf, (torch.float32,), 1)
        if sf.size(0) != 1:
            raise fail(op, f"sf has shape {tuple(sf.shape)}; it must be a [1] fp32 tensor")
    token_topk_to_pos = values["token_topk_to_pos"]
    if out is not None:
        check_reduce_out(op, out, (token_topk_to_pos.size(0), data.size(1)), reduce_out_dtype(fp8_format, data))
    check_cuda(op, x=data, x_sf=x_sf, topk_weights=values["topk_weights"], token_topk_to_pos=token_topk_to_pos,
               sf=sf, out=out)  # x and out are no TensorParams: the spec's own device check skips them


def _plan_reduce(values: dict) -> Callable[..., torch.Tensor]:
    """A call copies misaligned read-only inputs, allocates out (unless given) and launches
    moe.reduce_fused_few_tokens below _REDUCE_SPLIT_TOKENS tokens, from there on moe.reduce_fused_paired
    for rows of at most _PAIRED_ROW_BYTES bytes (fixed by the configuration: chosen here), else moe.reduce_fused."""
    pair = isinstance(values["x"], tuple)
    data = values["x"][0] if pair else values["x"]
    out_dtype = reduce_out_dtype(values["fp8_format"], data)
    hidden, dev = data.shape[1], data.device
    variant = {"in_dtype": REDUCE_DTYPES[data.dtype], "out_dtype": _OUT_KEYS[out_dtype]}
    many = "moe.reduce_fused_paired" if hidden * data.element_size() <= _PAIRED_ROW_BYTES else "moe.reduce_fused"
    fns = (launcher("moe.reduce_fused_few_tokens", **variant), launcher(many, **variant))
    # absent optional tensors: stand-ins of the right rank, never read (their flag is 0)
    flags = (int(values["topk_weights"] is not None), int(pair), int(values["sf"] is not None))

    def run(x: Any, topk_weights: Optional[torch.Tensor], token_topk_to_pos: torch.Tensor, _fmt: Any,
            sf: Optional[torch.Tensor], out: Optional[torch.Tensor]) -> torch.Tensor:
        # per call (here, not a spec per_call): the common call (a plain x, weights of the index map's
        # shape, no sf, no out; all contiguous and 16-byte aligned) in one test; any other call runs
        # reduce_per_call, and copies a read-only input that is a view into a tensor
        entries = token_topk_to_pos.shape  # [num_tokens, num_topk]
        if pair or out is not None or sf is not None or topk_weights is None or TRACING.on or not (
                x.is_contiguous() and token_topk_to_pos.is_contiguous() and topk_weights.is_contiguous()
                and topk_weights.shape == entries
                and not (x.data_ptr() | token_topk_to_pos.data_ptr() | topk_weights.data_ptr()) % 16):
            reduce_per_call("reduce_fused", (x, topk_weights, token_topk_to_pos, _fmt, sf, out))
            x_sf = x[1] if pair else None
            if TRACING.on or _pointers(x_sf, topk_weights, token_topk_to_pos, sf) & 15:  # a view into a tensor
                x_sf, topk_weights, token_topk_to_pos, sf = (aligned_input(x_sf), aligned_input(topk_weights),
                                                             aligned_input(token_topk_to_pos), aligned_input(sf))
        else:
            x_sf = None
        if pair:
            x = x[0]
        weights = token_topk_to_pos if topk_weights is None else topk_weights
        num_tokens = entries[0]
        if out is None:
            out = torch.empty(num_tokens, hidden, dtype=out_dtype, device=dev)
        # fake tensors launch nothing, and their token count may be symbolic (a SymBool indexes nothing)
        fn = fns[1 if TRACING.on else num_tokens >= _REDUCE_SPLIT_TOKENS]
        fn(x, weights, token_topk_to_pos, out, x if sf is None else sf, x if x_sf is None else x_sf, *flags)
        return out

    return run


def _pointers(x_sf: Optional[torch.Tensor], topk_weights: Optional[torch.Tensor], token_topk_to_pos: torch.Tensor,
              sf: Optional[torch.Tensor]) -> int:
    """The data pointers of reduce_fused's read-only inputs OR-ed (their alignment in one test)."""
    bits = token_topk_to_pos.data_ptr()
    if x_sf is not None:
        bits |= x_sf.data_ptr()
    if topk_weights is not None:
        bits |= topk_weights.data_ptr()
    if sf is not None:
        bits |= sf.data_ptr()
    return bits


REDUCE_FUSED = OpSpec(
    "reduce_fused",
    (Param("x", "Tensor", check_reduce_x, key_of=reduce_x_key),
     TensorParam("topk_weights", (torch.float32,), 2, optional=True),  # contiguity: reduce_per_call
     TensorParam("token_topk_to_pos", _INT32, 2),
     Param("fp8_format", "str", check_fp8_format),
     _CheckedLater("sf", (torch.float32,), 1, optional=True, rows_vary=False),  # after fp8_format's relation
     Param("out", "Tensor?", key_of=out_key)),
    "Tensor", _plan_reduce, relations=_reduce_relations,
    schema_args=('Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, str fp8_format="", '
                 'Tensor? sf=None'),
    torch=dict(to_schema=reduce_to_schema, to_public=reduce_to_public))


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
    if out is not None and is_compiling() and not TRACING.on:  # the spec records tilebin::reduce_fused only
        traced("reduce_fused_out", x, topk_weights, token_topk_to_pos, fp8_format, sf, out)
        return out
    return REDUCE_FUSED.call(x, topk_weights, token_topk_to_pos, fp8_format, sf, out)


SPECS = (GET_FUSED_MAPPING, EXPAND_TO_FUSED, EXPAND_TO_FUSED_WITH_SF, REDUCE_FUSED)
# the tilebin::<op> declarations (ops/_torch.py), registered through ops/moe/_torch_ops.py; one public
# function, reduce_fused, backs two custom ops (with and without out)
TORCH_OPS = (
    GET_FUSED_MAPPING.torch_op(get_fused_mapping),
    EXPAND_TO_FUSED.torch_op(expand_to_fused),
    EXPAND_TO_FUSED_WITH_SF.torch_op(expand_to_fused_with_sf),
    REDUCE_FUSED.torch_op(reduce_fused),
    TorchOp("reduce_fused_out", REDUCE_OUT_SCHEMA, reduce_fused, REDUCE_FUSED.fake, to_schema=pair_to_schema,
            to_public=pair_to_public, result_to_schema=no_outputs),
)


__all__ = ["expand_to_fused", "expand_to_fused_with_sf", "get_fused_mapping", "reduce_fused"]
