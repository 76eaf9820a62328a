"""GPU tests of the issue-12 round-2 candidate ``moe._aux_fi_candidate`` (8-block clusters to
workspace rows through distributed shared memory, then a PDL-chained column sum: no grid
barrier), bit-exact against ``moe_ref`` and against the shipped ``moe.aux_fi``.

Through the op with the switch on (``TILEBIN_CANDIDATE_AUX_FI``: the op module's constant
monkeypatched, the op's plan memo cleared before and after), under several SM counts (so 1 to
33 clusters): top-k indices made like tile_kernels' tests (4001-style EP-rank shapes: tokens
{0, 1, 7, 4001, 16001} x 8 EP ranks, experts {8, 32, 64, 256}, top-k {1, 2, 6, 8, 9}).  And
the kernel launched directly (checked ``runtime.launch``, both variants, poisoned outputs) on
random indices with -1 and out-of-range entries, at 1 to ``max_rows`` clusters.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed, topk_idx
from moe_ref import stats as ref

CAND = "moe._aux_fi_candidate"
EP_RANKS = 8
TOKENS = (0, 1, 7, 4001, 16001)
EXPERTS = (8, 32, 64, 256)
TOPKS = (1, 2, 6, 8, 9)
GRID = list(itertools.product(TOKENS, EXPERTS, TOPKS))


def _grid_id(case) -> str:
    return "t{}-e{}-k{}".format(*case)


@pytest.fixture(scope="module")
def moe(require):
    require(CAND)
    return load_moe_ops(require, ("aux_fi",), "ops/moe/_stats.py")


@pytest.fixture
def aux_switch(monkeypatch):
    """aux_fi with TILEBIN_CANDIDATE_AUX_FI on (plans rebuilt), restored after."""
    from tilebin.ops.moe import _stats

    _stats.AUX_FI.memo.clear()
    monkeypatch.setattr(_stats, "_AUX_FI_CANDIDATE", True)
    yield
    monkeypatch.undo()
    _stats.AUX_FI.memo.clear()


@pytest.mark.parametrize("case", GRID, ids=_grid_id)
def test_aux_fi_op_with_candidate(moe, sm_counts, case):
    """The op with the switch on (the candidate above 4096 indices) equals moe_ref and the shipped op."""
    from tilebin.ops.moe import _stats

    tokens, experts, topk = case
    seed("cand_aux_fi_r2", case)
    idx = topk_idx(tokens, topk, experts, EP_RANKS)
    counts, set_num_sms = sm_counts
    for aux_topk in dict.fromkeys((1, topk)):
        what = f"aux_fi {tuple(idx.shape)} E={experts} A={aux_topk}"
        want = ref.aux_fi(idx, experts, aux_topk)
        _stats.AUX_FI.memo.clear()
        shipped = moe.aux_fi(idx, experts, aux_topk)  # switch off: the shipped kernels
        assert_bits_equal(shipped, want, f"shipped {what}")
        _stats.AUX_FI.memo.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_stats, "_AUX_FI_CANDIDATE", True)
            for sms in counts:
                set_num_sms(sms)
                poison_cache(1 << 20)
                got = moe.aux_fi(idx, experts, aux_topk)
                assert_bits_equal(got, want, f"candidate {what} num_sms={sms}")
                assert_bits_equal(got, shipped, f"candidate vs shipped {what} num_sms={sms}")
            set_num_sms(0)
            _stats.AUX_FI.memo.clear()
    _stats.AUX_FI.memo.clear()


def test_aux_fi_op_switch_keeps_other_paths(moe, aux_switch):
    """Switch on: decode sizes (<= 4096 indices) and more than 4096 experts keep the shipped kernels."""
    seed("cand_aux_fi_r2_paths")
    for idx, experts in ((torch.randint(-1, 9, (7, 6), dtype=torch.int64, device="cuda"), 8),
                         (torch.randint(-1, 5001, (300, 9), dtype=torch.int64, device="cuda"), 5000)):
        assert_bits_equal(moe.aux_fi(idx, experts, 3), ref.aux_fi(idx, experts, 3),
                          f"aux_fi (switch on) {tuple(idx.shape)} E={experts}")


@pytest.mark.parametrize("experts", (8, 32, 256, 4096))
def test_aux_fi_candidate_kernel(rt, moe, experts):
    """Direct launches: both variants, 1 to max_rows clusters, -1 and out-of-range entries skipped."""
    seed("cand_aux_fi_r2_kernel", experts)
    for tokens, topk in ((4097, 1), (20011, 6), (16001 * 8, 9)):
        idx = torch.randint(-1, experts + 1, (tokens, topk), dtype=torch.int64, device="cuda")
        want = ref.aux_fi(idx, experts, topk)
        for unroll, rows in itertools.product((4, 8), (1, 3, 33, 64)):
            out = torch.full((experts,), float("nan"), dtype=torch.float32, device="cuda")
            workspace = torch.full((rows, experts), -123456789, dtype=torch.int32, device="cuda")
            rt.launch(CAND, idx, out, workspace, topk, unroll=unroll)
            assert_bits_equal(out, want, f"{CAND} unroll={unroll} rows={rows} {tuple(idx.shape)} E={experts}")
