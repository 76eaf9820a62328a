"""Argument validation of the per-channel casts (CPU, no GPU): every bad argument raises
ArgumentError naming the op, the value and what is supported, before any GPU work; well-formed CPU
tensors get through every check and stop at the device check (which comes last)."""

from __future__ import annotations

import pytest
import torch

from tilebin.ops.quant import _per_channel as pc
from tilebin.runtime import ArgumentError

BF16, FP32, E4M3 = torch.bfloat16, torch.float32, torch.float8_e4m3fn


def _x(tokens=4, hidden=576, dtype=BF16):
    return torch.zeros((tokens, hidden), dtype=dtype)


def _pair(tokens=4, hidden=576):
    return _x(tokens, hidden, E4M3), torch.ones((tokens, -(-hidden // 128)), dtype=FP32)


def _misaligned(tokens=4, hidden=576, dtype=BF16):
    return torch.zeros(tokens * hidden + 1, dtype=dtype)[1:].view(tokens, hidden)


def _raises(match: str, fn, *args, **kwargs):
    with pytest.raises(ArgumentError, match=match):
        fn(*args, **kwargs)


def test_public_names():
    from tilebin.ops import quant

    for name in ("per_channel_cast", "per_channel_cast_fused", "per_channel_cast_and_transpose"):
        assert getattr(quant, name) is getattr(pc, name), f"tilebin.ops.quant.{name} is not re-exported"


# ------------------------------------------------------------------------------ per_channel_cast
@pytest.mark.parametrize("bad, match", [
    ([[1.0]], r"per_channel_cast: x must be a torch.Tensor, got list"),
    (_x(dtype=torch.float16), r"per_channel_cast: x has dtype float16; supported: bfloat16, float32"),
    (_x(dtype=E4M3), r"x has dtype float8_e4m3fn; supported: bfloat16, float32"),
    (torch.zeros(2, 4, 576, dtype=BF16), r"x must be 2-D, got shape \(2, 4, 576\)"),
    (_x(576, 64).T, r"x must be contiguous .*x.contiguous\(\)"),
    (_x(4, 100), r"x has hidden size 100; this op needs a multiple of 16"),
    (_misaligned(), r"not 16-byte aligned"),
    (_pair(), r"per_channel_cast: x must be a plain bf16/fp32 tensor.*per_channel_cast_fused"),
])
def test_cast_bad_x(bad, match):
    _raises(match, pc.per_channel_cast, bad, "e4m3", 128)


@pytest.mark.parametrize("fmt", ["e2m1", "e5m6", "E4M3", None, 1])
def test_cast_bad_fmt(fmt):
    _raises(r"per_channel_cast: fmt=.* is not supported; supported: 'e4m3'", pc.per_channel_cast, _x(), fmt, 128)


@pytest.mark.parametrize("npt", [32, 64, 1, 0, True, "128", 128.0, None])
def test_cast_bad_num_per_tokens(npt):
    _raises(r"per_channel_cast: num_per_tokens=.* is not supported; supported: 128$", pc.per_channel_cast,
            _x(), "e4m3", npt)


def test_cast_bad_round_sf():
    _raises(r"per_channel_cast: round_sf must be a bool, got str", pc.per_channel_cast, _x(), "e4m3", 128, "yes")


@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.parametrize("shape", [(4, 576), (0, 7168), (4001, 16), (1, 0)])
def test_cast_valid_cpu_reaches_device_check(dtype, shape):
    _raises(r"per_channel_cast: x is on cpu, not a CUDA device; move it with x.cuda\(\)",
            pc.per_channel_cast, _x(*shape, dtype=dtype), "e4m3", 128, True)


# ------------------------------------------------------------------------ per_channel_cast_fused
OP = "per_channel_cast_fused: "


@pytest.mark.parametrize("x, npc, match", [
    (_x(), 128, r"num_per_channels=128 is only for a quantized \(data, sf\) input; pass num_per_channels=None"),
    ((_x(dtype=E4M3),), 128, r"a quantized input must be a \(data, sf\) pair, got a tuple of 1"),
    (_pair(), None, r"a quantized \(data, sf\) input needs num_per_channels=128"),
    (_pair(), 64, r"num_per_channels=64 is not supported; supported: 128"),
    (_pair(), 32, r"num_per_channels=32 is not supported"),
    ((_x(), _pair()[1]), 128, r"x\[0\] \(data\) has dtype bfloat16; supported: float8_e4m3fn"),
    ((_x(4, 100, E4M3), torch.ones(4, 1)), 128, r"x\[0\] \(data\) has hidden size 100; .*multiple of 16"),
    ((_pair()[0], "sf"), 128, r"x\[1\] \(sf\) must be a torch.Tensor, got str"),
    ((_pair()[0], torch.ones(4, 5, dtype=torch.int32)), 128, r"x\[1\] \(sf\) has dtype int32; supported: float32"),
    ((_pair()[0], torch.ones(4, 4)), 128, r"x\[1\] \(sf\) has shape \(4, 4\); .* must be \(4, 5\)"),
    ((_pair()[0], torch.ones(3, 5)), 128, r"x\[1\] \(sf\) has shape \(3, 5\)"),
    ((_pair()[0], torch.ones(20)), 128, r"x\[1\] \(sf\) must be 2-D"),
    ((_pair()[0], torch.ones(5, 4).T), 128, r"x\[1\] \(sf\) must be row-major contiguous .*column-major"),
    ((_misaligned(dtype=E4M3), torch.ones(4, 5)), 128, r"x\[0\] \(data\)'s data pointer .* not 16-byte aligned"),
    (_x(dtype=torch.int8), None, r"x has dtype int8; supported: bfloat16, float32"),
])
def test_fused_bad_input(x, npc, match):
    _raises(OP + ".*" + match, pc.per_channel_cast_fused, x, "e4m3", 128, False, npc)


@pytest.mark.parametrize("pos, match", [
    (torch.zeros(8, dtype=torch.int64), r"pos_to_token has dtype int64; supported: int32"),
    (torch.zeros(2, 4, dtype=torch.int32), r"pos_to_token must be 1-D, got shape \(2, 4\)"),
    (torch.zeros(16, dtype=torch.int32)[::2], r"pos_to_token must be contiguous .*pos_to_token.contiguous\(\)"),
    ([0, 1, 2], r"pos_to_token must be a torch.Tensor, got list"),
])
def test_fused_bad_pos_to_token(pos, match):
    _raises(OP + match, pc.per_channel_cast_fused, _x(), "e4m3", 128, False, None, pos)


def test_fused_bad_fmt_tokens_flag():
    _raises(OP + r"fmt='e2m1' is not supported; supported: 'e4m3'", pc.per_channel_cast_fused, _x(), "e2m1", 128)
    _raises(OP + r"num_per_tokens=32 is not supported; supported: 128", pc.per_channel_cast_fused, _x(), "e4m3", 32)
    _raises(OP + r"round_sf must be a bool, got NoneType", pc.per_channel_cast_fused, _x(), "e4m3", 128, None)


@pytest.mark.parametrize("x, npc", [
    (_x(), None), (_x(dtype=FP32), None), (_pair(), 128), (_pair(0, 2048), 128), (_pair(3, 16), 128),
])
@pytest.mark.parametrize("pos", [None, torch.tensor([0, -1, 3], dtype=torch.int32), torch.empty(0, dtype=torch.int32)])
def test_fused_valid_cpu_reaches_device_check(x, npc, pos):
    _raises(OP + r"x is on cpu, not a CUDA device", pc.per_channel_cast_fused, x, "e4m3", 128,
            num_per_channels=npc, pos_to_token=pos)


# ---------------------------------------------------------------- per_channel_cast_and_transpose
TOP = "per_channel_cast_and_transpose: "


@pytest.mark.parametrize("bad, match", [
    (_x(dtype=FP32), r"x has dtype float32; supported: bfloat16"),
    (_x(dtype=E4M3), r"x has dtype float8_e4m3fn; supported: bfloat16"),
    (_pair(), r"x must be a torch.Tensor, got tuple"),
    (_x(4, 592), r"x has hidden size 592; this op needs a multiple of 64"),
    (_x(4, 16), r"x has hidden size 16; this op needs a multiple of 64"),
    (_x(64, 4).T.contiguous().T, r"x must be contiguous"),
    (torch.zeros(576, dtype=BF16), r"x must be 2-D"),
    (_misaligned(4, 576), r"not 16-byte aligned"),
])
def test_transpose_bad_x(bad, match):
    _raises(TOP + ".*" + match, pc.per_channel_cast_and_transpose, bad, "e4m3", 128)


@pytest.mark.parametrize("npt", [64, 1, 256, False, "32"])
def test_transpose_bad_num_per_tokens(npt):
    _raises(TOP + r"num_per_tokens=.* is not supported; supported: 32, 128", pc.per_channel_cast_and_transpose,
            _x(), "e4m3", npt)


def test_transpose_bad_fmt_and_flag():
    _raises(TOP + r"fmt='e2m1' is not supported; supported: 'e4m3'", pc.per_channel_cast_and_transpose,
            _x(), "e2m1", 128)
    _raises(TOP + r"round_sf must be a bool, got float", pc.per_channel_cast_and_transpose, _x(), "e4m3", 32, 1.0)


@pytest.mark.parametrize("npt", [32, 128])
@pytest.mark.parametrize("shape", [(4, 576), (0, 2048), (4001, 64)])
def test_transpose_valid_cpu_reaches_device_check(npt, shape):
    _raises(TOP + r"x is on cpu, not a CUDA device", pc.per_channel_cast_and_transpose, _x(*shape), "e4m3", npt, True)
