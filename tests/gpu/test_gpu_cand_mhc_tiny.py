"""GPU tests of the issue-9 speed candidates of the two tiny mHC mix kernels, run over ("current",
"candidate") kernels by patching the op module's kernel constant (what the
``TILEBIN_CANDIDATE_*`` switch sets at import):

* ``mhc_pre_split_mixes`` forward: ``mhc.pre_split_mixes_fwd`` / ``mhc._pre_split_mixes_fwd_candidate``
  (``modeling.mhc.ops.pre_split_mixes._FWD_KERNEL``), mhc_mult 2, 4 and 8;
* ``mhc_head_compute_mix`` forward: ``mhc.head_compute_mix_fwd`` / ``mhc._head_compute_mix_fwd_candidate``
  (``modeling.mhc.ops.head_compute_mix._FWD_KERNEL``), mhc_mult 1 to 8.

Each kernel is checked against the ``mhc_ref`` references as the shipped kernels' tests do (the
comb mixes bit for bit against fp32 torch, the sigmoids within 1e-6 of float64), and the
candidate against the current kernel bit for bit, on random inputs and on inputs that take the
reciprocal's slow path (``z`` below -87, +-inf, NaN, huge, zero and denormal values, next to
ordinary ones in the same token and warp).  Outputs are poisoned first (0xFF in the allocator's
free memory), so an unwritten element shows up.  Sizes: 0 tokens, decode sizes 1-128, odd counts
around the block sizes (31/32/33, 127/128/129), the benchmark shapes (4096 and 8192 tokens) and
larger ones.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import poison_cache, seed
from mhc_ref import head as href
from mhc_ref import split_mixes as mref
from mhc_ref.close import assert_fp32_close

SPLIT = ("mhc.pre_split_mixes_fwd", "mhc._pre_split_mixes_fwd_candidate")
HEAD = ("mhc.head_compute_mix_fwd", "mhc._head_compute_mix_fwd_candidate")
IDS = ("current", "candidate")
# leading dims: 0 tokens, decode sizes, odd counts around 32 / 128 tokens per block, the bench, larger
LEADS = ([(0,), (2, 0), (1,), (1, 1)] + [(n,) for n in (2, 3, 7, 16, 31, 32, 33, 64, 100, 127, 128, 129)]
         + [(1, 4096), (1, 8192), (2, 4097), (3, 1111), (20000,)])
SPLIT_CASES = [(4, lead) for lead in LEADS] + [(m, lead) for m in (2, 8) for lead in ((1,), (33,), (2, 999), (8192,))]
HEAD_CASES = [(4, lead) for lead in LEADS] + [(m, lead) for m in (1, 2, 3, 5, 6, 7, 8)
                                              for lead in ((1,), (7, 3), (1, 513), (4096,), (2, 8192))]
# values whose sigmoid's 1 / (1 + exp(-z)) leaves nvcc's fast path (|1 + exp(-z)| >= 2**126, inf, NaN) and others
SPECIAL = [-1e30, -200.0, -88.8, -88.0, -87.5, -87.4, -87.0, -86.0, -50.0, float("-inf"), float("inf"), float("nan"),
           0.0, -0.0, 1e-40, -1e-40, 1e-30, 3.0, 88.0, 200.0, 1e30]


def _ids(cases):
    return [f"m{m}-{'x'.join(map(str, lead)) or 'scalar'}" for m, lead in cases]


def _switch(request, require, monkeypatch, module: str):
    """Require the kernel ``request.param`` and make the op module ``module`` launch it."""
    import importlib

    require(request.param)
    mod = importlib.import_module(f"tilebin.modeling.mhc.ops.{module}")
    monkeypatch.setattr(mod, "_FWD_KERNEL", request.param)
    return mod


@pytest.fixture(params=SPLIT, ids=IDS)
def split_op(request, require, monkeypatch):
    return _switch(request, require, monkeypatch, "pre_split_mixes")


@pytest.fixture(params=HEAD, ids=IDS)
def head_op(request, require, monkeypatch):
    return _switch(request, require, monkeypatch, "head_compute_mix")


def _special(shape) -> torch.Tensor:
    """Random normal values with every SPECIAL value planted at random places (a few per warp)."""
    x = torch.randn(shape, device="cuda")
    flat = x.view(-1)
    if flat.numel():
        vals = torch.tensor(SPECIAL, device="cuda")
        where = torch.randint(0, flat.numel(), (max(flat.numel() // 7, 1),), device="cuda")
        flat[where] = vals[torch.randint(0, len(SPECIAL), where.shape, device="cuda")]
    return x


def _both(mod, kernels, monkeypatch, call):
    """``call()`` with each kernel of ``kernels`` launched by the op module ``mod`` (poisoned first)."""
    outs = []
    for name in kernels:
        monkeypatch.setattr(mod, "_FWD_KERNEL", name)
        poison_cache(64 << 20)
        with torch.no_grad():
            outs.append(call())
    return outs


# ---------------------------------------------------------------- split mixes
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
        what = f"split_mixes {split_op._FWD_KERNEL} {lead} M={m} post_mult={post_mult} pre_eps={pre_eps}"
        p64, q64, _ = mref.split_mixes(x, s, b, m, post_mult, pre_eps)
        _, _, c32 = mref.split_mixes(x, s, b, m, post_mult, pre_eps, torch.float32)
        assert [tuple(o.shape) for o in (pre, post, comb)] == [(*lead, m, 1), (*lead, m, 1), (*lead, m, m)]
        assert_bits_equal(comb, c32, what + " comb")
        for got, want, tol in ((pre, p64, 1e-6), (post, q64, 1e-6 * max(1.0, abs(post_mult)))):
            err = (got.double() - want).abs()
            assert bool((err <= tol).all()), f"{what}: max error {float(err.max()) if err.numel() else 0.0}"


@pytest.mark.parametrize("m,lead", SPLIT_CASES, ids=_ids(SPLIT_CASES))
@pytest.mark.parametrize("inputs", ("random", "special"))
def test_split_mixes_candidate_bits(require, monkeypatch, m, lead, inputs):
    """The candidate's pre, post and comb equal the current kernel's bit for bit."""
    for name in SPLIT:
        require(name)
    from tilebin.modeling.mhc.ops import pre_split_mixes as mod

    seed("cand-split-bits", m, lead, inputs)
    k = m * (m + 2)
    make = _special if inputs == "special" else (lambda shape: torch.randn(shape, device="cuda"))
    x = make((*lead, k))
    s = torch.tensor([1.0, 1.0, 1.0], device="cuda") if inputs == "special" else torch.randn(3, device="cuda")
    b = torch.zeros(k, device="cuda") if inputs == "special" else torch.randn(k, device="cuda")
    cur, cand = _both(mod, SPLIT, monkeypatch, lambda: mod.mhc_pre_split_mixes(x, s, b, m, 2.0, 1e-6))
    for got, want, what in zip(cand, cur, ("pre", "post", "comb")):
        assert_bits_equal(got, want, f"split_mixes candidate {inputs} {lead} M={m} {what}")


# ---------------------------------------------------------------- head mix
@pytest.mark.parametrize("m,lead", HEAD_CASES, ids=_ids(HEAD_CASES))
def test_head_compute_mix_fwd(head_op, m, lead):
    """The forward against the float64 reference (the shipped kernel's test bound)."""
    seed("cand-head", m, lead)
    a = torch.rand(*lead, m, device="cuda") * 8.0 - 4.0
    s = torch.rand(1, device="cuda") * 1.5 + 0.5
    b = torch.rand(m, device="cuda") * 2.0 - 1.0
    poison_cache(8 * a.numel() * 4 + (64 << 20))
    with torch.no_grad():
        out = head_op.mhc_head_compute_mix(a, s, b, 1e-6)
    ref = href.head_mix(a, s, b, 1e-6)
    assert out.shape == a.shape and out.dtype == torch.float32
    assert_fp32_close(out, ref, ref.abs() + (a * s).abs() + b.abs(), f"head {head_op._FWD_KERNEL} {lead} m{m}",
                      rel=2.0**-20)


@pytest.mark.parametrize("m,lead", HEAD_CASES, ids=_ids(HEAD_CASES))
@pytest.mark.parametrize("inputs", ("random", "special"))
def test_head_compute_mix_candidate_bits(require, monkeypatch, m, lead, inputs):
    """The candidate's output equals the current kernel's bit for bit."""
    for name in HEAD:
        require(name)
    from tilebin.modeling.mhc.ops import head_compute_mix as mod

    seed("cand-head-bits", m, lead, inputs)
    if inputs == "special":
        a, s, b = _special((*lead, m)), torch.ones(1, device="cuda"), torch.zeros(m, device="cuda")
    else:
        a, s, b = torch.randn(*lead, m, device="cuda") * 4, torch.randn(1, device="cuda"), torch.randn(m, device="cuda")
    cur, cand = _both(mod, HEAD, monkeypatch, lambda: mod.mhc_head_compute_mix(a, s, b, 1e-6))
    assert_bits_equal(cand, cur, f"head candidate {inputs} {lead} m{m}")


def test_head_compute_mix_strided_input(head_op):
    """A strided ``input_mix`` view (the first M columns of wider mixes) is read correctly."""
    seed("cand-head-strided")
    wide = torch.randn(3, 257, 24, device="cuda")
    a, s, b = wide[..., :4], torch.tensor([0.8], device="cuda"), torch.randn(4, device="cuda")
    poison_cache(64 << 20)
    with torch.no_grad():
        out = head_op.mhc_head_compute_mix(a, s, b, 1e-6)
    ref = href.head_mix(a, s, b, 1e-6)
    assert_fp32_close(out, ref, ref.abs() + (a * s).abs() + b.abs(), "head strided", rel=2.0**-20)
