"""Which kernel each quant cast launches (CPU, launch stubbed): the kernels that serve part of an
op's range (``quant.per_token_cast_decode``, ``quant.per_channel_cast_bf16``,
``quant.per_token_cast_e5m6_fp32``) against the general ones, with the scalars they get."""

from __future__ import annotations

import pytest
import torch

from ops_stub import StubbedOps, declared_meta

BF16, FP32, E4M3 = torch.bfloat16, torch.float32, torch.float8_e4m3fn


@pytest.fixture
def stub(monkeypatch):
    return StubbedOps(monkeypatch)


def _last(stub, call):
    stub.launches.clear()
    call()
    (launch,) = stub.launches
    return launch


# ------------------------------------------------------------------------------ per_token_cast
def test_per_token_cast_decode_up_to_max_tokens(stub):
    from tilebin.ops import quant

    limit = declared_meta("quant.per_token_cast_decode", "max_tokens")
    assert limit == 256
    for tokens, want in ((1, "quant.per_token_cast_decode"), (limit, "quant.per_token_cast_decode"),
                         (limit + 1, "quant.per_token_cast")):
        for _ in range(2):  # the checked path, then the memoized plan (same configuration, any token count)
            name, key, args = _last(stub, lambda: quant.per_token_cast(torch.zeros(tokens, 7168, dtype=BF16),
                                                                       "e4m3", 128))
            assert name == want, tokens
            assert key == dict(in_dtype="bfloat16", fmt="e4m3", sf="f32", mode="cast", in_sf="none")
            assert args[3:] == (7, 0, 0, 0, 7)  # 1024 bf16 channels per block in both kernels


@pytest.mark.parametrize("dtype, hidden, flags, want_blocks", [
    (FP32, 2048, dict(), 4),  # decode: 512 fp32 channels per block (quant.per_token_cast: 1024)
    (BF16, 576, dict(use_tma_aligned_col_major_sf=True, round_sf=True), 1),
])
def test_per_token_cast_decode_scalars(stub, dtype, hidden, flags, want_blocks):
    from tilebin.ops import quant

    name, _, args = _last(stub, lambda: quant.per_token_cast(torch.zeros(3, hidden, dtype=dtype), "e4m3", 32,
                                                             **flags))
    assert name == "quant.per_token_cast_decode"
    assert args[3:] == (5, 0, int(flags.get("round_sf", False)), int(flags.get("use_tma_aligned_col_major_sf",
                                                                             False)), want_blocks)


@pytest.mark.parametrize("fmt, npc, flags", [
    ("e2m1", 32, dict()),
    ("e4m3", 128, dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)),
    ("e4m3", 7168, dict()),  # one scale per row
])
def test_per_token_cast_general_kernel_outside_decode_range(stub, fmt, npc, flags):
    from tilebin.ops import quant

    name, _, _ = _last(stub, lambda: quant.per_token_cast(torch.zeros(2, 7168, dtype=BF16), fmt, npc, **flags))
    assert name == "quant.per_token_cast"


# ------------------------------------------------------------------------------ per_channel_cast
def test_per_channel_cast_plain_bf16_kernel(stub):
    from tilebin.ops import quant

    x = torch.zeros(300, 576, dtype=BF16)
    for call, round_sf in ((lambda: quant.per_channel_cast(x, "e4m3", 128), 0),
                           (lambda: quant.per_channel_cast_fused(x, "e4m3", 128, True), 1)):
        for _ in range(2):  # the checked path, then the memoized plan
            name, key, args = _last(stub, call)
            assert (name, key) == ("quant.per_channel_cast_bf16", dict(in_dtype="bfloat16", expand=False))
            assert args[0] is x and args[5] == round_sf


@pytest.mark.parametrize("case", ["fp32", "pos_to_token", "quantized"])
def test_per_channel_cast_fused_kernel_for_the_rest(stub, case):
    from tilebin.ops import quant

    x = torch.zeros(300, 576, dtype=FP32 if case == "fp32" else BF16)
    kw: dict = {}
    if case == "pos_to_token":
        kw["pos_to_token"] = torch.zeros(128, dtype=torch.int32)
    if case == "quantized":
        x, kw["num_per_channels"] = (x.to(E4M3), torch.ones(300, 5)), 128
    for _ in range(2):  # the checked path, then the memoized plan
        name, key, _ = _last(stub, lambda: quant.per_channel_cast_fused(x, "e4m3", 128, **kw))
        assert name == "quant.per_channel_cast_fused"
        assert key == dict(in_dtype={"fp32": "float32", "pos_to_token": "bfloat16",
                                     "quantized": "float8_e4m3fn"}[case], expand=case == "pos_to_token")


# ------------------------------------------------------------------------------ e5m6
@pytest.mark.parametrize("dtype, hidden, want", [
    (BF16, 2048, ("quant.per_token_cast_e5m6", 4)), (BF16, 4096, ("quant.per_token_cast_e5m6", 2)),
    (BF16, 7168, ("quant.per_token_cast_e5m6", 1)),
    (FP32, 1024, ("quant.per_token_cast_e5m6_fp32", 4)), (FP32, 2048, ("quant.per_token_cast_e5m6_fp32", 2)),
    (FP32, 4096, ("quant.per_token_cast_e5m6_fp32", 1)), (FP32, 7168, ("quant.per_token_cast_e5m6_fp32", 1)),
])
def test_e5m6_kernel_and_tokens_per_block(stub, dtype, hidden, want):
    from tilebin.ops import quant
    from tilebin.ops.quant._e5m6 import per_token_cast_to_e5m6

    for call in (lambda: quant.per_token_cast(torch.zeros(5, hidden, dtype=dtype), "e5m6", hidden),
                 lambda: per_token_cast_to_e5m6(torch.zeros(5, hidden, dtype=dtype), hidden)):
        for _ in range(2):  # the checked path, then the memoized plan
            name, key, args = _last(stub, call)
            assert (name, args[-1]) == want
            assert key == dict(in_dtype="bfloat16" if dtype == BF16 else "float32", sf_kind="row")
