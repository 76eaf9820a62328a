"""testing.coop_sum (cooperative launch) and testing.pdl_chain (two launches, PDL-synchronised)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _cases import COOP_SUM, PDL_CHAIN, CoopSumCase, PdlChainCase, launch_rounds  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n", [0, 1, 1000, 1 << 20])
def test_coop_sum(rt, rng, require, n):
    require(COOP_SUM)
    case = CoopSumCase(rng, n, rt.spec(COOP_SUM))
    case.poison()
    assert case.launch(rt) is None
    case.check(f"seed={rng.seed}")


def test_coop_sum_repeated(rt, rng, require):
    """Back-to-back launches (no sync, new data each time): no state carried between launches."""
    require(COOP_SUM)
    cases = [CoopSumCase(rng, n, rt.spec(COOP_SUM)) for n in (4096, 777_777, 33, 1 << 20)]
    launch_rounds(rt, cases, 3)


@pytest.mark.parametrize("n", [0, 1, 4097, 1 << 22])
def test_pdl_chain(rt, rng, require, n):
    require(PDL_CHAIN)
    case = PdlChainCase(rng, n)
    case.poison()
    assert case.launch(rt) is None
    case.check(f"seed={rng.seed}")


def test_pdl_chain_back_to_back(rt, rng, require):
    """20 chains queued without a sync: the second kernel of each must see its first's writes."""
    require(PDL_CHAIN)
    cases = [PdlChainCase(rng, n) for n in [1 << 22, 4097, 1 << 20, 1] * 5]
    for c in cases:
        c.poison()
        c.launch(rt)
    for i, c in enumerate(cases):
        c.check(f"chain {i} of {len(cases)}")
