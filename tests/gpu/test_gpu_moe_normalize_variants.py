"""``moe.normalize_weight``'s variants through the op, bit for bit against ``moe_ref.stats`` and against
the run-time-top-k variant launched directly on the same inputs: the top-k-specialised variants (2, 6,
9: ``KernelDecl.specialise``), ``moe.normalize_weight_lanes`` (top-k 8) and the run-time one (others).
Magnitudes from 2**-60 to 2**60, zeros, an all-zero row; outputs over a poisoned cache."""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed
from moe_ref import stats as ref


@pytest.fixture
def moe(require):
    require("moe.normalize_weight_lanes")
    return load_moe_ops(require, ("normalize_weight",), "ops/moe/_stats.py")


def _weights(rows: int, topk: int) -> torch.Tensor:
    w = torch.rand((rows, topk), dtype=torch.float32, device="cuda")
    if rows >= 8:
        w *= torch.exp2(torch.randint(-60, 61, (rows, 1), device="cuda").float())
        w[1::7, 0] = 0
        w[3] = 0
    return w


@pytest.mark.parametrize("topk", [1, 2, 3, 6, 8, 9, 16])
@pytest.mark.parametrize("rows", [0, 1, 5, 33, 4001, 32008, 64009])
def test_every_variant_matches_the_reference_and_the_run_time_one(moe, rows, topk):
    from tilebin import runtime

    seed("normalize_weight_variants", rows, topk)
    w = _weights(rows, topk)
    want_den, want_norm = ref.normalize_weight(w)
    poison_cache(w.numel() * 8)
    den, norm = moe.normalize_weight(w)
    assert tuple(den.shape) == (rows,) and tuple(norm.shape) == (rows, topk) and norm.is_contiguous()
    assert_bits_equal(den, want_den, f"normalize_weight({rows} x {topk}) denominator")
    assert_bits_equal(norm, want_norm, f"normalize_weight({rows} x {topk}) normalized")
    if rows:
        den0 = torch.full_like(den, float("nan"))
        norm0 = torch.full_like(norm, float("nan"))
        runtime.unchecked_launcher("moe.normalize_weight")(w, den0, norm0)  # the run-time top-k variant
        assert_bits_equal(den, den0, f"{rows} x {topk}: op vs run-time variant, denominator")
        assert_bits_equal(norm, norm0, f"{rows} x {topk}: op vs run-time variant, normalized")
