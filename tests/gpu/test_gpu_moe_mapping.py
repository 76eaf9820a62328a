"""GPU tests of ``moe.get_fused_mapping`` and ``moe.aux_fi`` (with ``moe.aux_fi_many_experts`` past
4096 experts), bit-exact against ``moe_ref``.

Sizes: 0 and 1 token, odd counts, decode batches of 1-512 tokens at 256 experts (the mapping's
barrier-free ``redundant`` variant, up to 2048 entries), the benchmark's 4001 x 8 EP ranks shapes
(its cooperative variant, with one grid barrier up to 64 experts and two past them; aux_fi's grid
with 4 and, forced, with 8 loads per thread), caller-sized slot buffers (larger and too small),
large alignments, ids out of range, several SM counts; free memory is poisoned before each call
so an unwritten element shows up.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed, topk_idx
from moe_ref import routing as ref
from moe_ref import stats as stats_ref

OPS = ("get_fused_mapping", "aux_fi")
NAMES = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start", "expert_end",
         "num_tokens_per_expert")

# (tokens per EP rank, topk, experts per rank, EP ranks, alignment)
MAP_CASES = (
    (0, 8, 32, 8, 128),
    (1, 1, 4, 64, 1),
    (1, 8, 256, 1, 16),
    (4, 8, 256, 1, 16),
    (16, 8, 256, 1, 16),
    (64, 8, 256, 1, 16),
    (128, 8, 256, 1, 16),
    (129, 8, 256, 1, 16),
    (256, 8, 256, 1, 16),
    (257, 8, 256, 1, 16),
    (512, 8, 256, 1, 16),
    (128, 8, 256, 1, 128),
    (37, 6, 72, 1, 32),
    (33, 9, 1024, 1, 33),
    (300, 8, 1024, 1, 7),
    (4001, 2, 32, 8, 128),
    (4001, 6, 32, 8, 128),
    (4001, 8, 32, 8, 128),
    (4001, 9, 32, 8, 128),
    (4001, 9, 144, 1, 64),
    (4001, 8, 64, 4, 16),  # the cooperative variant's one-barrier path up to 64 experts, and just past it
    (3000, 4, 65, 1, 8),
    (4125, 8, 64, 1, 16),  # 33,000 entries: the unroll-1 grid of 129 blocks (132 SMs), so phase 2's third row group
    (8001, 6, 256, 1, 16),
    (2000, 8, 1024, 1, 128),
)


def _case_id(case) -> str:
    return "t{}-k{}-e{}-ep{}-a{}".format(*case)


@pytest.fixture(scope="module")
def moe(require):
    return load_moe_ops(require, OPS, "ops/moe/_routing.py, ops/moe/_stats.py")


@pytest.fixture(params=[None, 0], ids=("default", "wide"))
def aux_fi_grid(request, require, monkeypatch):
    """aux_fi's grid: the op's choice, or "wide": moe.aux_fi's 8-loads-per-thread grid at every size."""
    from tilebin.ops.moe import _stats

    require("moe.aux_fi_many_experts")  # past 4096 experts
    if request.param is not None:
        monkeypatch.setattr(_stats, "_AUX_FI_WIDE", request.param)
    return "aux_fi" if request.param is None else "aux_fi (wide grid)"


def _check_mapping(got, want, what: str) -> None:
    for name, g, w in zip(NAMES, got[:7], want[:7]):
        assert g.is_cuda and g.is_contiguous(), f"{what} {name}: device {g.device}, strides {g.stride()}"
        assert_bits_equal(g, w, f"{what} {name}")
    assert got[7] == want[7], f"{what} num_tokens_per_expert_list: {got[7][:16]}..., want {want[7][:16]}..."


def _decode_idx(tokens: int, topk: int, experts: int) -> torch.Tensor:
    """Every token routed to topk distinct experts (no -1), as the decode benchmark makes them."""
    return torch.rand((tokens, experts), device="cuda").topk(topk, dim=-1).indices.contiguous()


@pytest.mark.parametrize("case", MAP_CASES, ids=_case_id)
def test_mapping(moe, sm_counts, case):
    tokens, topk, experts, ep_ranks, alignment = case
    seed("cand_gfm", case)
    idx = _decode_idx(tokens, topk, experts) if ep_ranks == 1 and tokens <= 512 else topk_idx(
        tokens, topk, experts, ep_ranks)
    sized = idx.numel() + experts * (alignment - 1)  # the benchmark's caller-given size (a tail of -1)
    counts, set_num_sms = sm_counts
    for size in (0, sized):
        want = ref.get_fused_mapping(idx, experts, size, alignment)
        for sms in counts:
            set_num_sms(sms)
            poison_cache(idx.numel() * 16 + sized * 12 + (1 << 20))
            got = moe.get_fused_mapping(idx, experts, size, alignment)
            what = f"get_fused_mapping({tuple(idx.shape)}, E={experts}, size={size}, alignment={alignment}, {sms} SMs)"
            _check_mapping(got, want, what)
            if size == 0:
                ref.check_mapping_invariants(got, idx, experts, alignment)
    set_num_sms(0)


@pytest.mark.parametrize("tokens, experts, alignment", [(64, 256, 16), (4001, 32, 64)])
@pytest.mark.parametrize("extra", [5, -3])
def test_mapping_caller_sized(moe, sm_counts, tokens, experts, alignment, extra):
    """A larger buffer (the tail is -1) or a too small one (slots past the end are not written)."""
    seed("cand_gfm_fixed", tokens, experts, extra)
    idx = _decode_idx(tokens, 8, experts) if tokens <= 128 else topk_idx(tokens, 8, experts, 8)
    need = ref.get_fused_mapping(idx, experts, 0, alignment)[6].sum().item()
    size = max(need + extra * alignment, 0)
    want = ref.get_fused_mapping(idx, experts, size, alignment, force_no_sync=True)
    counts, set_num_sms = sm_counts
    for sms in (counts[0], counts[-1]):
        set_num_sms(sms)
        poison_cache(1 << 22)
        got = moe.get_fused_mapping(idx, experts, size, alignment, force_no_sync=True)
        _check_mapping(got, want, f"get_fused_mapping(size={size} of {need}, {sms} SMs)")
    set_num_sms(0)


@pytest.mark.parametrize("rows", [7, 3001])
def test_mapping_out_of_range_ids(moe, sm_counts, rows):
    seed("cand_gfm_range", rows)
    idx = torch.randint(-3, 40, (rows, 9), dtype=torch.int64, device="cuda")
    want = ref.get_fused_mapping(idx, 33, 0, 16)
    counts, set_num_sms = sm_counts
    for sms in counts:
        set_num_sms(sms)
        poison_cache(1 << 22)
        _check_mapping(moe.get_fused_mapping(idx, 33, 0, 16), want, f"get_fused_mapping(ids in [-3, 40), {sms} SMs)")
    set_num_sms(0)


# (tokens per EP rank, topk, experts per rank, EP ranks)
AUX_CASES = (
    (0, 8, 32, 8),
    (1, 9, 256, 1),
    (37, 6, 72, 1),
    (128, 8, 256, 1),
    (511, 8, 256, 1),
    (4001, 2, 32, 8),
    (4001, 6, 32, 8),
    (4001, 8, 32, 8),
    (4001, 9, 32, 8),
    (4001, 9, 144, 1),
    (8001, 8, 4, 64),
    (2000, 8, 4096, 1),
    (300, 8, 5000, 1),  # past moe.aux_fi's bins: the op launches moe.aux_fi_many_experts
)


@pytest.mark.parametrize("case", AUX_CASES, ids=lambda c: "t{}-k{}-e{}-ep{}".format(*c))
def test_aux_fi(moe, aux_fi_grid, sm_counts, case):
    tokens, topk, experts, ep_ranks = case
    seed("cand_aux_fi", case)
    idx = topk_idx(tokens, topk, experts, ep_ranks)
    counts, set_num_sms = sm_counts
    for num_aux_topk in dict.fromkeys((1, topk)):
        want = stats_ref.aux_fi(idx, experts, num_aux_topk)
        for sms in counts:
            set_num_sms(sms)
            poison_cache(idx.numel() * 8 + (1 << 20))
            got = moe.aux_fi(idx, experts, num_aux_topk)
            assert got.is_cuda and got.is_contiguous() and tuple(got.shape) == (experts,)
            assert_bits_equal(got, want, f"{aux_fi_grid}({tuple(idx.shape)}, E={experts}, A={num_aux_topk}, "
                                         f"{sms} SMs)")
    set_num_sms(0)


def test_aux_fi_out_of_range_ids(moe, aux_fi_grid):
    seed("cand_aux_fi_range")
    idx = torch.randint(-3, 40, (3001, 9), dtype=torch.int64, device="cuda")
    assert_bits_equal(moe.aux_fi(idx, 33, 9), stats_ref.aux_fi(idx, 33, 9), f"{aux_fi_grid}(ids in [-3, 40))")
