"""GPU tests of ``mhc_pre_split_mixes``'s forward kernel ``mhc.pre_split_mixes_fwd`` (one warp per
block, interleaved branch-free reciprocals with a per-thread slow-path fallback), mhc_mult 2, 4
and 8.

The kernel is checked against the ``mhc_ref`` references as the other split-mixes tests do (the
comb mixes bit for bit against fp32 torch, the sigmoids within 1e-6 of float64), on random inputs
and on inputs that take the reciprocal's slow path (``z`` below -87, +-inf, NaN, huge, zero and
denormal values, next to ordinary ones in the same token and warp; NaN exactly where the
reference has NaN).  Outputs are poisoned first (0xFF in the allocator's free memory), so an
unwritten element shows up.  Sizes: 0 tokens, decode sizes 1-128, odd counts around the block
sizes (31/32/33, 127/128/129), the benchmark shapes (4096 and 8192 tokens) and larger ones.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import poison_cache, seed
from mhc_ref import split_mixes as mref

# leading dims: 0 tokens, decode sizes, odd counts around 32 / 128 tokens per block, the bench, larger
LEADS = ([(0,), (2, 0), (1,), (1, 1)] + [(n,) for n in (2, 3, 7, 16, 31, 32, 33, 64, 100, 127, 128, 129)]
         + [(1, 4096), (1, 8192), (2, 4097), (3, 1111), (20000,)])
SPLIT_CASES = [(4, lead) for lead in LEADS] + [(m, lead) for m in (2, 8) for lead in ((1,), (33,), (2, 999), (8192,))]
# values whose sigmoid's 1 / (1 + exp(-z)) leaves nvcc's fast path (|1 + exp(-z)| >= 2**126, inf, NaN) and others
SPECIAL = [-1e30, -200.0, -88.8, -88.0, -87.5, -87.4, -87.0, -86.0, -50.0, float("-inf"), float("inf"), float("nan"),
           0.0, -0.0, 1e-40, -1e-40, 1e-30, 3.0, 88.0, 200.0, 1e30]


def _ids(cases):
    return [f"m{m}-{'x'.join(map(str, lead)) or 'scalar'}" for m, lead in cases]


@pytest.fixture
def split_op(require):
    """The op module (it launches ``mhc.pre_split_mixes_fwd``)."""
    require("mhc.pre_split_mixes_fwd")
    from tilebin.modeling.mhc.ops import pre_split_mixes

    return pre_split_mixes


def _special(shape) -> torch.Tensor:
    """Random normal values with every SPECIAL value planted at random places (a few per warp)."""
    x = torch.randn(shape, device="cuda")
    flat = x.view(-1)
    if flat.numel():
        vals = torch.tensor(SPECIAL, device="cuda")
        where = torch.randint(0, flat.numel(), (max(flat.numel() // 7, 1),), device="cuda")
        flat[where] = vals[torch.randint(0, len(SPECIAL), where.shape, device="cuda")]
    return x


def _check_sigmoids(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    """``got`` within ``tol`` of the float64 ``want``, NaN exactly where ``want`` is NaN."""
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"{what}: NaN positions differ from the reference"
    err = (got.double() - want).abs().masked_fill(nan, 0.0)
    assert bool((err <= tol).all()), f"{what}: max error {float(err.max()) if err.numel() else 0.0}"


@pytest.mark.parametrize("m,lead", SPLIT_CASES, ids=_ids(SPLIT_CASES))
def test_split_mixes_fwd(split_op, m, lead):
    """pre / post / comb against the references (comb bit for bit, the sigmoids within 1e-6)."""
    seed("cand-split", m, lead)
    k = m * (m + 2)
    x, s, b = torch.randn((*lead, k), device="cuda"), torch.randn(3, device="cuda"), torch.randn(k, device="cuda")
    for post_mult, pre_eps in ((2.0, 1e-6), (0.0, 0.0), (-1.5, 0.25)):
        poison_cache(8 * x.numel() * 4 + (64 << 20))
        with torch.no_grad():
            pre, post, comb = split_op.mhc_pre_split_mixes(x, s, b, m, post_mult, pre_eps)
        what = f"split_mixes {lead} M={m} post_mult={post_mult} pre_eps={pre_eps}"
        p64, q64, _ = mref.split_mixes(x, s, b, m, post_mult, pre_eps)
        _, _, c32 = mref.split_mixes(x, s, b, m, post_mult, pre_eps, torch.float32)
        assert [tuple(o.shape) for o in (pre, post, comb)] == [(*lead, m, 1), (*lead, m, 1), (*lead, m, m)]
        assert_bits_equal(comb, c32, what + " comb")
        for got, want, tol in ((pre, p64, 1e-6), (post, q64, 1e-6 * max(1.0, abs(post_mult)))):
            err = (got.double() - want).abs()
            assert bool((err <= tol).all()), f"{what}: max error {float(err.max()) if err.numel() else 0.0}"


@pytest.mark.parametrize("m,lead", SPLIT_CASES, ids=_ids(SPLIT_CASES))
@pytest.mark.parametrize("inputs", ("random", "special"))
def test_split_mixes_fwd_slow_path(split_op, m, lead, inputs):
    """Random inputs and the reciprocal's slow-path values (scale 1, base 0: ``z`` is the input):
    comb bit for bit against fp32 torch, the sigmoids within 1e-6 of float64, NaN exactly where
    the references have NaN (NaN bits not compared: the device and torch write different ones)."""
    seed("cand-split-bits", m, lead, inputs)
    k = m * (m + 2)
    make = _special if inputs == "special" else (lambda shape: torch.randn(shape, device="cuda"))
    x = make((*lead, k))
    s = torch.tensor([1.0, 1.0, 1.0], device="cuda") if inputs == "special" else torch.randn(3, device="cuda")
    b = torch.zeros(k, device="cuda") if inputs == "special" else torch.randn(k, device="cuda")
    poison_cache(8 * x.numel() * 4 + (64 << 20))
    with torch.no_grad():
        pre, post, comb = split_op.mhc_pre_split_mixes(x, s, b, m, 2.0, 1e-6)
    what = f"split_mixes {inputs} {lead} M={m}"
    p64, q64, _ = mref.split_mixes(x, s, b, m, 2.0, 1e-6)
    _, _, c32 = mref.split_mixes(x, s, b, m, 2.0, 1e-6, torch.float32)
    _check_sigmoids(pre, p64, 1e-6, what + " pre")
    _check_sigmoids(post, q64, 2e-6, what + " post")
    nan = c32.isnan()
    assert torch.equal(comb.isnan(), nan), f"{what} comb: NaN positions differ from the reference"
    assert_bits_equal(comb.masked_fill(nan, 0.0), c32.masked_fill(nan, 0.0), what + " comb")
