"""Argument validation of the per-token casts (CPU, no GPU): every bad argument raises ArgumentError
naming the op, the value and what is supported, before any GPU work; well-formed CPU tensors get
through every check and stop at the device check (which comes last)."""

from __future__ import annotations

import pytest
import torch

from tilebin.ops.quant import _per_token as pt
from tilebin.runtime import ArgumentError

BF16, FP32, E4M3, I8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int8
CAST, SF_ONLY, PRE = "per_token_cast", "per_token_cast_with_sf_only", "per_token_cast_with_precomputed_sf"
NOT_CUDA = r"is on cpu, not a CUDA device"


def _x(tokens=4, hidden=576, dtype=BF16):
    return torch.zeros((tokens, hidden), dtype=dtype)


def _pair(tokens=4, hidden=576, block=(128, 128), dtype=E4M3):
    cols = hidden // 2 if dtype == I8 else hidden
    return torch.zeros((tokens, cols), dtype=dtype), torch.ones((-(-tokens // block[0]), -(-hidden // block[1])))


def _raises(match: str, fn, *args, **kwargs):
    with pytest.raises(ArgumentError, match=match):
        fn(*args, **kwargs)


# the torch.library schemas the ops registered before their OpSpec declarations (unchanged)
SCHEMAS = {
    "per_token_cast": "(Tensor x, Tensor? x_sf, str fmt, int num_per_channels, int[]? x_block_size=None, "
                      "bool use_tma_aligned_col_major_sf=False, bool round_sf=False, bool use_packed_ue8m0=False) "
                      "-> (Tensor, Tensor)",
    "per_token_cast_with_sf_only": "(Tensor x, str fmt, int num_per_channels, int[]? x_block_size=None, "
                                   "bool use_tma_aligned_col_major_sf=False, bool round_sf=False, "
                                   "bool use_packed_ue8m0=False) -> Tensor",
    "per_token_cast_with_precomputed_sf": "(Tensor x, str fmt, int num_per_channels, Tensor sf, "
                                          "int[]? x_block_size=None, bool use_tma_aligned_col_major_sf=False, "
                                          "bool round_sf=False, bool use_packed_ue8m0=False) -> Tensor",
    "per_token_cast_to_e5m6": "(Tensor x, int num_per_channels, bool use_tma_aligned_col_major_sf=False, "
                              "bool round_sf=False, bool use_packed_ue8m0=False) -> (Tensor, Tensor)",
}


def test_schemas_unchanged():
    from tilebin.ops.quant import _e5m6

    declared = {op.name: op for op in (*pt.TORCH_OPS, *_e5m6.TORCH_OPS)}
    assert {name: op.schema for name, op in declared.items()} == SCHEMAS
    for spec in (*pt.SPECS, *_e5m6.SPECS):
        assert spec.schema() == SCHEMAS[spec.name], spec.name
    assert declared["per_token_cast"].public is pt.per_token_cast
    assert declared["per_token_cast_to_e5m6"].public is _e5m6.per_token_cast_to_e5m6


def test_public_names():
    from tilebin.ops import quant

    for name in ("per_token_cast", "per_token_cast_with_sf_only", "per_token_cast_with_precomputed_sf"):
        if not hasattr(quant, name):
            pytest.skip(f"tilebin.ops.quant does not re-export {name} yet")
        assert getattr(quant, name) is getattr(pt, name), f"tilebin.ops.quant.{name} is not _per_token's"


# ---------------------------------------------------------------------------- plain x, all ops
def _call(op, x, fmt="e4m3", npc=128, **kw):
    if op == PRE:
        sf = kw.pop("sf", None)
        if sf is None:
            tokens, hidden = tuple(x.shape[-2:]) if isinstance(x, torch.Tensor) and x.dim() >= 2 else (4, 576)
            sf = torch.ones((tokens, -(-hidden // npc) if isinstance(npc, int) and npc > 0 else 1))
        return pt.per_token_cast_with_precomputed_sf(x, fmt, npc, sf, **kw)
    return getattr(pt, op)(x, fmt, npc, **kw)


ALL_OPS = [CAST, SF_ONLY, PRE]


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("bad, match", [
    ([[1.0]], r"x must be a torch.Tensor, got list"),
    (_x(dtype=torch.float16), r"x has dtype float16; supported: bfloat16, float32"),
    (torch.zeros(2, 4, 576, dtype=BF16), r"x must be 2-D, got shape \(2, 4, 576\)"),
    (_x(4, 100), r"x has hidden size 100; this op needs hidden % 16 == 0"),
    (_x(4, 584, FP32), r"x has hidden size 584; this op needs hidden % 16 == 0"),
])
def test_bad_x(op, bad, match):
    _raises(f"{op}: {match}", _call, op, bad)


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("fmt", ["e3m2", "E4M3", None, 1, "fp8"])
def test_bad_fmt(op, fmt):
    _raises(rf"{op}: fmt=.* is not supported; supported: 'e4m3', 'e2m1'", _call, op, _x(), fmt)


@pytest.mark.parametrize("op", [SF_ONLY, PRE])
def test_e5m6_only_in_per_token_cast(op):
    _raises(rf"{op}: fmt='e5m6' is not supported; supported: 'e4m3', 'e2m1'", _call, op, _x(), "e5m6")


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("npc", [0, 8, 48, 96, 256, 575, True, "128", 128.0, None, -128])
def test_bad_num_per_channels(op, npc):
    _raises(rf"{op}: num_per_channels={npc!r} is not supported; supported: 16, 32, 64, 128, or hidden \(576\)",
            _call, op, _x(), "e4m3", npc)


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("flag", ["use_tma_aligned_col_major_sf", "round_sf", "use_packed_ue8m0"])
def test_bad_flag_type(op, flag):
    _raises(rf"{op}: {flag} must be a bool, got str 'yes'", _call, op, _x(), **{flag: "yes"})


@pytest.mark.parametrize("op", [CAST, SF_ONLY])
def test_packed_needs_col_major_and_round(op):
    _raises(rf"{op}: use_packed_ue8m0=True needs use_tma_aligned_col_major_sf=True", _call, op, _x(),
            use_packed_ue8m0=True, round_sf=True)
    _raises(rf"{op}: use_packed_ue8m0=True needs round_sf=True", _call, op, _x(),
            use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True)


@pytest.mark.parametrize("op", ALL_OPS)
def test_block_size_with_plain_x(op):
    _raises(rf"{op}: x_block_size=\(128, 128\) is only for a quantized \(data, sf\) input", _call, op, _x(),
            x_block_size=(128, 128))


@pytest.mark.parametrize("op", [SF_ONLY, PRE])
def test_quantized_only_in_per_token_cast(op):
    _raises(rf"{op}: a quantized \(data, sf\) input is supported by per_token_cast only", _call, op, _pair(),
            x_block_size=(128, 128))


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("npc", [16, 32, 64, 128, 576])
def test_valid_reaches_device_check(op, dtype, fmt, npc):
    _raises(rf"{op}: x is on cpu, not a CUDA device", _call, op, _x(dtype=dtype), fmt, npc)


@pytest.mark.parametrize("flags", [dict(use_tma_aligned_col_major_sf=True),
                                   dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True),
                                   dict(round_sf=True)])
def test_valid_layouts_reach_device_check(flags):
    _raises(NOT_CUDA, pt.per_token_cast, _x(), "e2m1", 64, **flags)
    _raises(NOT_CUDA, pt.per_token_cast_with_sf_only, _x(), "e4m3", 32, **flags)


def test_strided_and_misaligned_plain_x_are_accepted():
    wide = torch.zeros((4, 1000), dtype=BF16)[:, :576]  # row stride 1000: not 16-byte aligned, copied
    _raises(NOT_CUDA, pt.per_token_cast, wide, "e4m3", 128)
    odd = torch.zeros(4 * 576 + 1, dtype=BF16)[1:].view(4, 576)
    _raises(NOT_CUDA, pt.per_token_cast, odd, "e4m3", 128)
    _raises(NOT_CUDA, pt.per_token_cast, torch.zeros((576, 4), dtype=FP32).T, "e2m1", 32)


# ---------------------------------------------------------------------------- e5m6 dispatch
@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.parametrize("flags", [(False, False, False), (True, True, True), (1, 0, 0)])
def test_e5m6_dispatch(monkeypatch, dtype, flags):
    """per_token_cast(fmt='e5m6') runs per_token_cast_to_e5m6: the same launch and outputs."""
    from ops_stub import StubbedOps, describe, describe_launches
    from tilebin.ops.quant import _e5m6

    stub = StubbedOps(monkeypatch)
    x = _x(hidden=512, dtype=dtype)
    via_cast = pt.per_token_cast(x, "e5m6", 512, None, *flags)
    launched = describe_launches(stub.launches)
    stub.launches.clear()
    direct = _e5m6.per_token_cast_to_e5m6(x, 512, *flags)
    assert describe_launches(stub.launches) == launched and len(launched) == 1
    assert describe(via_cast) == describe(direct)


def test_e5m6_errors_are_worded_as_before():
    """fmt='e5m6' keeps per_token_cast_to_e5m6's wording, the device check included."""
    _raises(r"per_token_cast\(fmt='e5m6'\): x has dtype float16", pt.per_token_cast, _x(dtype=torch.float16), "e5m6",
            576)
    _raises(r"per_token_cast\(fmt='e5m6'\): round_sf must be a bool, got str 'yes'", pt.per_token_cast, _x(), "e5m6",
            576, None, False, "yes")
    _raises(r"per_token_cast\(fmt='e5m6'\): x must be a torch.Tensor, got tuple", pt.per_token_cast, _pair(), "e5m6",
            576)
    _raises(r"per_token_cast\(fmt='e5m6'\): x is on cpu, not a CUDA device", pt.per_token_cast, _x(), "e5m6", 576)


def test_e5m6_rejects_block_size():
    _raises(r"per_token_cast: x_block_size=\(128, 128\) is not supported with fmt='e5m6'", pt.per_token_cast,
            _x(hidden=512), "e5m6", 512, (128, 128))


# ---------------------------------------------------------------------------- quantized input
@pytest.mark.parametrize("bad, block, match", [
    (_pair(dtype=torch.uint8), (128, 128), r"x\[0\] \(data\) has dtype uint8; supported: float8_e4m3fn, int8"),
    ((_x(), torch.ones(1, 5)), (128, 128), r"quantized data has dtype torch.bfloat16"),
    ((_x(dtype=E4M3), torch.ones(1, 5, dtype=torch.int32)), (128, 128), r"row-major input sf must be float32"),
    ((_x(dtype=E4M3), torch.ones(1, 5, dtype=torch.float64).T), (128, 128), r"column-major input sf has dtype"),
    ((_x(dtype=E4M3), torch.ones(5)), (128, 128), r"the input's sf must be a 2-D tensor"),
    ((_x(dtype=E4M3), torch.ones(1, 4)), (128, 128), r"x\[1\] \(sf\) has shape \(1, 4\).* it must be \(1, 5\)"),
    ((_x(dtype=E4M3), torch.ones(1, 5)), None, r"x_block_size=None is not supported for a quantized input"),
    ((_x(dtype=E4M3), torch.ones(1, 5)), (128, 8), r"x_block_size=\(128, 8\) is not supported"),
    ((_x(dtype=E4M3), torch.ones(1, 5)), (96, 128), r"x_block_size=\(96, 128\) is not supported"),
    ((_x(dtype=E4M3), torch.ones(1, 5)), (128, 128, 1), r"x_block_size=\(128, 128, 1\) is not supported"),
    ((_x(4, 100, E4M3), torch.ones(1, 1)), (128, 128), r"x\[0\] \(data\) has hidden size 100"),
    ((_x(4, 50, I8), torch.ones(1, 1)), (128, 128), r"x\[0\] \(data\) has hidden size 100"),
    ((torch.zeros(576, 4, dtype=torch.uint8).view(E4M3).T, torch.ones(1, 5)), (128, 128),
     r"x\[0\] \(data\) must have unit column stride"),
])
def test_bad_quantized(bad, block, match):
    _raises(rf"per_token_cast: {match}", pt.per_token_cast, bad, "e4m3", 128, block)


def test_bad_quantized_tuple():
    _raises(r"per_token_cast: a quantized input must be a \(data, sf\) tuple", pt.per_token_cast,
            (_x(dtype=E4M3), torch.ones(1, 5), None), "e4m3", 128, (128, 128))


@pytest.mark.parametrize("dtype", [E4M3, I8])
@pytest.mark.parametrize("block", [(128, 128), (32, 32), (1, 32), (1, 128), (1, 16)])
@pytest.mark.parametrize("sf_kind", ["row", "col", "ue8m0"])
def test_valid_quantized_reaches_device_check(dtype, block, sf_kind):
    data, sf = _pair(block=block, dtype=dtype)
    if sf_kind == "col":
        sf = sf.T.contiguous().T
    elif sf_kind == "ue8m0":
        sf = torch.zeros((-(-sf.size(1) // 4), sf.size(0)), dtype=torch.int32).T
    _raises(r"per_token_cast: x is on cpu", pt.per_token_cast, (data, sf), "e2m1", 32, block)


# ---------------------------------------------------------------------------- precomputed sf
@pytest.mark.parametrize("sf, kw, match", [
    ("nope", {}, r"sf must be a torch.Tensor, got str"),
    (torch.ones(4, 5, dtype=torch.int32), {}, r"sf has dtype int32; supported: float32"),
    (torch.ones(4, 4), {}, r"sf has shape \(4, 4\); it must be \[tokens, groups\] = \(4, 5\)"),
    (torch.ones(4, 5), dict(use_tma_aligned_col_major_sf=True),
     r"sf has shape \(4, 5\); it must be \[groups, tokens\].* = \(5, 4\)"),
    (torch.ones(5, 4).T, {}, r"sf must have unit stride along its last dim"),
    (torch.ones(4, 5), dict(use_packed_ue8m0=True), r"use_packed_ue8m0=True is not supported with precomputed"),
])
def test_bad_precomputed_sf(sf, kw, match):
    _raises(rf"{PRE}: {match}", pt.per_token_cast_with_precomputed_sf, _x(), "e4m3", 128, sf, **kw)


@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("npc, groups", [(128, 5), (16, 36), (576, 1)])
def test_valid_precomputed_reaches_device_check(col, npc, groups):
    sf = torch.ones((groups, 4) if col else (4, groups))
    _raises(rf"{PRE}: x is on cpu", pt.per_token_cast_with_precomputed_sf, _x(), "e2m1", npc, sf,
            use_tma_aligned_col_major_sf=col, round_sf=True)
