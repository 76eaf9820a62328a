"""CPU tests (no GPU) of the cast-back and E5M6 ops' argument checks: every bad argument raises an
ArgumentError naming the op, the value and what is supported, before any GPU work; valid CPU
tensors get as far as the device check (the last one).  unpack_from_e2m1fn_x2 runs on CPU and is
compared with the reference here."""

from __future__ import annotations

import pytest
import torch

import quant_ref
from tilebin.ops.quant import _cast_back as cb
from tilebin.ops.quant import _e5m6 as e5
from tilebin.runtime import ArgumentError

E4M3 = torch.float8_e4m3fn
# name -> (use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
LAYOUTS = {"row": (False, False, False), "col": (True, False, False), "ue8m0": (True, True, True)}


def _raises(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(ArgumentError, match=match) as info:
        fn(*args, **kwargs)
    return str(info.value)


def _pair(fmt="e4m3", tokens=6, hidden=256, block=(1, 128), layout="row"):
    """A (data, sf) pair on CPU with the layout the casts return (through the reference cast)."""
    x = torch.randn((tokens, hidden))
    col, rnd, packed = LAYOUTS[layout]
    return quant_ref.cast(x, fmt, block, round_sf=rnd, use_tma_aligned_col_major_sf=col, use_packed_ue8m0=packed)


def _e5m6_pair(tokens=6, hidden=256, layout="row"):
    col, rnd, packed = LAYOUTS[layout]
    x = torch.randn((tokens, hidden))
    return quant_ref.cast_to_e5m6(x, hidden, use_tma_aligned_col_major_sf=col, round_sf=rnd, use_packed_ue8m0=packed)


# ------------------------------------------------------------------------------ valid arguments
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("block", [(1, 128), (1, 256), (1, 32), (1, 16), (128, 128), (32, 32), (128, 1), (1000, 64)])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("out", ["bf16", "fp32"])
def test_valid_cast_back_reaches_the_device_check(out, fmt, block, layout):
    msg = _raises("not a CUDA device", cb.cast_back, _pair(fmt, 6, 256, block, layout), out, block)
    assert msg.startswith("cast_back")


@pytest.mark.parametrize("tokens", [0, 1, 5])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_valid_e5m6_cast_back_and_per_token(tokens, layout):
    pair = _e5m6_pair(tokens, 576, layout)
    _raises("not a CUDA device", cb.cast_back, pair, "bf16", (1, 576), x_special_fmt="e5m6")
    _raises("not a CUDA device", cb.per_token_cast_back, pair, "fp32", 576, x_special_fmt="e5m6")


@pytest.mark.parametrize("tokens", [0, 1, 7])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_valid_per_token_cast_back_token_counts(tokens, layout):
    _raises("not a CUDA device", cb.per_token_cast_back, _pair("e2m1", tokens, 576, (1, 576), layout), "bf16", 576)
    _raises("not a CUDA device", cb.per_token_cast_back, _pair("e4m3", tokens, 576, (1, 128), layout), "fp32", 128)


def test_non_power_of_two_blocks_spanning_the_dimension_are_accepted():
    _raises("not a CUDA device", cb.cast_back, _pair("e4m3", 3, 576, (3, 576)), "bf16", (3, 576))
    _raises("not a CUDA device", cb.cast_back, _pair("e4m3", 3, 576, (5, 1000)), "bf16", (5, 1000))


# -------------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize("fmt", ["bf8", "e4m3", None, "BF16", 16])
def test_bad_output_fmt(fmt):
    msg = _raises("fmt=", cb.cast_back, _pair(), fmt, (1, 128))
    assert "'bf16', 'fp32'" in msg


def test_bad_special_fmt():
    msg = _raises("x_special_fmt='e4m3'", cb.cast_back, _pair(), "bf16", (1, 128), x_special_fmt="e4m3")
    assert "'e5m6'" in msg


@pytest.mark.parametrize("x", [torch.zeros((4, 128), dtype=E4M3), (torch.zeros((4, 128), dtype=E4M3),), [1, 2]])
def test_input_must_be_a_pair(x):
    msg = _raises("tuple", cb.cast_back, x, "bf16", (1, 128))
    assert msg.startswith("cast_back")


def test_bad_data_dtypes():
    _, sf = _pair()
    _raises("bfloat16", cb.cast_back, (torch.zeros((6, 256), dtype=torch.bfloat16), sf), "bf16", (1, 128))
    msg = _raises("uint8", cb.cast_back, (torch.zeros((6, 256), dtype=torch.uint8), sf), "bf16", (1, 128))
    assert "x_special_fmt='e5m6'" in msg
    data, sf6 = _e5m6_pair()
    _raises("uint8", cb.cast_back, (data.view(torch.int8), sf6), "bf16", (1, 256), x_special_fmt="e5m6")


def test_bad_data_rank():
    _, sf = _pair()
    _raises("2-D", cb.cast_back, (torch.zeros((6, 2, 128), dtype=E4M3), sf), "bf16", (1, 128))


@pytest.mark.parametrize("fmt, width", [("e4m3", 96), ("e4m3", 200), ("e2m1", 48)])
def test_hidden_not_a_multiple_of_64(fmt, width):
    dtype = E4M3 if fmt == "e4m3" else torch.int8
    hidden = width * (2 if fmt == "e2m1" else 1)
    sf = torch.ones((4, 1))
    msg = _raises(f"hidden={hidden}", cb.cast_back, (torch.zeros((4, width), dtype=dtype), sf), "bf16", (1, hidden))
    assert "% 64" in msg


def test_e5m6_bytes_not_a_multiple_of_12():
    msg = _raises("multiple of 12", cb.cast_back, (torch.zeros((4, 18), dtype=torch.uint8), torch.ones((4, 1))),
                  "bf16", (1, 12), x_special_fmt="e5m6")
    assert msg.startswith("cast_back")


@pytest.mark.parametrize("block", [(1, 96), (3, 128), (1, 0), (0, 128), (1, "128"), (True, 128), (1, 2.0)])
def test_unsupported_block_sizes(block):
    data, sf = _pair("e4m3", 6, 256, (1, 128))
    msg = _raises("x_block_size", cb.cast_back, (data, sf), "bf16", block)
    assert msg.startswith("cast_back")


@pytest.mark.parametrize("block", [None, [1, 128], (1, 128, 1)])
def test_block_size_must_be_a_pair(block):
    _raises("x_block_size", cb.cast_back, _pair(), "bf16", block)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sf_shape_must_match_the_block(layout):
    data, sf = _pair("e4m3", 6, 256, (1, 128), layout)
    msg = _raises("sf has shape", cb.cast_back, (data, sf), "bf16", (1, 16))
    assert "(6, 16)" in msg or "(6, 4)" in msg
    _raises("sf has shape", cb.cast_back, (data[:5], sf), "bf16", (1, 128))


def test_bad_sf_dtypes_and_layouts():
    data, sf = _pair("e4m3", 6, 256, (1, 128))
    _raises("float32", cb.cast_back, (data, sf.to(torch.bfloat16)), "bf16", (1, 128))
    _raises("float32", cb.cast_back, (data, sf.view(torch.int32)), "bf16", (1, 128))  # int32 row-major
    _raises("2-D", cb.cast_back, (data, sf.reshape(-1)), "bf16", (1, 128))
    _raises("sf", cb.cast_back, (data, "sf"), "bf16", (1, 128))


def test_too_many_elements():
    data = torch.empty((1 << 16, 1 << 15), dtype=E4M3, device="meta")
    sf = torch.empty((1 << 16, 1 << 8), dtype=torch.float32, device="meta")
    msg = _raises("32-bit", cb.cast_back, (data, sf), "bf16", (1, 128))
    assert str(1 << 31) in msg


# --------------------------------------------------------------------------- per_token_cast e5m6
@pytest.mark.parametrize("layout", list(LAYOUTS) + ["row_round", "col_round"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", [0, 3])
def test_e5m6_cast_valid_reaches_the_device_check(tokens, dtype, layout):
    col, rnd, packed = LAYOUTS.get(layout, (layout == "col_round", True, False))
    x = torch.zeros((tokens, 576), dtype=dtype)
    msg = _raises("not a CUDA device", e5.per_token_cast_to_e5m6, x, 576, col, rnd, packed)
    assert msg.startswith("per_token_cast")


def test_e5m6_cast_bad_inputs():
    _raises("float16", e5.per_token_cast_to_e5m6, torch.zeros((4, 64), dtype=torch.float16), 64)
    _raises("2-D", e5.per_token_cast_to_e5m6, torch.zeros((2, 4, 64)), 64)
    _raises("torch.Tensor", e5.per_token_cast_to_e5m6, [[1.0] * 64], 64)
    msg = _raises("num_per_channels=128", e5.per_token_cast_to_e5m6, torch.zeros((4, 256)), 128)
    assert "256" in msg
    _raises("num_per_channels=True", e5.per_token_cast_to_e5m6, torch.zeros((4, 1)), True)
    msg = _raises("hidden=12", e5.per_token_cast_to_e5m6, torch.zeros((4, 12)), 12)
    assert "% 8" in msg


def test_e5m6_cast_bad_flags():
    x = torch.zeros((4, 64))
    _raises("use_tma_aligned_col_major_sf", e5.per_token_cast_to_e5m6, x, 64, False, True, True)
    _raises("round_sf", e5.per_token_cast_to_e5m6, x, 64, True, False, True)
    _raises("round_sf must be a bool", e5.per_token_cast_to_e5m6, x, 64, False, "yes")


# ------------------------------------------------------------------------- unpack_from_e2m1fn_x2
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_unpack_matches_the_reference(dtype, out_dtype):
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    for x in (every, every.reshape(4, 8, 8), every.reshape(16, 16)[:, 3:9]):
        got = cb.unpack_from_e2m1fn_x2(x, out_dtype)
        quant_ref.assert_equal(got, quant_ref.unpack_e2m1(x, out_dtype), f"unpack {dtype} -> {out_dtype}")
        assert got.shape == (*x.shape[:-1], 2 * x.shape[-1]) and got.is_contiguous()
    assert cb.unpack_from_e2m1fn_x2(every).dtype == torch.float32
    assert torch.signbit(cb.unpack_from_e2m1fn_x2(torch.tensor([8], dtype=dtype)))[0]  # -0.0


def test_unpack_kernel_run_routes_by_size_and_layout(monkeypatch):
    """The kernel path's launch (CPU tensors, a recording launch): a 2-D contiguous aligned x goes
    as it is, any other rank as [rows, bytes] views, a strided x as a contiguous copy, an empty one
    launches nothing, and x past UNPACK_KERNEL_MAX_BYTES takes the torch path (no launch)."""
    launched, gathered = [], []

    def gather(x, *_):
        gathered.append(tuple(x.shape))
        return quant_ref.unpack_e2m1(x, torch.bfloat16)

    run = cb._unpack_kernel_run(torch.device("cpu"), torch.bfloat16, lambda x, out: launched.append((x, out)), gather)
    x = torch.zeros(4, 32, dtype=torch.int8)
    out = run(x)
    assert launched[-1][0] is x and launched[-1][1] is out and out.shape == (4, 64) and out.dtype == torch.bfloat16
    run(torch.zeros(2, 3, 32, dtype=torch.int8))
    assert launched[-1][0].shape == (6, 32) and launched[-1][1].shape == (6, 64)
    strided = torch.zeros(32, 8, dtype=torch.int8).t()
    run(strided)
    assert launched[-1][0].is_contiguous() and launched[-1][0].shape == (8, 32)
    count = len(launched)
    assert run(torch.zeros(0, 32, dtype=torch.int8)).shape == (0, 64) and len(launched) == count
    monkeypatch.setattr(cb, "UNPACK_KERNEL_MAX_BYTES", 100)
    assert run(torch.zeros(4, 26, dtype=torch.int8)).shape == (4, 52) and gathered == [(4, 26)]
    assert len(launched) == count


def test_unpack_bad_arguments():
    _raises("float32", cb.unpack_from_e2m1fn_x2, torch.zeros(4))
    _raises("at least 1 dimension", cb.unpack_from_e2m1fn_x2, torch.tensor(3, dtype=torch.int8))
    _raises("torch.Tensor", cb.unpack_from_e2m1fn_x2, [1, 2])
    _raises("out_dtype", cb.unpack_from_e2m1fn_x2, torch.zeros(4, dtype=torch.int8), "float32")
