"""Per-block casts (``tile_kernels.quant`` 1.0.0 API): ``per_block_cast``, its sf-only and
precomputed-sf forms, and ``per_block_cast_lossless`` (e2m1 (1, 32) -> e4m3, exact).

Each op is declared by one :class:`tilebin.ops._spec.OpSpec`: every argument is validated
before any GPU work (device last) and a refusal is a :class:`tilebin.runtime.ArgumentError`
naming the op, the value, what is supported and the fix.  A configuration (dtypes, hidden,
device, fmt, block sizes, flags, each with its exact type; for the pair of the lossless cast
its scale layout) is checked once; a later call of it checks only what depends on the token
count or the pointers (contiguity, int32 element counts, 16-byte alignment, the scales' row
count).  Outputs are fresh tensors with tile_kernels' layouts; launches go on torch's current
stream.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from tilebin.runtime._record import record

from .._common import TRACING, aligned_input, check_cuda, check_tensor, fail, launcher, ptr
from .._spec import FlagParam, OpSpec, Param, TensorParam
from .._torch import pair_to_public, pair_to_schema
from ._per_block_checks import (BLOCKS, LOSSLESS_IN_BLOCK, LOSSLESS_OUT_BLOCKS, block_param, check_rows,
                                fmt_param, lossless_per_call, lossless_x, lossless_x_key, precomputed_per_call)
from ._sf import FMT_DTYPES, SfLayout, input_sf, output_layout

_KIND = {"row": 0, "col": 1, "ue8m0": 2}
_INT32_MAX = 2**31 - 1
_IN_DTYPES = (torch.bfloat16, torch.float32)
_KERNEL = "quant.per_block_cast"


@record
class _Rows(TensorParam):
    """``x`` of the per-block casts, bf16/fp32 ``[tokens, hidden]``, with this module's checks and
    wording (:func:`check_rows`): contiguous, ``hidden % 64 == 0``, at most 2**31 - 1 elements,
    16-byte aligned; the spec repeats the token- and pointer-dependent ones on every call."""

    contiguous: bool = True  # OpSpec runs check_call on every call of a parameter that says so
    # OpSpec's cheap test before check_call ({s}: x.shape), true whenever check_call raises: for a
    # contiguous x, a last-dim stride other than 1 with hidden > 1 means an empty x (stride(1) read only then)
    call_test = ("not {a}.is_contiguous() or {a}.data_ptr() & 15 or {s}[0] * {s}[1] > 2147483647 "
                 "or not {s}[0] and {a}.stride(1) != 1 and {s}[1] > 1")

    def check(self, op: str, value: Any) -> Any:
        check_tensor(op, self.name, value, self.dtypes, self.ndim)
        check_rows(op, self.name, value, value.shape[1])
        return value

    def check_call(self, op: str, t: torch.Tensor) -> None:  # a replayed call: never a fake tensor (data_ptr)
        s = t.shape
        # an empty tensor is "contiguous" whatever its strides, but check_aligned still refuses a
        # last-dim stride other than 1: test what the first call's checks test
        if (not t.is_contiguous() or t.data_ptr() & 15 or s[0] * s[1] > _INT32_MAX
                or t.stride(1) != 1 and s[1] > 1):
            check_rows(op, self.name, t, s[1])  # says which (the first call's message)


def _layout_relation(op: str, values: dict) -> None:
    """Packed UE8M0 scales need the column-major layout and power-of-two scales."""
    output_layout(op, values["block_size"], values["use_tma_aligned_col_major_sf"], values["use_packed_ue8m0"],
                  values["round_sf"])


def _launch_of(values: dict, sf_only: bool) -> Callable[..., None]:
    x, block = values["x"], values["block_size"]
    return launcher(_KERNEL, in_dtype=str(x.dtype).removeprefix("torch."), fmt=values["fmt"], block=block[0],
                    sf_only=sf_only)


def _plan_cast(sf_only: bool) -> Callable[[dict], Callable[..., Any]]:
    """per_block_cast (``(out, sf)``) or its sf-only form (``sf``; ``out`` a [1, 16] stand-in)."""

    def plan(values: dict) -> Callable[..., Any]:
        layout = output_layout("", values["block_size"], values["use_tma_aligned_col_major_sf"],
                               values["use_packed_ue8m0"], values["round_sf"])
        x, out_dtype = values["x"], FMT_DTYPES[values["fmt"]]
        hidden, device = x.shape[1], x.device  # both part of the configuration
        out_cols = hidden if values["fmt"] == "e4m3" else hidden // 2
        fn, scalars = _launch_of(values, sf_only), (_KIND[layout.kind], int(values["round_sf"]), 0)
        # sf_only: the kernel's out argument, which its sf_only variant never writes (one per configuration)
        unwritten = torch.empty(1, 16, dtype=out_dtype, device=device) if sf_only else None
        if layout.kind == "row":
            return _row_major_run(fn, scalars, out_dtype, out_cols, device, layout.block[0],
                                  layout.shape(0, hidden)[1], unwritten)
        alloc, finish = layout.alloc, layout.finish

        def run(x: torch.Tensor, *_: Any) -> Any:
            tokens = x.shape[0]
            out = unwritten if sf_only else torch.empty(tokens, out_cols, dtype=out_dtype, device=device)
            sf = finish(alloc(tokens, hidden, device), tokens)  # the kernel writes the returned layout
            if tokens:
                fn(x, out, sf, *scalars)
            return sf if sf_only else (out, sf)

        return run

    return plan


def _row_major_run(fn: Callable[..., None], scalars: tuple, out_dtype: torch.dtype, out_cols: int,
                   device: torch.device, rows_per_scale: int, sf_cols: int,
                   unwritten: Optional[torch.Tensor]) -> Callable[..., Any]:
    """per_block_cast with row-major fp32 scales (the default layout; decode's hot call): the
    scales ``[ceil(tokens / rows_per_scale), sf_cols]`` allocated directly (what SfLayout.alloc
    makes for the row layout, and SfLayout.finish returns as is).  ``unwritten``: the sf-only
    form's stand-in ``out`` (it returns the scales only), else None."""
    sf_only = unwritten is not None

    def run(x: torch.Tensor, *_: Any) -> Any:
        tokens = x.shape[0]
        out = unwritten if sf_only else torch.empty(tokens, out_cols, dtype=out_dtype, device=device)
        sf = torch.empty(-(-tokens // rows_per_scale), sf_cols, dtype=torch.float32, device=device)
        if tokens:
            fn(x, out, sf, *scalars)
        return sf if sf_only else (out, sf)

    return run


def _cast_params() -> tuple:
    """x, fmt, block_size and the three flags."""
    return (_Rows("x", _IN_DTYPES, 2), fmt_param(), block_param("block_size", BLOCKS),
            FlagParam("use_tma_aligned_col_major_sf", "False"), FlagParam("round_sf", "False"),
            FlagParam("use_packed_ue8m0", "False"))


PER_BLOCK_CAST = OpSpec("per_block_cast", _cast_params(), "(Tensor, Tensor)", _plan_cast(False),
                        relations=_layout_relation)
PER_BLOCK_CAST_WITH_SF_ONLY = OpSpec("per_block_cast_with_sf_only", _cast_params(), "Tensor", _plan_cast(True),
                                     relations=_layout_relation)


def per_block_cast(x: torch.Tensor, fmt: str, block_size: tuple[int, int], use_tma_aligned_col_major_sf: bool = False,
                   round_sf: bool = False, use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast ``x`` (bf16/fp32 ``[tokens, hidden]``, contiguous, hidden % 64 == 0) to ``fmt``
    (``'e4m3'``, or ``'e2m1'`` packed two per int8 byte) with one scale per ``block_size`` block
    ((128, 128) or (32, 32)).  Returns ``(out, sf)`` laid out as tile_kernels does
    (see ``ops/quant/_sf.py``); raises ArgumentError for anything unsupported."""
    return PER_BLOCK_CAST.call(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def per_block_cast_with_sf_only(x: torch.Tensor, fmt: str, block_size: tuple[int, int],
                                use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                use_packed_ue8m0: bool = False) -> torch.Tensor:
    """The scales :func:`per_block_cast` would return, without writing the cast data."""
    return PER_BLOCK_CAST_WITH_SF_ONLY.call(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


# ------------------------------------------------------------------------------ precomputed sf
def _row_major_only(op: str, values: dict) -> None:
    """sf's shape for the call's tokens (``precomputed_per_call``; a replayed call runs it from its
    ``run``), then: precomputed scales are row-major fp32, so neither layout flag may be set."""
    precomputed_per_call(op, tuple(values.values()))
    col, packed = values["use_tma_aligned_col_major_sf"], values["use_packed_ue8m0"]
    if col or packed:
        raise fail(op, f"use_tma_aligned_col_major_sf={col}, use_packed_ue8m0={packed}: precomputed scales are "
                       f"row-major fp32 only; pass both as False")


def _plan_precomputed(values: dict) -> Callable[..., torch.Tensor]:
    x, out_dtype = values["x"], FMT_DTYPES[values["fmt"]]
    device, out_cols = x.device, x.shape[1] if values["fmt"] == "e4m3" else x.shape[1] // 2
    fn, scalars = _launch_of(values, False), (_KIND["row"], int(values["round_sf"]), 1)
    rows_per_scale, sf_cols = values["block_size"][0], -(-x.shape[1] // values["block_size"][1])

    def run(x: torch.Tensor, _fmt: Any, block: Any, sf: torch.Tensor, *rest: Any) -> torch.Tensor:
        tokens = x.shape[0]
        # per call (here, not a spec per_call; relations run it on a first call): one scale per block
        if sf.shape != (-(-tokens // rows_per_scale), sf_cols):
            precomputed_per_call("per_block_cast_with_precomputed_sf", (x, _fmt, block, sf, *rest))
        out = torch.empty(tokens, out_cols, dtype=out_dtype, device=device)
        if tokens:
            if sf.numel() and (not sf.is_contiguous() or ptr(sf) % 16):
                sf = sf.clone(memory_format=torch.contiguous_format)  # row-major, 16-byte aligned, as checked
            fn(x, out, sf, *scalars)
        return out

    return run


PER_BLOCK_CAST_WITH_PRECOMPUTED_SF = OpSpec(
    "per_block_cast_with_precomputed_sf",
    (*_cast_params()[:3], TensorParam("sf", (torch.float32,), 2), *_cast_params()[3:]), "Tensor", _plan_precomputed,
    relations=_row_major_only)


def per_block_cast_with_precomputed_sf(x: torch.Tensor, fmt: str, block_size: tuple[int, int], sf: torch.Tensor,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False) -> torch.Tensor:
    """Cast ``x`` with given row-major fp32 scales ``sf`` (``[ceil(tokens / b), ceil(hidden / b)]``):
    ``out = cast(x * (1 / sf))``.  The layout flags must be False; ``round_sf`` is ignored."""
    return PER_BLOCK_CAST_WITH_PRECOMPUTED_SF.call(x, fmt, block_size, sf, use_tma_aligned_col_major_sf, round_sf,
                                                   use_packed_ue8m0)


# ------------------------------------------------------------------------------------ lossless
def _lossless_relations(op: str, values: dict) -> None:
    """The data's rows and the scales' shape (``lossless_per_call``: a replayed call runs it from its
    ``run``); the output layout's flags agree; then the pair's device (the pair is not a TensorParam)."""
    lossless_per_call(op, (values["x"],))
    output_layout(op, values["out_block_size"], values["use_tma_aligned_col_major_sf"], values["use_packed_ue8m0"],
                  True)
    data, x_sf, _ = input_sf(op, values["x"], LOSSLESS_IN_BLOCK)
    check_cuda(op, data=data, sf=x_sf)


def _plan_lossless(values: dict) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    data, _, in_layout = input_sf("", values["x"], LOSSLESS_IN_BLOCK)
    kind, device, out_block = in_layout.kind, data.device, values["out_block_size"]
    layout = SfLayout(out_block, values["use_tma_aligned_col_major_sf"], values["use_packed_ue8m0"])
    fn = launcher("quant.per_block_cast_lossless", block_m=out_block[0], block_k=out_block[1])
    kinds = (_KIND[kind], _KIND[layout.kind])

    hidden = data.shape[1] * 2  # part of the configuration
    # row-major fp32 output scales (the default): made here; the other layouts through SfLayout
    row_out, rows_per_scale, sf_cols = not layout.col_major, out_block[0], layout.shape(1, hidden)[1]
    # the scales' user-side shape per token count (lossless_per_call's test): one row per token
    groups = -(-hidden // LOSSLESS_IN_BLOCK[1])
    sf_user_cols = -(-groups // 4) if kind == "ue8m0" else groups

    def run(x: tuple, *_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        data, sf = x
        tokens = data.shape[0]
        # per call (here, not a spec per_call): lossless_per_call, unless its facts plainly hold
        if not (tokens and data.is_contiguous() and (TRACING.on or not data.data_ptr() % 16)
                and tokens * hidden <= _INT32_MAX and sf.shape == (tokens, sf_user_cols)):
            lossless_per_call("per_block_cast_lossless", (x,))
        out = torch.empty(tokens, hidden, dtype=torch.float8_e4m3fn, device=device)
        out_sf = torch.empty(-(-tokens // rows_per_scale), sf_cols, dtype=torch.float32, device=device) if row_out \
            else layout.finish(layout.alloc(tokens, hidden, device), tokens)
        if tokens:
            # the kernel reads both scale tensors as the user holds them, as 4-byte words with their
            # strides (int8 or uint8 data alike): no views
            fn(data, aligned_input(sf), out, out_sf, *kinds)
        return out, out_sf

    return run


PER_BLOCK_CAST_LOSSLESS = OpSpec(
    "per_block_cast_lossless",
    (Param("x", "Tensor", lossless_x, key_of=lossless_x_key), fmt_param(("e4m3",)),
     block_param("x_block_size", (LOSSLESS_IN_BLOCK,), pair_input=True),
     block_param("out_block_size", LOSSLESS_OUT_BLOCKS), FlagParam("use_tma_aligned_col_major_sf", "False"),
     Param("round_sf", "bool", default="False"),  # implied (power-of-two scales), unread
     FlagParam("use_packed_ue8m0", "False")),
    "(Tensor, Tensor)", _plan_lossless, relations=_lossless_relations,
    schema_args="Tensor x, Tensor x_sf, str fmt, int[] x_block_size, int[] out_block_size, "
                "bool use_tma_aligned_col_major_sf=False, bool round_sf=False, bool use_packed_ue8m0=False",
    torch=dict(to_schema=pair_to_schema, to_public=pair_to_public))


def per_block_cast_lossless(x: tuple[torch.Tensor, torch.Tensor], fmt: str, x_block_size: tuple[int, int],
                            out_block_size: tuple[int, int], use_tma_aligned_col_major_sf: bool = False,
                            round_sf: bool = False, use_packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-quantize ``x = (data, sf)`` (packed e2m1 int8 ``[tokens, hidden // 2]`` with power-of-two
    (1, 32) scales in any layout) to e4m3 with power-of-two ``out_block_size`` scales ((1, 128),
    (32, 32) or (128, 128)), exactly when every input scale of an output block is within 2**11 of
    the block's largest.  ``fmt`` must be ``'e4m3'``; ``round_sf`` is implied (the scales are powers
    of two).  Returns ``(out, out_sf)``."""
    return PER_BLOCK_CAST_LOSSLESS.call(x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf,
                                        round_sf, use_packed_ue8m0)


SPECS = (PER_BLOCK_CAST, PER_BLOCK_CAST_WITH_SF_ONLY, PER_BLOCK_CAST_WITH_PRECOMPUTED_SF, PER_BLOCK_CAST_LOSSLESS)
# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (PER_BLOCK_CAST.torch_op(per_block_cast), PER_BLOCK_CAST_WITH_SF_ONLY.torch_op(per_block_cast_with_sf_only),
             PER_BLOCK_CAST_WITH_PRECOMPUTED_SF.torch_op(per_block_cast_with_precomputed_sf),
             PER_BLOCK_CAST_LOSSLESS.torch_op(per_block_cast_lossless))

__all__ = ["per_block_cast", "per_block_cast_with_sf_only", "per_block_cast_with_precomputed_sf",
           "per_block_cast_lossless"]
