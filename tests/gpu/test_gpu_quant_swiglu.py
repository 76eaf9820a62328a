"""tilebin.ops.quant SwiGLU + e4m3 ops on the GPU, bit-exact against quant_ref.swiglu (the math of
tile_kernels.torch.swiglu_forward / swiglu_backward, then quant_ref.cast), run on CUDA tensors.

Ops: swiglu_forward_and_per_token_cast (bf16/fp32 input; 128 channels per scale in row / col /
packed UE8M0 layouts, or one scale per row incl. rows wider than the 8192 register-resident
channels; weights, pos_to_expert, clamp values, clamp counting on and off, sf_clamp_min, SM count
override), swiglu_backward_and_per_token_cast (32/128 channels per scale, 2-D and 3-D input),
swiglu_forward_and_per_channel_cast_and_transpose (32/128 tokens per scale, both orientations).

Every output is compared bit-exactly (dtype, shape, strides, raw bytes) except the backward's
weight_grad, a row sum whose order differs: tile_kernels' own test compares it with
``torch.testing.assert_close(atol=1e-4, rtol=1e-4)``, the same criterion is used here.  Outputs
come from a pool poisoned with 0xFF, so an element the kernel never wrote shows as a mismatch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import quant_ref  # noqa: E402
from quant_ref import swiglu as ref  # noqa: E402

pytestmark = pytest.mark.gpu
E4M3 = torch.float8_e4m3fn
TOPK = 6


@pytest.fixture(scope="module")
def ops():
    from tilebin.ops import quant

    return quant


def _poison_pool(*numels: int) -> None:
    """Return 0xFF-filled blocks to torch's caching allocator so the op's outputs start as poison."""
    blocks = [torch.empty(max(n, 1), dtype=torch.uint8, device="cuda") for n in numels]
    for b in blocks:
        quant_ref.poison_(b)
    del blocks


def _routing(rng, rows: int):
    """MoE-like rows: ``pos_to_token_topk`` (distinct flat (token, topk) indices, -1 on about one
    row in eight: padding), ``pos_to_expert`` (-1 exactly on the padding rows), ``topk_weights``."""
    num_tokens = rows // TOPK + 3
    perm = torch.randperm(num_tokens * TOPK, device="cuda", generator=rng.gen)[:rows].to(torch.int32)
    pad = torch.rand(rows, device="cuda", generator=rng.gen) < 0.125
    ptt = torch.where(pad, torch.full_like(perm, -1), perm)
    p2e = torch.where(pad, torch.full_like(perm, -1), perm % 7)
    weights = rng.normal((num_tokens, TOPK), torch.float32)
    return ptt, p2e, weights, pad


# --------------------------------------------------------------------------- per-token forward
def _fwd_cases():
    base = dict(dtype="bfloat16", npc=128, layout="row", round_sf=False, weights=False, p2e=False, clamp=None,
                count=False, sf_min=None, sms=0)
    cases = [
        # every hidden size, the three layouts, both round_sf
        dict(rows=4001, hidden=2048, layout="col", round_sf=True, weights=True, p2e=True, clamp=0.5, count=True),
        dict(rows=8001, hidden=2048, layout="ue8m0", round_sf=True, p2e=True, clamp=10.0, count=True),
        dict(rows=8192, hidden=7168, weights=True, p2e=True),
        dict(rows=4001, hidden=576, layout="ue8m0", round_sf=True, weights=True, p2e=True, clamp=0.5, count=True),
        dict(rows=4001, hidden=576, layout="col"),
        dict(rows=33, hidden=2560, layout="ue8m0", round_sf=True, weights=True, clamp=10.0),
        dict(rows=1, hidden=3072, layout="col", round_sf=True, clamp=0.5, count=True),
        dict(rows=4001, hidden=4096, clamp=0.5),
        dict(rows=129, hidden=6144, layout="col", weights=True, p2e=True, clamp=10.0, count=True),
        dict(rows=0, hidden=2048, layout="ue8m0", round_sf=True, p2e=True, clamp=0.5, count=True),
        dict(rows=0, hidden=7168, layout="col"),
        dict(rows=0, hidden=1024, npc=1024),
        # fp32 input
        dict(rows=4001, hidden=2048, dtype="float32", weights=True, p2e=True, clamp=0.5, count=True),
        dict(rows=77, hidden=576, dtype="float32", layout="ue8m0", round_sf=True, clamp=10.0),
        dict(rows=500, hidden=1024, dtype="float32", npc=1024, round_sf=True, weights=True, p2e=True),
        # one scale per row: in registers (<= 8192 channels), partial chunks, and wider rows
        dict(rows=4001, hidden=2048, npc=2048, weights=True, p2e=True, clamp=0.5, count=True),
        dict(rows=257, hidden=7168, npc=7168, round_sf=True, clamp=10.0),
        dict(rows=33, hidden=576, npc=576, weights=True),
        dict(rows=65, hidden=9216, npc=9216, weights=True, p2e=True, clamp=0.5, count=True),
        dict(rows=3, hidden=16448, npc=16448, round_sf=True, dtype="float32"),
        # sf_clamp_min (a large one forces the clamp on many groups), SM count override
        dict(rows=301, hidden=2048, sf_min=0.5, round_sf=True, layout="col"),
        dict(rows=301, hidden=2048, npc=2048, sf_min=3.0),
        dict(rows=4001, hidden=2048, clamp=0.5, count=True, weights=True, sms=1),
        dict(rows=4001, hidden=2048, npc=2048, clamp=0.5, count=True, sms=7),
    ]
    return [dict(base, **c) for c in cases]


def _fwd_id(c):
    return "-".join(f"{k}={v}" for k, v in c.items() if k not in ("sms",) or v)


@pytest.mark.parametrize("case", _fwd_cases(), ids=_fwd_id)
def test_swiglu_forward_and_per_token_cast(ops, rng, case):
    from tilebin.ops import config

    rows, hidden = case["rows"], case["hidden"]
    dtype = getattr(torch, case["dtype"])
    x = rng.normal((rows, 2 * hidden), dtype, scale=3.0)
    ptt, p2e, weights, pad = _routing(rng, rows)
    if rows:
        x[pad] = 1.0e4  # padding rows: finite garbage (never read when pos_to_expert is given)
    col = case["layout"] in ("col", "ue8m0")
    kwargs = dict(
        pos_to_token_topk=ptt if case["weights"] else None, topk_weights=weights if case["weights"] else None,
        pos_to_expert=p2e if case["p2e"] else None, use_tma_aligned_col_major_sf=col, round_sf=case["round_sf"],
        use_packed_ue8m0=case["layout"] == "ue8m0", swiglu_clamp_value=case["clamp"], sf_clamp_min=case["sf_min"])
    start = torch.tensor([5, 7, 11], dtype=torch.int64, device="cuda")
    count = start.clone() if case["count"] else None
    count_ref = start.clone() if case["count"] else None
    want = ref.swiglu_forward_and_per_token_cast(x, "e4m3", case["npc"], clamped_count=count_ref, **kwargs)
    _poison_pool(rows * hidden, rows * (hidden // 32 + 64))
    config.set_num_sms(case["sms"])
    try:
        got = ops.swiglu_forward_and_per_token_cast(x, "e4m3", case["npc"], clamped_count=count, **kwargs)
    finally:
        config.set_num_sms(0)
    torch.cuda.synchronize()
    desc = _fwd_id(case)
    quant_ref.assert_equal(got[0], want[0], f"out ({desc})")
    quant_ref.assert_equal(got[1], want[1], f"out_sf ({desc})")
    if case["count"]:
        assert torch.equal(count, count_ref), (
            f"clamped_count ({desc}): got {count.tolist()}, want {count_ref.tolist()} (started at {start.tolist()}; "
            "order: gate > c, up > c, up < -c; rows with pos_to_expert < 0 are not counted)")
    if rows and not case["sf_min"]:
        act = ref.swiglu_forward(x, ptt if case["weights"] else None, weights, case["clamp"])
        if case["p2e"]:
            act = act.masked_fill(pad.unsqueeze(1), 0.0)
        back = quant_ref.cast_back(got, "fp32", (1, case["npc"]))
        diff = quant_ref.calc_diff(back, act)
        assert diff <= 1e-3, f"{desc}: cast-back calc_diff {diff:.3e} > 1e-3"


def test_swiglu_forward_results_do_not_depend_on_sm_count(ops, rng):
    from tilebin.ops import config

    x = rng.normal((3001, 2 * 2048), torch.bfloat16, scale=3.0)
    results = []
    for sms in (0, 1, 13):
        count = torch.zeros(3, dtype=torch.int64, device="cuda")
        config.set_num_sms(sms)
        try:
            out, sf = ops.swiglu_forward_and_per_token_cast(x, "e4m3", 128, swiglu_clamp_value=0.5,
                                                             clamped_count=count)
        finally:
            config.set_num_sms(0)
        results.append((out, sf, count))
    for sms, (out, sf, count) in zip((1, 13), results[1:]):
        quant_ref.assert_equal(out, results[0][0], f"out with set_num_sms({sms})")
        quant_ref.assert_equal(sf, results[0][1], f"out_sf with set_num_sms({sms})")
        assert torch.equal(count, results[0][2]), f"clamped_count with set_num_sms({sms}): {count.tolist()}"


# -------------------------------------------------------------------------------------- backward
def _bwd_mapping(rng, rows: int):
    """``pos_to_token_topk`` / ``token_topk_to_pos`` of one routing: some rows are padding (-1), some
    (token, topk) slots have no row (-1 in token_topk_to_pos: their weight_grad must be 0)."""
    num_tokens = rows // 4 + 5
    slots = num_tokens * 4
    perm = torch.randperm(slots, device="cuda", generator=rng.gen)[:rows].to(torch.int32)
    pad = torch.rand(rows, device="cuda", generator=rng.gen) < 0.1
    ptt = torch.where(pad, torch.full_like(perm, -1), perm)
    ttp = torch.full((slots,), -1, dtype=torch.int32, device="cuda")
    keep = ptt >= 0
    ttp[ptt[keep].long()] = torch.arange(rows, dtype=torch.int32, device="cuda")[keep]
    weight = torch.rand((num_tokens, 4), device="cuda", generator=rng.gen)
    return ptt, ttp.view(num_tokens, 4), weight


BWD_CASES = [
    (4001, 2048, 128, False, None), (4001, 2048, 32, True, 0.5), (8001, 7168, 128, True, 10.0),
    (1, 576, 32, False, 0.5), (33, 2560, 128, True, None), (257, 3072, 32, False, 10.0),
    (129, 4096, 128, False, 0.5), (65, 6144, 32, True, None), (0, 2048, 128, False, None),
    (4001, 576, 32, True, 10.0),
]


BWD_KERNELS = ("quant.swiglu_backward_and_per_token_cast",)  # the kernels the op may launch (a speed candidate joins here)


@pytest.fixture(params=BWD_KERNELS)
def bwd_kernel(request, require, monkeypatch):
    """Which kernel the backward op launches."""
    from tilebin.ops.quant import _swiglu

    require(request.param)
    monkeypatch.setattr(_swiglu, "_BWD_KERNEL", request.param)
    return request.param


# a 3-D input [2, rows / 2, 2 * hidden] needs an even row count: those cases run 2-D only
@pytest.mark.parametrize("rows, hidden, npc, round_sf, clamp, three_d",
                         [(*c, d) for d in (False, True) for c in BWD_CASES if not (d and c[0] % 2)])
def test_swiglu_backward_and_per_token_cast(ops, bwd_kernel, rng, rows, hidden, npc, round_sf, clamp, three_d):
    x_plain = rng.normal((rows, 2 * hidden), torch.bfloat16)
    xq = quant_ref.cast(x_plain, "e4m3", (1, npc))
    data = xq[0].view(2, rows // 2, 2 * hidden) if three_d else xq[0]
    grad_out = rng.normal((rows, hidden), torch.bfloat16)
    ptt, ttp, weight = _bwd_mapping(rng, rows)
    want = ref.swiglu_backward_and_per_token_cast(xq, grad_out, weight, ptt, ttp, npc, round_sf, clamp)
    _poison_pool(rows * hidden * 2, rows * hidden * 4, rows * hidden * 2)
    got = ops.swiglu_backward_and_per_token_cast((data, xq[1]), grad_out, weight, ptt, ttp, npc, round_sf=round_sf,
                                                 swiglu_clamp_value=clamp)
    torch.cuda.synchronize()
    desc = f"rows={rows} hidden={hidden} npc={npc} round_sf={round_sf} clamp={clamp} 3d={three_d}"
    quant_ref.assert_equal(got[0], want[0], f"out ({desc})")
    quant_ref.assert_equal(got[1][0], want[1][0], f"x_grad_fp8 ({desc})")
    quant_ref.assert_equal(got[1][1], want[1][1], f"x_grad_fp8 sf ({desc})")
    quant_ref.assert_equal(got[2], want[2], f"x_grad ({desc})")
    wg, wg_ref = got[3], want[3]
    assert wg.shape == wg_ref.shape and wg.dtype == wg_ref.dtype, f"weight_grad ({desc}): {wg.shape} {wg.dtype}"
    unmapped = ttp < 0
    assert torch.all(wg[unmapped] == 0), (
        f"weight_grad ({desc}): {int((wg[unmapped] != 0).sum())} entries with token_topk_to_pos < 0 are not 0")
    torch.testing.assert_close(wg, wg_ref, atol=1e-4, rtol=1e-4, msg=lambda m: f"weight_grad ({desc}): {m}")


# --------------------------------------------------------------------------- per-channel forward
CH_CASES = [
    (4096, 2048, 128, True, True, None), (4096, 2048, 32, False, False, 0.5), (8320, 7168, 128, False, True, 10.0),
    (128, 576, 32, True, True, 0.5), (4224, 576, 128, False, False, None), (256, 2560, 32, True, False, 10.0),
    (384, 3072, 128, True, False, 0.5), (1024, 4096, 32, False, True, None), (128, 6144, 128, True, True, 10.0),
    (8192, 2048, 32, True, True, 0.5), (0, 2048, 128, False, True, None), (0, 576, 32, True, False, 0.5),
]


@pytest.mark.parametrize("tokens, hidden, npt, round_sf, transpose, clamp", CH_CASES)
def test_swiglu_forward_and_per_channel_cast_and_transpose(ops, rng, tokens, hidden, npt, round_sf, transpose, clamp):
    x = rng.normal((tokens, 2 * hidden), torch.bfloat16, scale=3.0)
    want = ref.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", npt, round_sf, not transpose, clamp)
    _poison_pool(tokens * hidden, tokens * hidden // 8)
    got = ops.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", npt, round_sf=round_sf,
                                                                without_transpose=not transpose,
                                                                swiglu_clamp_value=clamp)
    torch.cuda.synchronize()
    desc = f"tokens={tokens} hidden={hidden} npt={npt} round_sf={round_sf} transpose={transpose} clamp={clamp}"
    quant_ref.assert_equal(got[0], want[0], f"out ({desc})")
    quant_ref.assert_equal(got[1], want[1], f"out_sf ({desc})")
    if tokens:
        act = ref.swiglu_forward(x, swiglu_clamp_value=clamp).bfloat16().float()
        data = got[0].T if transpose else got[0]
        back = quant_ref.cast_back((data, got[1]), "fp32", (npt, 1))
        diff = quant_ref.calc_diff(back, act)
        assert diff <= 1e-3, f"{desc}: cast-back calc_diff {diff:.3e} > 1e-3"


