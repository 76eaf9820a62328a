"""GPU tests of the issue-12 candidates ``moe._aux_fi_candidate`` (one 8-block cluster, no grid
barrier) and ``moe._get_fused_mapping_candidate`` (the -1 fill before the grid barrier), bit-exact
against ``moe_ref`` and against the shipped kernels.

Each candidate is launched directly (checked ``runtime.launch``, every variant, poisoned outputs)
and through its op with the switch on (``TILEBIN_CANDIDATE_AUX_FI`` /
``TILEBIN_CANDIDATE_GET_FUSED_MAPPING``: the op module's constant monkeypatched, the op's plan
memo cleared before and after).  Fresh random indices with -1 and out-of-range entries; tokens
{0, 1, 7, 4001, 16001}, experts {8, 32, 64, 256}, top-k {1, 2, 6, 8, 9}; the benchmark's
4001 x 8 EP-rank shapes at 32 experts; several SM counts for the mapping's cooperative grid.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed, topk_idx
from moe_ref import routing as ref
from moe_ref import stats as stats_ref

AUX = "moe._aux_fi_candidate"
MAP = "moe._get_fused_mapping_candidate"
NAMES = ("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start", "expert_end",
         "num_tokens_per_expert")
TOKENS = (0, 1, 7, 4001, 16001)
EXPERTS = (8, 32, 64, 256)
TOPKS = (1, 2, 6, 8, 9)
GRID = list(itertools.product(TOKENS, EXPERTS, TOPKS))
POISON = -123456789


def _grid_id(case) -> str:
    return "t{}-e{}-k{}".format(*case)


def _random_idx(tokens: int, topk: int, experts: int) -> torch.Tensor:
    """int64 [tokens, topk] in [-1, experts]: -1 (empty) and ``experts`` (out of range) included."""
    return torch.randint(-1, experts + 1, (tokens, topk), dtype=torch.int64, device="cuda")


@pytest.fixture(scope="module")
def moe(require):
    require(AUX)
    require(MAP)
    return load_moe_ops(require, ("aux_fi", "get_fused_mapping"), "ops/moe/_stats.py, ops/moe/_routing.py")


@pytest.fixture
def aux_switch(monkeypatch):
    """aux_fi with TILEBIN_CANDIDATE_AUX_FI on (plans rebuilt), restored after."""
    from tilebin.ops.moe import _stats

    _stats.AUX_FI.memo.clear()
    monkeypatch.setattr(_stats, "_AUX_FI_CANDIDATE", True)
    yield
    monkeypatch.undo()
    _stats.AUX_FI.memo.clear()


@pytest.fixture
def map_switch(monkeypatch):
    """get_fused_mapping with TILEBIN_CANDIDATE_GET_FUSED_MAPPING on (plans rebuilt), restored after."""
    from tilebin.ops.moe import _routing

    _routing.GET_FUSED_MAPPING.memo.clear()
    monkeypatch.setattr(_routing, "_MAPPING_CANDIDATE", True)
    yield
    monkeypatch.undo()
    _routing.GET_FUSED_MAPPING.memo.clear()


# ---------------------------------------------------------------- aux_fi
@pytest.mark.parametrize("case", GRID, ids=_grid_id)
def test_aux_fi_candidate_kernel(rt, moe, case):
    tokens, experts, topk = case
    seed("cand2_aux", case)
    idx = _random_idx(tokens, topk, experts)
    for aux_topk in dict.fromkeys((1, topk)):
        want = stats_ref.aux_fi(idx, experts, aux_topk)
        shipped = moe.aux_fi(idx, experts, aux_topk)
        assert_bits_equal(shipped, want, f"shipped aux_fi {case} A={aux_topk}")
        for unroll in (8, 16):
            out = torch.full((experts,), float("nan"), dtype=torch.float32, device="cuda")
            rt.launch(AUX, idx, out, aux_topk, unroll=unroll)
            assert_bits_equal(out, want, f"{AUX} unroll={unroll} {tuple(idx.shape)} E={experts} A={aux_topk}")


@pytest.mark.parametrize("topk", TOPKS)
def test_aux_fi_op_with_switch(moe, aux_switch, topk):
    """The op with the switch on: the candidate serves 4096 < indices <= its max_entries, the shipped
    kernels the rest (decode sizes, more than max_entries, more than 4096 experts)."""
    seed("cand2_aux_op", topk)
    shapes = [topk_idx(4001, topk, 32, 8), _random_idx(16001, topk, 64), _random_idx(7, topk, 8),
              _random_idx(40000, topk, 256)]
    for idx, experts in zip(shapes, (32, 64, 8, 256)):
        want = stats_ref.aux_fi(idx, experts, topk)
        poison_cache(1 << 20)
        assert_bits_equal(moe.aux_fi(idx, experts, topk), want, f"aux_fi (switch on) {tuple(idx.shape)} E={experts}")
    idx = _random_idx(300, topk, 5000)  # past the shared bins: moe.aux_fi_many_experts
    assert_bits_equal(moe.aux_fi(idx, 5000, topk), stats_ref.aux_fi(idx, 5000, topk), "aux_fi (switch on) E=5000")


# ---------------------------------------------------------------- get_fused_mapping
def _check_mapping(got, want, what: str) -> None:
    for name, g, w in zip(NAMES, got[:7], want[:7]):
        assert_bits_equal(g, w, f"{what} {name}")


def _launch_mapping(rt, idx: torch.Tensor, experts: int, slots: int, alignment: int, blocks: int, unroll: int):
    """The candidate through runtime.launch, every output poisoned first; returns the 7 maps."""
    full = lambda *shape: torch.full(shape, POISON, dtype=torch.int32, device="cuda")  # noqa: E731
    maps = (full(slots), full(slots), full(slots), full(*idx.shape), full(experts), full(experts), full(experts))
    workspace = full(blocks + 1, experts)
    rt.launch(MAP, idx, *maps, workspace, alignment, unroll=unroll)
    return maps


@pytest.mark.parametrize("case", GRID, ids=_grid_id)
def test_mapping_candidate_kernel(rt, moe, sm_counts, case):
    tokens, experts, topk = case
    seed("cand2_map", case)
    idx = _random_idx(tokens, topk, experts)
    counts, _ = sm_counts
    for alignment in (1, 16 if experts > 32 else 128):
        size = idx.numel() + experts * (alignment - 1)
        for slots in (size, max(size // 2, 0)):  # the benchmark's size (a tail of -1); too small
            want = ref.get_fused_mapping(idx, experts, slots, alignment, force_no_sync=True)
            what = f"{tuple(idx.shape)} E={experts} align={alignment} slots={slots}"
            _check_mapping(moe.get_fused_mapping(idx, experts, slots, alignment, force_no_sync=True), want,
                           f"shipped {what}")
            for blocks, unroll in ((counts[0], 1), (counts[0], 2), (7, 4), (1, 2)):
                got = _launch_mapping(rt, idx, experts, slots, alignment, blocks, unroll)
                _check_mapping(got, want, f"{MAP} blocks={blocks} unroll={unroll} {what}")


@pytest.mark.parametrize("topk", TOPKS)
def test_mapping_op_with_switch(moe, map_switch, sm_counts, topk):
    """The op with the switch on (the candidate above 2048 entries) under several SM counts, sized by the
    op (a host sync) and by the caller (the benchmark's size)."""
    seed("cand2_map_op", topk)
    shapes = [(topk_idx(4001, topk, 32, 8), 32, 128), (_random_idx(16001, topk, 256), 256, 16),
              (_random_idx(7, topk, 64), 64, 16), (_random_idx(3001, topk, 1024), 1024, 7)]
    counts, set_num_sms = sm_counts
    for idx, experts, alignment in shapes:
        for size in (0, idx.numel() + experts * (alignment - 1)):
            want = ref.get_fused_mapping(idx, experts, size, alignment)
            for sms in counts:
                set_num_sms(sms)
                poison_cache(idx.numel() * 16 + (size or idx.numel() * 2) * 12 + (1 << 20))
                got = moe.get_fused_mapping(idx, experts, size, alignment)
                what = f"get_fused_mapping (switch on) {tuple(idx.shape)} E={experts} size={size} {sms} SMs"
                _check_mapping(got, want, what)
                assert got[7] == want[7], f"{what}: num_tokens_per_expert_list differs"
    set_num_sms(0)
