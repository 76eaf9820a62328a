"""CPU tests of the fused MoE routing ops' argument checks (no GPU): every bad argument raises an
ArgumentError naming the op and the value before any GPU work; valid CPU tensors get as far as
the device check (the last one).  Also the reference's exact FMA (``moe_ref.routing.fma_f32``)
and mapping on CPU.  Kernel constants (``max_experts``) come from the kernels' declarations, as
the manifest carries them (no built artifacts here)."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import torch

from tilebin.ops.moe import _routing as rt
from tilebin.runtime import ArgumentError

I32, I64 = torch.int32, torch.int64


def _raises(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(ArgumentError, match=match) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert msg.startswith(fn.__name__ + ":"), msg
    return msg


def _map(tokens=4, topk=2):
    return torch.zeros((tokens, topk), dtype=I32)


def _p2e(slots=16):
    return torch.zeros((slots,), dtype=I32)


# ---------------------------------------------------------------- valid calls reach the device check
VALID = {
    "get_fused_mapping": lambda: (rt.get_fused_mapping, (torch.zeros((4, 2), dtype=I64), 8, 0, 16), {}),
    "get_fused_mapping_fixed": lambda: (rt.get_fused_mapping, (torch.zeros((0, 9), dtype=I64), 1024, 64, 1),
                                        {"force_no_sync": True}),
    "expand_bf16": lambda: (rt.expand_to_fused, (torch.zeros((4, 576), dtype=torch.bfloat16), _map(), _p2e()), {}),
    "expand_fp32": lambda: (rt.expand_to_fused, (torch.zeros((4, 2048)), _map(), _p2e()), {}),
    "expand_e4m3": lambda: (rt.expand_to_fused,
                            (torch.zeros((4, 7168), dtype=torch.float8_e4m3fn), _map(), _p2e()), {}),
    "expand_sf_row": lambda: (rt.expand_to_fused_with_sf,
                              ((torch.zeros((4, 576), dtype=torch.float8_e4m3fn), torch.ones((4, 18))), 32,
                               _map(), _p2e()), {}),
    "expand_sf_col": lambda: (rt.expand_to_fused_with_sf,
                              ((torch.zeros((4, 7168), dtype=torch.float8_e4m3fn), torch.ones((4, 56))), 128,
                               _map(), _p2e(), True), {}),
    "expand_sf_ue8m0": lambda: (rt.expand_to_fused_with_sf,
                                ((torch.zeros((4, 2560), dtype=torch.float8_e4m3fn), torch.ones((4, 20), dtype=I32)),
                                 32, _map(), _p2e(), True), {}),
    "reduce": lambda: (rt.reduce_fused, (torch.zeros((16, 4096)), None, _map()), {}),
    "reduce_all": lambda: (rt.reduce_fused,
                           ((torch.zeros((16, 3072), dtype=torch.bfloat16), torch.ones(16)), torch.ones((4, 2)),
                            _map(), "e4m3", torch.ones(1)), {"out": torch.empty((4, 3072), dtype=torch.float8_e4m3fn)}),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_cpu_arguments_reach_the_device_check(name):
    fn, args, kwargs = VALID[name]()
    msg = _raises("not a CUDA device", fn, *args, **kwargs)
    assert ".cuda()" in msg


# ---------------------------------------------------------------- get_fused_mapping
@pytest.mark.parametrize("bad,match", [
    ({"topk_idx": torch.zeros((4, 2), dtype=I32)}, "dtype int32; supported: int64"),
    ({"topk_idx": torch.zeros((8,), dtype=I64)}, "must be 2-D"),
    ({"topk_idx": torch.zeros((2, 4), dtype=I64).T}, "must be contiguous"),
    ({"topk_idx": [[0, 1]]}, "must be a torch.Tensor"),
    ({"num_experts": 0}, "num_experts=0 is out of range"),
    ({"num_experts": 1025}, "num_experts=1025 is out of range"),
    ({"num_experts": 8.0}, "num_experts must be an int"),
    ({"num_experts": True}, "must be an int, got bool"),
    ({"num_expanded_tokens": -1}, "num_expanded_tokens=-1 is out of range"),
    ({"alignment": 0}, "alignment=0 is out of range"),
    ({"force_no_sync": "yes"}, "force_no_sync must be a bool"),
])
def test_get_fused_mapping_bad_arguments(bad, match):
    args = {"topk_idx": torch.zeros((4, 2), dtype=I64), "num_experts": 8, "num_expanded_tokens": 0, "alignment": 16}
    args.update(bad)
    _raises(match, rt.get_fused_mapping, **args)


def test_get_fused_mapping_too_many_slots():
    _raises("exceed 2\\*\\*30 slots", rt.get_fused_mapping, torch.zeros((4, 2), dtype=I64), 1024, 0, 2**21)


# ---------------------------------------------------------------- expand_to_fused
@pytest.mark.parametrize("bad,match", [
    ({"x": torch.zeros((4, 576), dtype=torch.float16)}, "dtype float16; supported"),
    ({"x": torch.zeros((4, 100), dtype=torch.bfloat16)}, "hidden % 8 == 0"),
    ({"x": torch.zeros((4, 520), dtype=torch.float8_e4m3fn)}, "hidden % 16 == 0"),
    ({"x": torch.zeros((4, 18))}, "hidden % 4 == 0"),
    ({"x": torch.zeros((576, 4), dtype=torch.bfloat16).T}, "must be contiguous"),
    ({"x": torch.zeros((4 * 576 + 1,), dtype=torch.bfloat16)[1:].view(4, 576)}, "not 16-byte aligned"),
    ({"token_topk_to_pos": torch.zeros((4, 2), dtype=I64)}, "token_topk_to_pos has dtype int64"),
    ({"token_topk_to_pos": _map(5)}, "token_topk_to_pos has 5 rows but x has 4 tokens"),
    ({"token_topk_to_pos": _map(2, 4).T}, "token_topk_to_pos must be contiguous"),
    ({"pos_to_expert": torch.zeros((16,), dtype=I64)}, "pos_to_expert has dtype int64"),
    ({"pos_to_expert": torch.zeros((4, 4), dtype=I32)}, "pos_to_expert must be 1-D"),
])
def test_expand_to_fused_bad_arguments(bad, match):
    args = {"x": torch.zeros((4, 576), dtype=torch.bfloat16), "token_topk_to_pos": _map(), "pos_to_expert": _p2e()}
    args.update(bad)
    _raises(match, rt.expand_to_fused, **args)


def _sf_pair(hidden=576, sf_cols=18, sf_dtype=torch.float32, dtype=torch.float8_e4m3fn):
    return torch.zeros((4, hidden), dtype=dtype), torch.ones((4, sf_cols), dtype=sf_dtype)


@pytest.mark.parametrize("bad,match", [
    ({"x": torch.zeros((4, 576), dtype=torch.float8_e4m3fn)}, "must be a \\(data, sf\\) tuple"),
    ({"x": _sf_pair(dtype=torch.float32)}, "x\\[0\\] \\(data\\) has dtype float32"),
    ({"x": _sf_pair(hidden=520, sf_cols=17)}, "hidden % 16 == 0"),
    ({"x": _sf_pair(sf_dtype=torch.float16)}, "x\\[1\\] \\(sf\\) has dtype float16"),
    ({"x": _sf_pair(sf_cols=9)}, "it must be \\(4, 18\\)"),
    ({"x": (torch.zeros((4, 576), dtype=torch.float8_e4m3fn), torch.ones((18, 4)).T)}, "sf\\) must be contiguous"),
    ({"num_per_channels": 64}, "num_per_channels=64 is not supported; supported: 32, 128"),
    ({"num_per_channels": 128.0}, "num_per_channels=128.0 is not supported"),
    ({"x": _sf_pair(sf_cols=5, sf_dtype=I32)}, "need use_tma_aligned_col_major_sf=True"),
    ({"x": _sf_pair(sf_cols=18, sf_dtype=I32), "use_tma_aligned_col_major_sf": True}, "it must be \\(4, 5\\)"),
    ({"use_tma_aligned_col_major_sf": "no"}, "use_tma_aligned_col_major_sf must be a bool"),
    ({"token_topk_to_pos": _map(3)}, "3 rows but x has 4 tokens"),
    ({"pos_to_expert": torch.zeros((16,), dtype=torch.float32)}, "pos_to_expert has dtype float32"),
])
def test_expand_to_fused_with_sf_bad_arguments(bad, match):
    args = {"x": _sf_pair(), "num_per_channels": 32, "token_topk_to_pos": _map(), "pos_to_expert": _p2e()}
    args.update(bad)
    _raises(match, rt.expand_to_fused_with_sf, **args)


# ---------------------------------------------------------------- reduce_fused
@pytest.mark.parametrize("bad,match", [
    ({"x": torch.zeros((16, 256), dtype=torch.float8_e4m3fn)}, "x has dtype float8_e4m3fn; supported: float32, bfloat16"),
    ({"x": torch.zeros((16, 12), dtype=torch.bfloat16)}, "hidden % 8 == 0"),
    ({"x": torch.zeros((256, 16)).T}, "x must be contiguous"),
    ({"x": (torch.zeros((16, 256)), torch.ones(16), torch.ones(1))}, "an \\(x, x_sf\\) pair"),
    ({"x": (torch.zeros((16, 256)), torch.ones(15))}, "x_sf has 15 scales but x has 16 rows"),
    ({"x": (torch.zeros((16, 256)), torch.ones(16, dtype=torch.bfloat16))}, "x_sf has dtype bfloat16"),
    ({"topk_weights": torch.ones((4, 2), dtype=torch.bfloat16)}, "topk_weights has dtype bfloat16"),
    ({"topk_weights": torch.ones((4, 3))}, "topk_weights has shape \\(4, 3\\) but token_topk_to_pos has \\(4, 2\\)"),
    ({"token_topk_to_pos": torch.zeros((4, 2), dtype=I64)}, "token_topk_to_pos has dtype int64"),
    ({"fp8_format": "e5m2"}, "fp8_format='e5m2' is not supported"),
    ({"sf": torch.ones(1)}, "sf is supported with fp8_format='e4m3' only"),
    ({"fp8_format": "e4m3", "sf": torch.ones(2)}, "sf has shape \\(2,\\)"),
    ({"fp8_format": "e4m3", "sf": torch.ones(1, dtype=torch.float64)}, "sf has dtype float64"),
    ({"out": torch.empty((4, 256), dtype=torch.bfloat16)}, "out has dtype bfloat16; supported: float32"),
    ({"out": torch.empty((5, 256))}, "out has shape \\(5, 256\\); it must be \\(4, 256\\)"),
    ({"fp8_format": "e4m3", "out": torch.empty((4, 256))}, "out has dtype float32; supported: float8_e4m3fn"),
])
def test_reduce_fused_bad_arguments(bad, match):
    args = {"x": torch.zeros((16, 256)), "topk_weights": torch.ones((4, 2)), "token_topk_to_pos": _map()}
    args.update(bad)
    _raises(match, rt.reduce_fused, **args)


# ---------------------------------------------------------------- the reference (CPU)
def _exact_fma(a: float, b: float, c: float) -> float:
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    lo = torch.tensor(float(exact), dtype=torch.float64).float().item()  # candidate, then fix by comparison
    cands = sorted({lo, torch.nextafter(torch.tensor(lo), torch.tensor(float("inf"))).item(),
                    torch.nextafter(torch.tensor(lo), torch.tensor(float("-inf"))).item()})
    best = min(cands, key=lambda v: (abs(Fraction(v) - exact), int(torch.tensor(v).view(torch.int32).item()) & 1))
    return best


def test_reference_fma_is_correctly_rounded():
    from moe_ref.routing import fma_f32

    rng = random.Random(7)
    a, b, c = [], [], []
    for _ in range(3000):
        x = torch.tensor(rng.uniform(-4, 4)).float().item()
        y = torch.tensor(rng.uniform(-4, 4)).float().item()
        z = torch.tensor(rng.uniform(-4, 4)).float().item()
        a.append(x), b.append(y), c.append(z)
    # the float64 sum is a tie between two fp32 neighbours and the exact value is not:
    # (1 + 2**-23) + (1 + 2**-23) * 2**-24 * (1 - 2**-23) = 1 + 2**-23 + 2**-24 - 2**-70, both signs
    for sign in (1.0, -1.0):
        a.append(sign * (1 + 2.0**-23)), b.append(2.0**-24 * (1 - 2.0**-23)), c.append(sign * (1 + 2.0**-23))
    got = fma_f32(torch.tensor(a), torch.tensor(b), torch.tensor(c))
    for i, (x, y, z) in enumerate(zip(a, b, c)):
        want = _exact_fma(x, y, z)
        assert got[i].item() == want, f"fma({x!r}, {y!r}, {z!r}) = {got[i].item()!r}, want {want!r}"


@pytest.mark.parametrize("alignment", [1, 16, 128])
def test_reference_mapping_invariants_and_order(alignment):
    from moe_ref.routing import check_mapping_invariants, get_fused_mapping

    g = torch.Generator().manual_seed(alignment)
    idx = torch.randint(-1, 9, (101, 6), generator=g)
    res = get_fused_mapping(idx, 9, 0, alignment)
    check_mapping_invariants(res, idx, 9, alignment)
    p2tt, start, per = res[2], res[4], res[6]
    for e in range(9):  # ascending flat order within each expert
        seg = p2tt[start[e]:start[e] + per[e]]
        seg = seg[seg >= 0]
        assert torch.equal(seg, torch.sort(seg).values)


@pytest.mark.parametrize("numel, experts, cap, want", [
    (2048, 256, 132, (17, True, 4)),  # decode sizes: the barrier-free variant (a block per 2048 slots)
    (15000, 32, 132, (59, False, 1)),  # one 32-entry trip per warp fits 132 blocks: unroll 1
    (132 * 256, 32, 132, (132, False, 1)),
    (132 * 256 + 1, 32, 132, (34, False, 4)),  # past it: 128-entry trips, as few blocks as one trip needs
    (106000, 32, 132, (104, False, 4)),
    (15000, 32, 7, (5, False, 4)),  # few SMs: unroll 4, three 128-entry trips per warp on 5 blocks
    (3000, 1024, 132, (128, False, 1)),  # at least one warp per expert for phase 2
])
def test_mapping_grid(numel, experts, cap, want):
    assert rt._mapping_grid(numel, experts, numel + experts * 127, cap) == want
