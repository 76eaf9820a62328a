"""``moe._normalize_weight_lanes_candidate`` (issue 12, a row per top-k lanes) against the shipped
``moe.normalize_weight`` (its top-k-specialised variants) and ``moe_ref.stats``, bit for bit: through
the op with ``TILEBIN_CANDIDATE_NORMALIZE_WEIGHT``'s flag forced on, then off, on the same inputs;
magnitudes from 2**-60 to 2**60, zeros, an all-zero row; outputs over a poisoned cache."""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed
from moe_ref import stats as ref


@pytest.fixture
def moe(require):
    require("moe._normalize_weight_lanes_candidate")
    return load_moe_ops(require, ("normalize_weight",), "ops/moe/_stats.py")


def _weights(rows: int, topk: int) -> torch.Tensor:
    w = torch.rand((rows, topk), dtype=torch.float32, device="cuda")
    if rows >= 8:
        w *= torch.exp2(torch.randint(-60, 61, (rows, 1), device="cuda").float())
        w[1::7, 0] = 0
        w[3] = 0
    return w


def _call(moe, monkeypatch, w, lanes: bool):
    from tilebin.ops.moe import _stats

    monkeypatch.setattr(_stats, "_NORMALIZE_LANES", lanes)
    monkeypatch.setattr(_stats.NORMALIZE_WEIGHT, "memo", {})  # the plan is rebuilt with the flag
    poison_cache(w.numel() * 8)
    return moe.normalize_weight(w)


@pytest.mark.parametrize("topk", [2, 4, 8, 16])
@pytest.mark.parametrize("rows", [0, 1, 5, 33, 4001, 32008, 64009])
def test_lanes_candidate_matches_shipped_and_reference(moe, monkeypatch, rows, topk):
    seed("normalize_weight_lanes", rows, topk)
    w = _weights(rows, topk)
    want_den, want_norm = ref.normalize_weight(w)
    den, norm = _call(moe, monkeypatch, w, lanes=True)
    assert tuple(den.shape) == (rows,) and tuple(norm.shape) == (rows, topk) and norm.is_contiguous()
    assert_bits_equal(den, want_den, f"candidate {rows} x {topk} denominator")
    assert_bits_equal(norm, want_norm, f"candidate {rows} x {topk} normalized")
    den0, norm0 = _call(moe, monkeypatch, w, lanes=False)
    assert_bits_equal(den, den0, f"candidate vs shipped {rows} x {topk} denominator")
    assert_bits_equal(norm, norm0, f"candidate vs shipped {rows} x {topk} normalized")
