"""Argument validation of the SwiGLU quantization ops (CPU, no GPU): every bad argument raises
ArgumentError naming the op, the value and what is supported, before any GPU work; well-formed CPU
tensors get through every check and stop at the device check (which comes last)."""

from __future__ import annotations

import pytest
import torch

from tilebin.ops.quant import _swiglu as sw
from tilebin.runtime import ArgumentError

BF16, FP32, E4M3, I32, I64 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int32, torch.int64
DEVICE = r"x is on cpu, not a CUDA device; move it with x.cuda\(\)"


def _raises(match: str, fn, *args, **kwargs):
    with pytest.raises(ArgumentError, match=match):
        fn(*args, **kwargs)


def _misaligned(shape, dtype):
    n = 1
    for s in shape:
        n *= s
    return torch.zeros(n + 1, dtype=dtype)[1:].view(shape)


def test_public_names():
    from tilebin.ops import quant

    for name in sw.__all__:
        assert getattr(quant, name) is getattr(sw, name), f"tilebin.ops.quant.{name} is not re-exported"


# ------------------------------------------------------------------ swiglu_forward_and_per_token_cast
FWD = "swiglu_forward_and_per_token_cast: "


def _fwd(x=None, fmt="e4m3", npc=128, **kw):
    x = torch.zeros((4, 2 * 256), dtype=BF16) if x is None else x
    return sw.swiglu_forward_and_per_token_cast(x, fmt, npc, **kw)


@pytest.mark.parametrize("bad, match", [
    ([[1.0]], r"x must be a torch.Tensor, got list"),
    (torch.zeros(4, 512, dtype=torch.float16), r"x has dtype float16; supported: bfloat16, float32"),
    (torch.zeros(4, 512, dtype=E4M3), r"x has dtype float8_e4m3fn; supported: bfloat16, float32"),
    (torch.zeros(2, 4, 512, dtype=BF16), r"x must be 2-D, got shape \(2, 4, 512\)"),
    (torch.zeros(512, 4, dtype=BF16).T, r"x must be contiguous .*x.contiguous\(\)"),
    (torch.zeros(4, 2 * 96, dtype=BF16), r"x has 192 columns; it needs 2 \* hidden with hidden % 64 == 0"),
    (torch.zeros(4, 130, dtype=BF16), r"x has 130 columns"),
    (_misaligned((4, 512), BF16), r"x's data pointer 0x[0-9a-f]+ is not 16-byte aligned"),
])
def test_fwd_bad_x(bad, match):
    _raises(FWD + match, _fwd, bad)


@pytest.mark.parametrize("fmt", ["e2m1", "e5m6", "E4M3", None, 1])
def test_fwd_bad_fmt(fmt):
    _raises(FWD + r"fmt=.* is not supported; supported: 'e4m3'", _fwd, fmt=fmt)


@pytest.mark.parametrize("npc", [0, 32, 64, 512, True, "128", 128.0, None])
def test_fwd_bad_num_per_channels(npc):
    _raises(FWD + r"num_per_channels=.* is not supported; supported: 128, or hidden \(= x.shape\[1\] // 2 = 256\)",
            _fwd, npc=npc)


@pytest.mark.parametrize("kw, match", [
    (dict(use_tma_aligned_col_major_sf="yes"), r"use_tma_aligned_col_major_sf must be a bool, got str"),
    (dict(round_sf=None), r"round_sf must be a bool, got NoneType"),
    (dict(use_packed_ue8m0=1.0), r"use_packed_ue8m0 must be a bool, got float"),
    (dict(use_packed_ue8m0=True, round_sf=True), r"use_packed_ue8m0=True needs use_tma_aligned_col_major_sf=True"),
    (dict(use_packed_ue8m0=True, use_tma_aligned_col_major_sf=True), r"use_packed_ue8m0=True needs round_sf=True"),
    (dict(npc=256, use_tma_aligned_col_major_sf=True), r"use_tma_aligned_col_major_sf=True needs num_per_channels=128"),
    (dict(swiglu_clamp_value="10"), r"swiglu_clamp_value must be a float or None, got str"),
    (dict(swiglu_clamp_value=float("nan")), r"swiglu_clamp_value must be a float or None, got float nan"),
    (dict(sf_clamp_min=True), r"sf_clamp_min must be a float or None, got bool"),
    (dict(clamped_count=torch.zeros(3, dtype=I64)), r"clamped_count needs swiglu_clamp_value"),
    (dict(clamped_count=torch.zeros(3, dtype=I32), swiglu_clamp_value=1.0),
     r"clamped_count has dtype int32; supported: int64"),
    (dict(clamped_count=torch.zeros(4, dtype=I64), swiglu_clamp_value=1.0), r"clamped_count has 4 entries; it needs 3"),
    (dict(clamped_count=torch.zeros(1, 3, dtype=I64), swiglu_clamp_value=1.0), r"clamped_count must be 1-D"),
    (dict(clamped_count=torch.zeros(6, dtype=I64)[::2], swiglu_clamp_value=1.0), r"clamped_count must be contiguous"),
])
def test_fwd_bad_options(kw, match):
    _raises(FWD + match, _fwd, **kw)


def _ptt(n=4, dtype=I32):
    return torch.zeros(n, dtype=dtype)


@pytest.mark.parametrize("kw, match", [
    (dict(pos_to_token_topk=_ptt(dtype=torch.int64), topk_weights=torch.zeros(2, 2)),
     r"pos_to_token_topk has dtype int64; supported: int32"),
    (dict(pos_to_token_topk=_ptt(5), topk_weights=torch.zeros(2, 2)),
     r"pos_to_token_topk has 5 entries; it needs one per row of x \(4\)"),
    (dict(pos_to_token_topk=torch.zeros(4, 1, dtype=I32), topk_weights=torch.zeros(2, 2)),
     r"pos_to_token_topk must be 1-D"),
    (dict(pos_to_token_topk=_ptt()), r"pos_to_token_topk needs topk_weights"),
    (dict(pos_to_token_topk=_ptt(), topk_weights=torch.zeros(2, 2, dtype=BF16)),
     r"topk_weights has dtype bfloat16; supported: float32"),
    (dict(pos_to_token_topk=_ptt(), topk_weights=torch.zeros(4)), r"topk_weights must be 2-D"),
    (dict(pos_to_token_topk=_ptt(), topk_weights=torch.zeros(2, 4).T), r"topk_weights must be contiguous"),
    (dict(pos_to_expert=_ptt(3)), r"pos_to_expert has 3 entries; it needs one per row of x \(4\)"),
    (dict(pos_to_expert=torch.zeros(4)), r"pos_to_expert has dtype float32; supported: int32"),
    (dict(pos_to_expert=torch.zeros(8, dtype=I32)[::2]), r"pos_to_expert must be contiguous"),
])
def test_fwd_bad_routing(kw, match):
    _raises(FWD + match, _fwd, **kw)


def test_fwd_weights_without_positions_are_ignored():
    # as in tile_kernels: topk_weights is only read through pos_to_token_topk
    _raises(FWD + DEVICE, _fwd, topk_weights="not even a tensor")


@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.parametrize("rows, hidden, npc, kw", [
    (4, 256, 128, {}),
    (0, 7168, 128, dict(use_tma_aligned_col_major_sf=True)),
    (4001, 576, 128, dict(use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True, round_sf=True)),
    (1, 2048, 2048, dict(round_sf=True, swiglu_clamp_value=10.0, sf_clamp_min=1e-6)),
    (3, 64, 64, dict(swiglu_clamp_value=0.5, clamped_count=torch.zeros(3, dtype=I64),
                     pos_to_token_topk=_ptt(3), topk_weights=torch.zeros(2, 2), pos_to_expert=_ptt(3))),
])
def test_fwd_valid_cpu_reaches_device_check(dtype, rows, hidden, npc, kw):
    x = torch.zeros((rows, 2 * hidden), dtype=dtype)
    _raises(FWD + DEVICE, _fwd, x, npc=npc, **kw)


def test_fwd_device_check_covers_optional_tensors():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to put x on")
    x = torch.zeros((4, 512), dtype=BF16, device="cuda")
    _raises(FWD + r"pos_to_expert is on cpu", _fwd, x, pos_to_expert=_ptt())


# ----------------------------------------------------------------- swiglu_backward_and_per_token_cast
BWD = "swiglu_backward_and_per_token_cast: "


def _bwd(x=None, grad_out=None, weight=None, ptt=None, ttp=None, npc=128, **kw):
    rows, hidden = 4, 256
    groups = 2 * hidden // (npc if npc in (32, 128) else 128)
    x = (torch.zeros(rows, 2 * hidden, dtype=E4M3), torch.ones(rows, groups)) if x is None else x
    grad_out = torch.zeros(rows, hidden, dtype=BF16) if grad_out is None else grad_out
    weight = torch.zeros(2, 3) if weight is None else weight
    ptt = torch.zeros(rows, dtype=I32) if ptt is None else ptt
    ttp = torch.zeros(2, 3, dtype=I32) if ttp is None else ttp
    return sw.swiglu_backward_and_per_token_cast(x, grad_out, weight, ptt, ttp, npc, **kw)


@pytest.mark.parametrize("npc", [0, 64, 256, True, "128", None])
def test_bwd_bad_num_per_channels(npc):
    _raises(BWD + r"num_per_channels=.* is not supported; supported: 32, 128", _bwd, npc=npc)


@pytest.mark.parametrize("x, match", [
    (torch.zeros(4, 512, dtype=E4M3), r"x must be a \(data, sf\) pair"),
    ((torch.zeros(4, 512, dtype=BF16), torch.ones(4, 4)),
     r"x\[0\] \(data\) has dtype bfloat16; supported: float8_e4m3fn"),
    ((torch.zeros(512, dtype=E4M3), torch.ones(4, 4)), r"x\[0\] \(data\) must be 2-D or 3-D"),
    ((torch.zeros(512, 4, dtype=E4M3).T, torch.ones(4, 4)), r"x\[0\] \(data\) must be contiguous"),
    ((torch.zeros(4, 192, dtype=E4M3), torch.ones(4, 4)), r"x\[0\] \(data\) has 192 channels; it needs 2 \* hidden"),
    ((torch.zeros(4, 0, dtype=E4M3), torch.ones(4, 0)), r"x\[0\] \(data\) has 0 channels"),
    ((torch.zeros(4, 512, dtype=E4M3), torch.ones(4, 4, dtype=BF16)), r"x\[1\] \(sf\) has dtype bfloat16"),
    ((torch.zeros(4, 512, dtype=E4M3), torch.ones(4, 8)),
     r"x\[1\] \(sf\) has shape \(4, 8\); it must be \(4, 4\)"),
    ((torch.zeros(4, 512, dtype=E4M3), torch.ones(4, 4).T.contiguous().T), r"x\[1\] \(sf\) must be row-major"),
    ((torch.zeros(4, 512, dtype=E4M3), torch.ones(4, 4, dtype=torch.int32)), r"x\[1\] \(sf\) has dtype int32"),
])
def test_bwd_bad_x(x, match):
    _raises(BWD + match, _bwd, x)


@pytest.mark.parametrize("kw, match", [
    (dict(grad_out=torch.zeros(4, 256)), r"grad_out has dtype float32; supported: bfloat16"),
    (dict(grad_out=torch.zeros(4, 255, dtype=BF16)), r"grad_out has shape \(4, 255\); it must hold \[4, 256\]"),
    (dict(grad_out=torch.zeros(256, 4, dtype=BF16).T), r"grad_out must be contiguous"),
    (dict(weight=torch.zeros(2, 3, dtype=BF16)), r"weight has dtype bfloat16; supported: float32"),
    (dict(weight=torch.zeros(3, 2)), r"weight has shape \(3, 2\); it must match token_topk_to_pos \(2, 3\)"),
    (dict(weight=torch.zeros(3, 2).T), r"weight must be contiguous"),
    (dict(ttp=torch.zeros(6, dtype=I32), weight=torch.zeros(6)), r"token_topk_to_pos must be 2-D"),
    (dict(ttp=torch.zeros(2, 3, dtype=I64)), r"token_topk_to_pos has dtype int64; supported: int32"),
    (dict(ptt=torch.zeros(5, dtype=I32)), r"pos_to_token_topk has 5 entries; it needs one per row of x \(4\)"),
    (dict(ptt=torch.zeros(4, dtype=I64)), r"pos_to_token_topk has dtype int64"),
    (dict(round_sf="no"), r"round_sf must be a bool, got str"),
    (dict(swiglu_clamp_value=[1.0]), r"swiglu_clamp_value must be a float or None, got list"),
])
def test_bwd_bad_args(kw, match):
    _raises(BWD + match, _bwd, **kw)


@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("shape", [(4, 2 * 256), (2, 3, 2 * 2048), (0, 2 * 7168)])
def test_bwd_valid_cpu_reaches_device_check(npc, shape):
    data = torch.zeros(shape, dtype=E4M3)
    rows = data.numel() // shape[-1]
    x = (data, torch.ones(rows, shape[-1] // npc))
    _raises(BWD + DEVICE, _bwd, x, torch.zeros(rows, shape[-1] // 2, dtype=BF16), ptt=torch.zeros(rows, dtype=I32),
            npc=npc, round_sf=True, swiglu_clamp_value=7.0)


# -------------------------------------------------------- swiglu_forward_and_per_channel_cast_and_transpose
CH = "swiglu_forward_and_per_channel_cast_and_transpose: "


def _ch(x=None, fmt="e4m3", npt=128, **kw):
    x = torch.zeros((128, 2 * 576), dtype=BF16) if x is None else x
    return sw.swiglu_forward_and_per_channel_cast_and_transpose(x, fmt, npt, **kw)


@pytest.mark.parametrize("bad, match", [
    ("x", r"x must be a torch.Tensor, got str"),
    (torch.zeros(128, 256), r"x has dtype float32; supported: bfloat16"),
    (torch.zeros(2, 128, 256, dtype=BF16), r"x must be 2-D"),
    (torch.zeros(256, 128, dtype=BF16).T, r"x must be contiguous"),
    (torch.zeros(100, 256, dtype=BF16), r"x has shape \(100, 256\); both the token count and the width"),
    (torch.zeros(128, 192, dtype=BF16), r"x has shape \(128, 192\)"),
    (_misaligned((128, 256), BF16), r"x's data pointer 0x[0-9a-f]+ is not 16-byte aligned"),
])
def test_ch_bad_x(bad, match):
    _raises(CH + match, _ch, bad)


@pytest.mark.parametrize("fmt", ["e2m1", None, "fp8"])
def test_ch_bad_fmt(fmt):
    _raises(CH + r"fmt=.* is not supported; supported: 'e4m3'", _ch, fmt=fmt)


@pytest.mark.parametrize("npt", [0, 16, 64, 256, True, "32", None])
def test_ch_bad_num_per_tokens(npt):
    _raises(CH + r"num_per_tokens=.* is not supported; supported: 32, 128", _ch, npt=npt)


@pytest.mark.parametrize("kw, match", [
    (dict(round_sf="x"), r"round_sf must be a bool"),
    (dict(without_transpose=None), r"without_transpose must be a bool"),
    (dict(swiglu_clamp_value=float("nan")), r"swiglu_clamp_value must be a float or None"),
])
def test_ch_bad_options(kw, match):
    _raises(CH + match, _ch, **kw)


@pytest.mark.parametrize("npt", [32, 128])
@pytest.mark.parametrize("shape", [(128, 2 * 576), (0, 2 * 7168), (4096, 2 * 2048)])
def test_ch_valid_cpu_reaches_device_check(npt, shape):
    _raises(CH + DEVICE, _ch, torch.zeros(shape, dtype=BF16), npt=npt, round_sf=True, without_transpose=True,
            swiglu_clamp_value=0.5)
