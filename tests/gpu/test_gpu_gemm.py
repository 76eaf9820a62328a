"""testing.gemm_nt: c = a @ b.T in bf16 (fp32 accumulate), TMA + >48 KB smem, runtime m."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _cases import GEMM, GEMM_VARIANTS, GemmCase, launch_rounds  # noqa: E402

pytestmark = pytest.mark.gpu
NK_IDS = [f"n{n}_k{k}" for n, k in GEMM_VARIANTS]


@pytest.fixture(autouse=True)
def _need(require):
    require(GEMM)


@pytest.mark.parametrize("nk", GEMM_VARIANTS, ids=NK_IDS)
@pytest.mark.parametrize("m", [1, 127, 1000, 4096])
def test_gemm_matches_float64(rt, rng, m, nk):
    case = GemmCase(rng, m, *nk)
    case.poison()
    assert case.launch(rt) is None
    case.check(f"seed={rng.seed}")


@pytest.mark.parametrize("nk", GEMM_VARIANTS, ids=NK_IDS)
def test_gemm_pinned_variant(rt, rng, nk):
    case = GemmCase(rng, 64, *nk, pin=True)
    case.poison()
    case.launch(rt)
    case.check("with n, k pinned")


def test_gemm_m_changes_between_calls(rt, rng):
    """Same variant, m varying call to call with no sync (TMA descriptors depend on m and the pointers)."""
    cases = [GemmCase(rng, m, 1024, 1024) for m in (5, 300, 128, 1, 129, 2048)]
    launch_rounds(rt, cases, 2)


def test_gemm_same_shape_new_pointers(rt, rng):
    """Same shape, different tensors each call: a descriptor cache keyed only by shape would be wrong."""
    cases = [GemmCase(rng, 256, 1024, 1024) for _ in range(4)]
    for c in cases:
        c.poison()
        c.launch(rt)
    for i, c in enumerate(cases):
        c.check(f"tensor set {i}")


def test_gemm_m_zero(rt, rng):
    """m = 0 (no tokens) is a valid call that writes nothing and must not raise."""
    case = GemmCase(rng, 0, 1024, 1024)
    case.launch(rt)
    torch.cuda.synchronize()
    assert case.c.shape == (0, 1024)
