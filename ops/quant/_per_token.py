"""Per-token casts: one scale per token and ``num_per_channels`` channels.

Same names, signatures, defaults and outputs as ``tile_kernels.quant`` 1.0.0
(``per_token_cast``, ``per_token_cast_with_sf_only``, ``per_token_cast_with_precomputed_sf``),
bit-identical to ``tile_kernels.torch.cast(x, fmt, (1, num_per_channels), ...)``:

* ``fmt``: ``'e4m3'`` (float8_e4m3fn ``[tokens, hidden]``) or ``'e2m1'`` (two values per int8
  byte, ``[tokens, hidden // 2]``); ``per_token_cast`` also takes ``'e5m6'``, which runs
  ``per_token_cast_to_e5m6``'s checks and launch (``ops/quant/_e5m6.py``).
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

Each op is declared by an ``OpSpec`` (``ops/_spec.py``; checks: ``_per_token_checks.py``): a
configuration (dtypes, sizes but the token count, device, fmt, ``num_per_channels``, the flags,
each with its type) is checked once; a later call of it runs only the checks that read the token
count, strides or pointers (a quantized pair's, precomputed scales', E5M6's element limit) and
launches.  ``per_token_cast`` of a quantized pair is its own spec (:data:`CAST_PAIR`, same
custom op): :data:`CAST` keys a plain tensor input, the hot path, inline.

Kernels: ``quant.per_token_cast`` (plain input), ``quant.per_token_cast_quantized``,
``quant.per_token_cast_sf_only``, ``quant.per_token_cast_precomputed``; and for up to
``meta["max_tokens"]`` (256) tokens of a plain input cast to e4m3 with fp32 scales and 16..128
channels per scale, ``quant.per_token_cast_decode`` (same parameters and bits as
``quant.per_token_cast``, one scale group per lane: faster at decode sizes).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from .._common import TRACING, aligned_input, check_cuda, fail, kernel_meta, launcher, ptr
from .._spec import OpSpec, block_key
from .._torch import TorchOp, pair_to_public, pair_to_schema
from ._per_token_checks import (INT32_MAX, PLAIN, Config, Deferred, Scales, check_config, deferred, kernel_scales,
                                pair_call_checks, pair_key, scales_call_checks)
from ._sf import SCHEMA_FLAGS as _FLAGS, FMT_DTYPES

QuantTensor = tuple[torch.Tensor, torch.Tensor]

_KERNEL = {"cast": "quant.per_token_cast", "quantized": "quant.per_token_cast_quantized",
           "sf_only": "quant.per_token_cast_sf_only", "precomputed": "quant.per_token_cast_precomputed"}
# per_token_cast of plain bf16/fp32 -> e4m3 with fp32 scales (row- or column-major) and 16..128 channels
# per scale, up to its meta "max_tokens" tokens (decode): same parameters and bits as _KERNEL["cast"]
_CAST_DECODE = "quant.per_token_cast_decode"
_FLAG_NAMES = ("use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0")


def _chunk(in_dtype: str) -> int:
    """Channels one thread block covers for this input dtype (the kernel's ``meta``)."""
    return kernel_meta("quant.per_token_cast", f"chunk_{in_dtype}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _kernel_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its rows are 16-byte aligned with unit column stride, else a copy."""
    per_vector = 16 // x.element_size()
    stride = x.stride(0)
    rows_ok = x.size(0) <= 1 or 0 < stride <= INT32_MAX and stride % per_vector == 0
    if (x.stride(1) == 1 or x.size(1) <= 1) and rows_ok and ptr(x) % 16 == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _kernel_key(cfg: Config, mode: str) -> dict:
    in_sf = "none" if cfg.in_layout is None else ("ue8m0" if cfg.in_layout.packed_ue8m0 else "f32")
    return dict(in_dtype=cfg.key_in, fmt=cfg.fmt, sf="ue8m0" if cfg.layout.packed_ue8m0 else "f32", mode=mode,
                in_sf=in_sf)


def _out_shape(cfg: Config) -> tuple[int, torch.dtype]:
    """Columns and dtype of the cast's output."""
    return (cfg.hidden if cfg.fmt == "e4m3" else cfg.hidden // 2), FMT_DTYPES[cfg.fmt]


def _cast_scalars(cfg: Config) -> tuple[tuple, int, tuple]:
    """quant.per_token_cast's scalars; the most tokens quant.per_token_cast_decode serves in this
    configuration (-1: none) and its scalars (same parameters, its own column-block count)."""
    args = (cfg.group_shift, int(cfg.whole_row), int(cfg.rnd), int(cfg.layout.col_major),
            1 if cfg.whole_row else _cdiv(cfg.hidden, _chunk(cfg.key_in)))
    if cfg.fmt != "e4m3" or cfg.layout.packed_ue8m0 or cfg.whole_row:
        return args, -1, ()
    chunk = kernel_meta(_CAST_DECODE, f"chunk_{cfg.key_in}")
    return args, kernel_meta(_CAST_DECODE, "max_tokens"), args[:4] + (_cdiv(cfg.hidden, chunk),)


def _plain_run(cfg: Config, device: torch.device) -> Callable[..., QuantTensor]:
    """``per_token_cast`` of a plain bf16/fp32 x (the hot path) on ``device`` (part of the configuration):
    allocate, pick the decode kernel up to its token limit, launch (a misaligned or strided x through
    a contiguous copy)."""
    hidden, layout = cfg.hidden, cfg.layout
    out_cols, out_dtype = _out_shape(cfg)
    row = layout.kind == "row"  # row-major fp32 scales (the common layout): SfLayout.alloc's tensor, made here
    sf_cols = layout.shape(1, hidden)[1]
    alloc, finish = layout.alloc, layout.finish
    key = _kernel_key(cfg, "cast")
    args, decode_max, decode_args = _cast_scalars(cfg)
    live = hidden > 0 and not TRACING.on  # fake tensors (tracing): nothing to read or launch
    decode = general = None  # launchers, looked up at their first launch (decode-only processes never load general)

    def run(x: torch.Tensor, fmt: Any, npc: Any, block: Any, col: Any, rnd: Any, packed: Any) -> QuantTensor:
        # (the scalars are the configuration's, in plan; named, not *_: no tuple packed per call)
        nonlocal decode, general
        tokens = x.shape[0]
        out = torch.empty(tokens, out_cols, dtype=out_dtype, device=device)
        raw_sf = torch.empty(tokens, sf_cols, dtype=torch.float32, device=device) if row else \
            alloc(tokens, hidden, device)
        if tokens and live:
            # contiguous and 16-byte aligned: what _kernel_input passes through as is (hidden % 16 == 0)
            x_in = x if x.is_contiguous() and not x.data_ptr() & 15 else _kernel_input(x)
            if tokens <= decode_max:
                if decode is None:
                    decode = launcher(_CAST_DECODE, **key)
                decode(x_in, out, raw_sf, *decode_args)
            else:
                if general is None:
                    general = launcher(_KERNEL["cast"], **key)
                general(x_in, out, raw_sf, *args)
        return out, (raw_sf if row else finish(raw_sf, tokens))

    return run


def _pair_run(op: str, cfg: Config) -> Callable[..., QuantTensor]:
    """``per_token_cast`` of a quantized ``(data, sf)``: the per-call checks of the pair, then
    allocate and launch ``quant.per_token_cast_quantized``."""
    hidden, layout, in_layout = cfg.hidden, cfg.layout, cfg.in_layout
    out_cols, out_dtype = _out_shape(cfg)
    fn = launcher(_KERNEL["quantized"], **_kernel_key(cfg, "cast")) if hidden else None
    scalars = (cfg.group_shift, int(cfg.whole_row), int(cfg.rnd), int(layout.col_major),
               1 if cfg.whole_row else _cdiv(hidden, _chunk(cfg.key_in)), int(in_layout.col_major),
               in_layout.block[0].bit_length() - 1, in_layout.block[1].bit_length() - 1)

    def run(x: tuple, *_: Any) -> QuantTensor:
        data, sf = x
        kernel_sf = kernel_scales(sf, in_layout)
        pair_call_checks(op, x, data, kernel_sf, in_layout, hidden)
        tokens = data.size(0)
        out = torch.empty(tokens, out_cols, dtype=out_dtype, device=data.device)
        raw_sf = layout.alloc(tokens, hidden, data.device)
        if tokens and hidden:
            fn(data, aligned_input(kernel_sf), out, raw_sf, *scalars)
        return out, layout.finish(raw_sf, tokens)

    return run


def _cast_relations(op: str, values: dict) -> None:
    """per_token_cast's checks: fmt='e5m6' runs per_token_cast_to_e5m6's; the device last (a
    quantized pair's tensors here, a plain x's by the spec)."""
    if values["fmt"] == "e5m6":
        if values["x_block_size"] is not None:
            raise fail(op, f"x_block_size={values['x_block_size']!r} is not supported with fmt='e5m6' "
                           "(a plain bf16/fp32 input only); pass None")
        from . import _e5m6  # imported here: the E5M6 module is needed only by fmt='e5m6'

        _e5m6.check(values["x"], values["num_per_channels"], *(values[name] for name in _FLAG_NAMES))
        return
    cfg, data, kernel_sf = check_config(op, "cast", values)
    if cfg.in_layout is not None:
        check_cuda(op, x=data, x_sf=kernel_sf)


def _plan_cast(values: dict) -> Callable[..., QuantTensor]:
    if values["fmt"] == "e5m6":
        from . import _e5m6

        return _e5m6.plan(values["x"], *(values[name] for name in _FLAG_NAMES))
    cfg = check_config("per_token_cast", "cast", values)[0]
    return _plain_run(cfg, values["x"].device) if cfg.in_layout is None else _pair_run("per_token_cast", cfg)


def _plan_sf_only(values: dict) -> Callable[..., torch.Tensor]:
    cfg = check_config("per_token_cast_with_sf_only", "sf_only", values)[0]
    hidden, layout = cfg.hidden, cfg.layout
    fn = launcher(_KERNEL["sf_only"], **_kernel_key(cfg, "sf_only")) if hidden else None
    scalars = (cfg.group_shift, int(cfg.whole_row), int(cfg.rnd), int(layout.col_major),
               1 if cfg.whole_row else _cdiv(hidden, _chunk(cfg.key_in)))

    device, alloc, finish, col = values["x"].device, layout.alloc, layout.finish, layout.col_major

    def run(x: torch.Tensor, *_: Any) -> torch.Tensor:
        tokens = x.shape[0]
        raw_sf = alloc(tokens, hidden, device)
        if tokens and hidden:
            # contiguous and 16-byte aligned: what _kernel_input passes through as is (hidden % 16 == 0)
            fn(x if x.is_contiguous() and not ptr(x) % 16 else _kernel_input(x), raw_sf, *scalars)
        return finish(raw_sf, tokens) if col else raw_sf

    return run


def _plan_precomputed(values: dict) -> Callable[..., torch.Tensor]:
    op = "per_token_cast_with_precomputed_sf"
    cfg = check_config(op, "precomputed", values)[0]
    hidden, group, col = cfg.hidden, cfg.group, cfg.layout.col_major
    out_cols, out_dtype = _out_shape(cfg)
    fn = launcher(_KERNEL["precomputed"], **_kernel_key(cfg, "precomputed")) if hidden else None
    scalars = (cfg.group_shift, int(col), _cdiv(hidden, _chunk(cfg.key_in)))

    groups, device = _cdiv(hidden, group), values["x"].device

    def run(x: torch.Tensor, fmt: Any, npc: Any, sf: torch.Tensor, *_: Any) -> torch.Tensor:
        tokens = x.shape[0]
        # per call: sf's sizes and strides are not keyed (contiguous, the right shape and 16-byte aligned
        # passes every check of scales_call_checks, and aligned_input passes it through)
        if not (sf.shape == ((groups, tokens) if col else (tokens, groups)) and sf.is_contiguous()
                and not ptr(sf) % 16):
            scales_call_checks(op, sf, tokens, hidden, group, col)
            sf = aligned_input(sf)
        out = torch.empty(tokens, out_cols, dtype=out_dtype, device=device)
        if tokens and hidden:
            fn(x if x.is_contiguous() and not ptr(x) % 16 else _kernel_input(x), sf, out, *scalars)
        return out

    return run


def _relations(mode: str) -> Callable[[str, dict], None]:
    def relations(op: str, values: dict) -> None:
        check_config(op, mode, values)

    return relations


def _params(*tensors: Any) -> tuple:
    """fmt, num_per_channels, the given tensors, x_block_size and the three flags (the parameters
    after x); the scalars keyed by OpSpec's inline typed key, the block size by ``block_key``."""
    return (deferred("fmt", "str"), deferred("num_per_channels", "int"), *tensors,
            deferred("x_block_size", "int[]?", "None", block_key),
            *(deferred(name, "bool", "False") for name in _FLAG_NAMES))


_X = Deferred("x", tuple(PLAIN), 2)
_CAST_SCHEMA = f"Tensor x, Tensor? x_sf, str fmt, int num_per_channels, int[]? x_block_size=None, {_FLAGS}"
CAST = OpSpec("per_token_cast", (_X, *_params()), "(Tensor, Tensor)", _plan_cast, relations=_cast_relations,
              schema_args=_CAST_SCHEMA)
# a quantized (data, sf) x: another key (pair_key), the same checks, plan and custom op
CAST_PAIR = OpSpec("per_token_cast", (deferred("x", "Tensor", key_of=pair_key), *_params()),
                   "(Tensor, Tensor)", _plan_cast, relations=_cast_relations, schema_args=_CAST_SCHEMA)
SF_ONLY = OpSpec("per_token_cast_with_sf_only", (_X, *_params()), "Tensor", _plan_sf_only,
                 relations=_relations("sf_only"))
PRECOMPUTED = OpSpec("per_token_cast_with_precomputed_sf",
                     (_X, *_params(Scales("sf", (torch.float32,), 2))),
                     "Tensor", _plan_precomputed, relations=_relations("precomputed"))
SPECS = (CAST, CAST_PAIR, SF_ONLY, PRECOMPUTED)


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
    ``per_token_cast_to_e5m6`` (``x_block_size`` must then be None)."""
    if isinstance(x, tuple):
        return CAST_PAIR.call(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                              use_packed_ue8m0)
    return CAST.call(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


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
    return SF_ONLY.call(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                        use_packed_ue8m0)


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
    return PRECOMPUTED.call(x, fmt, num_per_channels, sf, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                            use_packed_ue8m0)


def _cast_fake(x: Any, *rest: Any) -> Any:
    """per_token_cast without its memo (the fake implementation): the spec of x's form."""
    return (CAST_PAIR if isinstance(x, tuple) else CAST).fake(x, *rest)


# the tilebin::<op> declarations (ops/_torch.py), registered through ops/quant/_torch_ops.py
TORCH_OPS = (
    TorchOp("per_token_cast", CAST.schema(), per_token_cast, _cast_fake, pair_to_schema, pair_to_public),
    SF_ONLY.torch_op(per_token_cast_with_sf_only),
    PRECOMPUTED.torch_op(per_token_cast_with_precomputed_sf),
)


__all__ = ["per_token_cast", "per_token_cast_with_precomputed_sf", "per_token_cast_with_sf_only"]
