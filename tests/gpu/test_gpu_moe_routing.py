"""GPU tests of ``tilebin.ops.moe``'s fused routing ops against ``moe_ref.routing`` (bit-exact).

get_fused_mapping (every output, under several SM counts: the layout must not depend on them;
plus tile_kernels' own order-free invariants), expand_to_fused (bf16 / fp32 / e4m3),
expand_to_fused_with_sf (e4m3 / bf16 data; fp32 scales row- and column-major, packed UE8M0
int32 column-major; 32 and 128 channels per scale) and reduce_fused (fp32 / bf16 in, same or
e4m3 out, with and without weights, per-row scales and an output scale).  Top-k indices are
made as tile_kernels' tests make them (random scores over all experts of all EP ranks, top-k,
non-local experts -1, rows with no local expert dropped).  Before each op call the caching
allocator's free memory is filled with 0xFF, so an element a kernel forgot to write shows up.
reduce_fused's reference computes each FMA exactly (float64, correctly rounded to fp32).
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed, topk_idx
from moe_ref import routing as ref

OPS = ("get_fused_mapping", "expand_to_fused", "expand_to_fused_with_sf", "reduce_fused")
HIDDEN = (576, 2048, 2560, 3072, 4096, 6144, 7168)

# (tokens per EP rank, topk, experts per rank, EP ranks, alignment)
MAP_CASES = (
    (0, 8, 32, 8, 128),
    (1, 1, 4, 64, 1),
    (1, 9, 256, 1, 16),
    (37, 6, 72, 1, 32),
    (128, 8, 16, 16, 64),
    (4001, 2, 9, 8, 128),
    (4001, 6, 32, 8, 16),
    (4001, 8, 4, 64, 1),
    (4001, 9, 144, 1, 64),
    (4001, 1, 128, 2, 32),
    (8001, 8, 32, 8, 128),
    (8001, 6, 256, 1, 16),
    (8001, 9, 64, 4, 1),
    (2000, 8, 1024, 1, 128),
)


def _case_id(case) -> str:
    return "t{}-k{}-e{}-ep{}-a{}".format(*case)


@pytest.fixture(scope="module")
def moe(require):
    return load_moe_ops(require, OPS, "ops/moe/_routing.py")


NAMES = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start", "expert_end",
         "num_tokens_per_expert")


def _check_mapping(got, want, what: str) -> None:
    for name, g, w in zip(NAMES, got[:7], want[:7]):
        assert g.is_cuda and g.is_contiguous(), f"{what} {name}: device {g.device}, strides {g.stride()}"
        assert_bits_equal(g, w, f"{what} {name}")
    assert got[7] == want[7], f"{what} num_tokens_per_expert_list: {got[7][:16]}..., want {want[7][:16]}..."


# ---------------------------------------------------------------- get_fused_mapping
@pytest.mark.parametrize("case", MAP_CASES, ids=_case_id)
def test_get_fused_mapping(moe, sm_counts, case):
    tokens, topk, experts, ep_ranks, alignment = case
    seed("gfm", case)
    idx = topk_idx(tokens, topk, experts, ep_ranks)
    want = ref.get_fused_mapping(idx, experts, 0, alignment)
    counts, set_num_sms = sm_counts
    for sms in counts:
        set_num_sms(sms)
        poison_cache(idx.numel() * 16 + (1 << 20))
        got = moe.get_fused_mapping(idx, experts, 0, alignment)
        what = f"get_fused_mapping({tuple(idx.shape)}, E={experts}, alignment={alignment}, num_sms={sms})"
        _check_mapping(got, want, what)
        ref.check_mapping_invariants(got, idx, experts, alignment)
    set_num_sms(0)


@pytest.mark.parametrize("extra", [0, 5, -3])
def test_get_fused_mapping_fixed_size(moe, sm_counts, extra):
    """A caller-sized buffer (force_no_sync): larger (the tail is -1) or too small (slots past
    the end are not written, token_topk_to_pos still names them); no host sync."""
    seed("gfm_fixed", extra)
    idx = topk_idx(4001, 8, 32, 8)
    need = ref.get_fused_mapping(idx, 32, 0, 64)[6].sum().item()
    size = max(need + extra * 64, 0)
    want = ref.get_fused_mapping(idx, 32, size, 64, force_no_sync=True)
    counts, set_num_sms = sm_counts
    for sms in (counts[0], counts[-1]):
        set_num_sms(sms)
        poison_cache(1 << 22)
        got = moe.get_fused_mapping(idx, 32, size, 64, force_no_sync=True)
        _check_mapping(got, want, f"get_fused_mapping(size={size} of {need}, num_sms={sms})")
    set_num_sms(0)
    got = moe.get_fused_mapping(idx, 32, 0, 64, force_no_sync=True)  # TK: empty slot maps, no sync
    _check_mapping(got, ref.get_fused_mapping(idx, 32, 0, 64, force_no_sync=True), "get_fused_mapping(0, no sync)")


def test_get_fused_mapping_out_of_range_ids(moe, sm_counts):
    seed("gfm_range")
    idx = torch.randint(-3, 40, (3001, 9), dtype=torch.int64, device="cuda")
    want = ref.get_fused_mapping(idx, 33, 0, 16)
    counts, set_num_sms = sm_counts
    for sms in counts:
        set_num_sms(sms)
        _check_mapping(moe.get_fused_mapping(idx, 33, 0, 16), want, f"get_fused_mapping(ids in [-3, 40), E=33, {sms} SMs)")
    set_num_sms(0)


# ---------------------------------------------------------------- expand_to_fused
EXPAND_CASES = ((0, 8, 32, 8), (1, 6, 72, 8), (37, 9, 16, 1), (4001, 8, 32, 8), (8001, 6, 256, 1), (4001, 2, 9, 8))


def _mapping(case, alignment=16):
    tokens, topk, experts, ep = case
    idx = topk_idx(tokens, topk, experts, ep)
    p2e, _, _, ttp, *_ = ref.get_fused_mapping(idx, experts, 0, alignment)
    return idx.shape[0], ttp, p2e


def _data(rows: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float8_e4m3fn:
        bits = torch.randint(0, 256, (rows, hidden), dtype=torch.uint8, device="cuda")
        bits[(bits & 0x7F) == 0x7F] = 0x38  # no NaN patterns
        return bits.view(torch.float8_e4m3fn)
    return torch.randn((rows, hidden), dtype=dtype, device="cuda")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("case", EXPAND_CASES, ids=lambda c: "t{}-k{}-e{}-ep{}".format(*c))
def test_expand_to_fused(moe, case, dtype):
    seed("expand", case, str(dtype))
    rows, ttp, p2e = _mapping(case)
    for hidden in (HIDDEN if case[0] in (37, 4001) and case[1] == 8 else HIDDEN[::3]):
        x = _data(rows, hidden, dtype)
        poison_cache(p2e.numel() * hidden * x.element_size())
        got = moe.expand_to_fused(x, ttp, p2e)
        want = ref.expand_to_fused(x, ttp, p2e)
        assert got.is_contiguous(), f"expand_to_fused out strides {got.stride()}"
        assert_bits_equal(got, want, f"expand_to_fused({tuple(x.shape)} {dtype}, slots={p2e.numel()})")


# bf16 data with scales: a representative subset of the cases (1 and 4001 tokens)
@pytest.mark.parametrize("layout", ["row", "col", "ue8m0"])
@pytest.mark.parametrize("npc", [32, 128])
@pytest.mark.parametrize("case, dtype", [
    pytest.param(c, d, id="t{}-k{}-e{}-ep{}-{}".format(*c, str(d).removeprefix("torch.")))
    for d in (torch.float8_e4m3fn, torch.bfloat16) for c in EXPAND_CASES
    if d == torch.float8_e4m3fn or c[0] in (1, 4001)])
def test_expand_to_fused_with_sf(moe, case, npc, layout, dtype):
    seed("expand_sf", case, npc, layout, str(dtype))
    rows, ttp, p2e = _mapping(case)
    for hidden in (HIDDEN if case[0] == 4001 and case[1] == 8 else (576, 7168)):
        x = _data(rows, hidden, dtype)
        groups = -(-hidden // npc)
        if layout == "ue8m0":
            sf = torch.randint(-2**31, 2**31 - 1, (rows, -(-groups // 4)), dtype=torch.int32, device="cuda")
        else:
            sf = torch.rand((rows, groups), dtype=torch.float32, device="cuda") + 0.5
        col = layout != "row"
        poison_cache(p2e.numel() * hidden * 2)
        out, out_sf = moe.expand_to_fused_with_sf((x, sf), npc, ttp, p2e, col)
        want, want_sf = ref.expand_to_fused_with_sf((x, sf), npc, ttp, p2e, col)
        what = f"expand_to_fused_with_sf({tuple(x.shape)} {dtype}, sf {tuple(sf.shape)} {layout}, npc={npc})"
        assert_bits_equal(out, want, what + " out")
        assert out_sf.stride() == want_sf.stride() or out_sf.numel() == 0 or out_sf.shape[0] == 1, (
            f"{what} out_sf strides {out_sf.stride()}, want {want_sf.stride()}")
        assert_bits_equal(out_sf, want_sf, what + " out_sf")


def test_expand_to_fused_with_sf_wide_topk(moe):
    """A top-k wider than a warp (the kernel reads the slots 32 at a time), e4m3 + fp32 scales."""
    seed("expand_sf_wide", "moe.expand_to_fused_with_sf")
    rows, ttp, p2e = _mapping((37, 40, 64, 1))
    x = _data(rows, 576, torch.float8_e4m3fn)
    sf = torch.rand((rows, 576 // 32), dtype=torch.float32, device="cuda") + 0.5
    poison_cache(p2e.numel() * 576 * 2)
    out, out_sf = moe.expand_to_fused_with_sf((x, sf), 32, ttp, p2e)
    want, want_sf = ref.expand_to_fused_with_sf((x, sf), 32, ttp, p2e)
    assert_bits_equal(out, want, "expand_to_fused_with_sf topk 40 out")
    assert_bits_equal(out_sf, want_sf, "expand_to_fused_with_sf topk 40 out_sf")


# ---------------------------------------------------------------- reduce_fused
REDUCE_CASES = ((0, 8, 32, 8), (1, 9, 256, 1), (37, 6, 72, 1), (4001, 8, 32, 8), (8001, 2, 9, 8), (4001, 1, 128, 2))


@pytest.mark.parametrize("in_dtype,out_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                                (torch.float32, "e4m3"), (torch.bfloat16, "e4m3")],
                         ids=["f32", "bf16", "f32-e4m3", "bf16-e4m3"])
@pytest.mark.parametrize("case", REDUCE_CASES, ids=lambda c: "t{}-k{}-e{}-ep{}".format(*c))
def test_reduce_fused(moe, case, in_dtype, out_dtype):
    seed("reduce", case, str(in_dtype), out_dtype)
    tokens, topk, experts, ep = case
    idx = topk_idx(tokens, topk, experts, ep)
    ttp = ref.get_fused_mapping(idx, experts, 0, 1)[3]
    rows = idx.shape[0]
    fp8 = out_dtype or ""
    big = tokens >= 4001
    hiddens = (HIDDEN[1], HIDDEN[-1]) if big else HIDDEN
    flags = [(w, s) for w in (True, False) for s in (True, False)]
    for i, hidden in enumerate(hiddens):
        x = torch.randn((rows * topk, hidden), dtype=in_dtype, device="cuda")
        for with_w, with_xsf in (flags if not big or i == 0 else flags[:1]):
            w = torch.rand((rows, topk), dtype=torch.float32, device="cuda") if with_w else None
            x_sf = torch.randn((rows * topk,), dtype=torch.float32, device="cuda") if with_xsf else None
            for sf in ((None, torch.randn((1,), device="cuda") * 4) if fp8 else (None,)):
                x_in = (x, x_sf) if x_sf is not None else x
                what = (f"reduce_fused({tuple(x.shape)} {in_dtype}, tokens={rows}, topk={topk}, fp8={fp8!r}, "
                        f"weights={with_w}, x_sf={with_xsf}, sf={sf is not None})")
                poison_cache(rows * hidden * 4)
                got = moe.reduce_fused(x_in, w, ttp, fp8, sf)
                want = ref.reduce_fused(x_in, w, ttp, fp8, sf)
                assert got.is_contiguous(), f"{what}: strides {got.stride()}"
                assert_bits_equal(got, want, what)
                if rows and sf is None:  # into a caller's buffer
                    buf = torch.empty_like(want)
                    assert moe.reduce_fused(x_in, w, ttp, fp8, None, buf) is buf
                    assert_bits_equal(buf, want, what + " out=buf")


def test_reduce_fused_saturates_e4m3(moe):
    """Sums past the e4m3 range saturate to +-448 (tile_kernels' kernel does; NaN in a plain .to())."""
    seed("reduce_sat")
    idx = topk_idx(1000, 8, 32, 8)
    ttp = ref.get_fused_mapping(idx, 32, 0, 1)[3]
    x = torch.randn((idx.numel(), 2048), device="cuda") * 300
    got = moe.reduce_fused(x, None, ttp, "e4m3")
    assert_bits_equal(got, ref.reduce_fused(x, None, ttp, "e4m3"), "reduce_fused saturating e4m3")
    assert not torch.isnan(got.float()).any(), "reduce_fused e4m3: NaN for out-of-range sums"


def test_pipeline_round_trip(moe):
    """expand then reduce with unit weights: each token comes back times its valid top-k count."""
    seed("pipeline")
    idx = topk_idx(4001, 8, 32, 8)
    p2e, _, _, ttp, *_ = moe.get_fused_mapping(idx, 32, 0, 128)
    x = torch.randn((idx.shape[0], 4096), device="cuda")
    y = moe.reduce_fused(moe.expand_to_fused(x, ttp, p2e), None, ttp)
    k = (idx >= 0).sum(dim=1, keepdim=True).float()
    torch.testing.assert_close(y, x * k, rtol=1e-6, atol=1e-5)
