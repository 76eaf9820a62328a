"""CPU tests of the per-block cast ops' argument checks (no GPU): every bad argument raises an
ArgumentError naming the op, the value and what is supported, before any GPU work; valid CPU
tensors get as far as the device check (the last one)."""

from __future__ import annotations

import pytest
import torch

from tilebin.ops.quant import _per_block as pb
from tilebin.runtime import ArgumentError


def _x(tokens=4, hidden=256, dtype=torch.bfloat16):
    return torch.zeros((tokens, hidden), dtype=dtype)


def _fp4(tokens=4, hidden=256, col=False, packed=False):
    data = torch.zeros((tokens, hidden // 2), dtype=torch.int8)
    groups = hidden // 32
    if packed:
        sf = torch.zeros((-(-groups // 4), tokens), dtype=torch.int32).T
    elif col:
        sf = torch.ones((groups, tokens), dtype=torch.float32).T
    else:
        sf = torch.ones((tokens, groups), dtype=torch.float32)
    return data, sf


def _raises(match: str, fn, *args, **kwargs):
    with pytest.raises(ArgumentError, match=match) as info:
        fn(*args, **kwargs)
    return str(info.value)


ALL_CASTS = [pb.per_block_cast, pb.per_block_cast_with_sf_only]


@pytest.mark.parametrize("fn", ALL_CASTS)
def test_valid_cpu_arguments_reach_the_device_check(fn):
    msg = _raises("not a CUDA device", fn, _x(), "e4m3", (128, 128))
    assert msg.startswith(fn.__name__)


@pytest.mark.parametrize("layout", [dict(), dict(round_sf=True), dict(use_tma_aligned_col_major_sf=True),
                                    dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)])
@pytest.mark.parametrize("block", [(128, 128), (32, 32), [32, 32]])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_supported_combination_is_accepted(dtype, fmt, block, layout):
    _raises("not a CUDA device", pb.per_block_cast, _x(dtype=dtype, hidden=576), fmt, block, **layout)


@pytest.mark.parametrize("fn", ALL_CASTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn, torch.int8])
def test_wrong_dtype(fn, dtype):
    msg = _raises("dtype", fn, _x(dtype=dtype) if dtype != torch.float8_e4m3fn else _x().to(dtype), "e4m3", (128, 128))
    assert "bfloat16" in msg and "float32" in msg


def test_not_a_tensor():
    _raises("torch.Tensor", pb.per_block_cast, [[1.0]], "e4m3", (128, 128))


def test_wrong_rank():
    _raises("2-D", pb.per_block_cast, torch.zeros((2, 4, 64), dtype=torch.bfloat16), "e4m3", (128, 128))


@pytest.mark.parametrize("fmt", ["e5m6", "fp8", "E4M3", None])
def test_unsupported_fmt(fmt):
    msg = _raises("fmt", pb.per_block_cast, _x(), fmt, (128, 128))
    assert "'e4m3'" in msg and "'e2m1'" in msg


@pytest.mark.parametrize("block", [(64, 64), (128, 32), (1, 128), (128,), "128", None])
def test_unsupported_block(block):
    msg = _raises("block_size", pb.per_block_cast, _x(), "e4m3", block)
    assert "(128, 128)" in msg and "(32, 32)" in msg


@pytest.mark.parametrize("hidden", [32, 100, 160, 2000])
def test_hidden_not_aligned(hidden):
    msg = _raises("multiple of 64", pb.per_block_cast, _x(hidden=hidden), "e4m3", (32, 32))
    assert str(hidden) in msg


def test_not_contiguous():
    x = torch.zeros((256, 8), dtype=torch.bfloat16).T
    _raises("contiguous", pb.per_block_cast, x, "e4m3", (128, 128))


def test_misaligned_pointer():
    x = torch.zeros(4 * 256 + 1, dtype=torch.bfloat16)[1:].view(4, 256)
    _raises("aligned", pb.per_block_cast, x, "e4m3", (128, 128))


def test_packed_needs_col_major_and_round():
    _raises("use_tma_aligned_col_major_sf", pb.per_block_cast, _x(), "e4m3", (128, 128), round_sf=True,
            use_packed_ue8m0=True)
    _raises("round_sf", pb.per_block_cast, _x(), "e4m3", (128, 128), use_tma_aligned_col_major_sf=True,
            use_packed_ue8m0=True)


# ------------------------------------------------------------------------ precomputed sf
def test_precomputed_valid_reaches_device_check():
    _raises("not a CUDA device", pb.per_block_cast_with_precomputed_sf, _x(4, 576), "e2m1", (128, 128),
            torch.ones((1, 5)))


@pytest.mark.parametrize("flags", [dict(use_tma_aligned_col_major_sf=True),
                                   dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)])
def test_precomputed_rejects_layout_flags(flags):
    _raises("row-major fp32 only", pb.per_block_cast_with_precomputed_sf, _x(), "e4m3", (128, 128),
            torch.ones((1, 2)), **flags)


@pytest.mark.parametrize("sf", [torch.ones((1, 3)), torch.ones((2, 2)), torch.ones(2)])
def test_precomputed_wrong_shape(sf):
    _raises("sf", pb.per_block_cast_with_precomputed_sf, _x(), "e4m3", (128, 128), sf)


@pytest.mark.parametrize("sf", [torch.ones((1, 2), dtype=torch.bfloat16), torch.ones((1, 2), dtype=torch.int32), None])
def test_precomputed_wrong_dtype(sf):
    _raises(": sf ", pb.per_block_cast_with_precomputed_sf, _x(), "e4m3", (128, 128), sf)


def test_precomputed_sf_is_required():
    """sf=None is refused (before the OpSpec it ran per_block_cast, computing the scales, and returned its out)."""
    _raises("sf must be a torch.Tensor, got NoneType", pb.per_block_cast_with_precomputed_sf, _x(), "e4m3", (128, 128),
            None)


# ------------------------------------------------------------------------------ lossless
@pytest.mark.parametrize("out_block", [(1, 128), (32, 32), (128, 128)])
@pytest.mark.parametrize("in_layout", [dict(), dict(col=True), dict(col=True, packed=True)])
@pytest.mark.parametrize("out_layout", [dict(), dict(use_tma_aligned_col_major_sf=True),
                                        dict(use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True)])
def test_lossless_valid_reaches_device_check(out_block, in_layout, out_layout):
    _raises("not a CUDA device", pb.per_block_cast_lossless, _fp4(hidden=576, **in_layout), "e4m3", (1, 32), out_block,
            round_sf=True, **out_layout)


def test_lossless_fmt():
    msg = _raises("fmt", pb.per_block_cast_lossless, _fp4(), "e2m1", (1, 32), (1, 128))
    assert "'e4m3'" in msg


def test_lossless_not_a_pair():
    _raises("tuple", pb.per_block_cast_lossless, _x(), "e4m3", (1, 32), (1, 128))


def test_lossless_e4m3_data_rejected():
    data, sf = _fp4()
    fp8 = torch.zeros((4, 256), dtype=torch.float8_e4m3fn)
    _raises("e2m1", pb.per_block_cast_lossless, (fp8, torch.ones((4, 8))), "e4m3", (1, 32), (1, 128))


@pytest.mark.parametrize("x_block", [(1, 64), (32, 32), (1, 16)])
def test_lossless_input_block(x_block):
    msg = _raises("x_block_size", pb.per_block_cast_lossless, _fp4(), "e4m3", x_block, (1, 128))
    assert "(1, 32)" in msg


@pytest.mark.parametrize("out_block", [(1, 32), (1, 64), (64, 64), (128, 32)])
def test_lossless_output_block(out_block):
    msg = _raises("out_block_size", pb.per_block_cast_lossless, _fp4(), "e4m3", (1, 32), out_block)
    assert "(1, 128)" in msg and "(32, 32)" in msg and "(128, 128)" in msg


def test_lossless_hidden_not_aligned():
    data = torch.zeros((4, 48), dtype=torch.int8)  # hidden 96
    _raises("multiple of 64", pb.per_block_cast_lossless, (data, torch.ones((4, 3))), "e4m3", (1, 32), (1, 128))


def test_lossless_sf_wrong_shape():
    data, _ = _fp4()
    _raises("kernel-side shape", pb.per_block_cast_lossless, (data, torch.ones((4, 7))), "e4m3", (1, 32), (1, 128))
    _raises("kernel-side shape", pb.per_block_cast_lossless, (data, torch.ones((7, 4)).T), "e4m3", (1, 32), (1, 128))


def test_lossless_sf_wrong_dtype():
    data, _ = _fp4()
    _raises("sf", pb.per_block_cast_lossless, (data, torch.ones((4, 8), dtype=torch.float16)), "e4m3", (1, 32), (1, 128))


def test_lossless_packed_output_needs_col_major():
    _raises("use_tma_aligned_col_major_sf", pb.per_block_cast_lossless, _fp4(), "e4m3", (1, 32), (1, 128),
            round_sf=True, use_packed_ue8m0=True)


def test_lossless_data_not_contiguous():
    data = torch.zeros((256, 8), dtype=torch.int8).T  # 8 x 256 bytes, hidden 512
    _raises("contiguous", pb.per_block_cast_lossless, (data, torch.ones((8, 16))), "e4m3", (1, 32), (1, 128))
