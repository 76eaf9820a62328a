"""GPU tests of the mHC speed candidates (issue 9) against the shipped ops, bit for bit.

Each candidate kernel (``kernels/mhc/*_candidate.py``, every variant: ``POST``, ``PRE_APPLY_MIX``,
``EXPAND``, ``RECOMPUTE``) is launched directly, as
``bench/bench_mhc.py --candidate`` launches it (``runtime.unchecked_launcher`` with the
arguments and variant key the shipped op passes its kernel), into an output pre-filled with NaN
(an element it forgot to write stays NaN), and compared with ``torch.equal`` to the shipped op's
result on the same fresh random inputs, the op called with ``out=`` (also NaN-filled) and
without.  Shapes: leading dims ``(1, n1)`` with n1 in {1, 13, 4096}, hidden in {1280, 4096,
7168, 4160} (4160 = 65 x 64: a last 128-vector chunk of 8 vectors), mhc_mult 4, 2 and 8 (and 3
for expand, whose stream count is a run-time value).  Multilayer recompute (which has no ``out=``;
every tensor of its lists is an output or an input) runs 2 layers with 2 and with 1 completed
layer (``num_post`` = ``num_layers`` and ``num_layers - 1``), the written lists NaN-filled for both.
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import seed

BF16 = torch.bfloat16
N1 = (1, 13, 4096)
HIDDEN = (1280, 4096, 7168, 4160)
CASES = [(m, n1, h, given) for m in (4, 2, 8) for n1 in N1 for h in HIDDEN for given in (False, True)]
IDS = [f"m{m}-n{n1}-h{h}-{'out' if given else 'alloc'}" for m, n1, h, given in CASES]
EXPAND_CASES = CASES + [(3, n1, h, False) for n1 in (1, 13) for h in HIDDEN]
EXPAND_IDS = IDS + [f"m3-n{n1}-h{h}-alloc" for n1 in (1, 13) for h in HIDDEN]
# the candidate kernels of each op (bench/bench_mhc.py CANDIDATES)
POST = ("mhc._post_fwd_candidate", "mhc._post_fwd_candidate_cp", "mhc._post_fwd_candidate_cpwide",
        "mhc._post_fwd_candidate_persist")
PRE_APPLY_MIX = ("mhc._pre_apply_mix_fwd_candidate", "mhc._pre_apply_mix_fwd_candidate_cp",
                 "mhc._pre_apply_mix_fwd_candidate_cpwide", "mhc._pre_apply_mix_fwd_candidate_persist")
EXPAND = ("mhc._expand_fwd_candidate_persist8", "mhc._expand_fwd_candidate_persist16")
RECOMPUTE = ("mhc._multilayer_recompute_candidate_cp", "mhc._multilayer_recompute_candidate_persist")


def _bf16(*shape) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(BF16)


def _nan_like(shape) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=BF16, device="cuda")


def _shipped(fn, shape, given: bool) -> torch.Tensor:
    """The shipped op's output: ``fn(out)`` with a NaN-filled ``out`` when ``given``, else ``fn(None)``."""
    if not given:
        return fn(None)
    out = _nan_like(shape)
    got = fn(out)
    assert got.data_ptr() == out.data_ptr()
    return out


@pytest.mark.parametrize("kernel", POST)
@pytest.mark.parametrize("m, n1, h, given", CASES, ids=IDS)
def test_post_fwd_candidate(rt, require, kernel, m, n1, h, given):
    from tilebin.modeling.mhc import ops

    require(kernel)
    seed("cand_mhc_post", m, n1, h, given)
    x, r = _bf16(1, n1, h), _bf16(1, n1, m, h)
    post = torch.randn(1, n1, m, 1, device="cuda") * 2
    comb = torch.randn(1, n1, m, m, device="cuda")
    want = _shipped(lambda out: ops.mhc_post_fwd(x, r, post, comb, out=out), r.shape, given)
    got = _nan_like(r.shape)
    rt.unchecked_launcher(kernel, mhc=m)(
        x.view(-1, h), r.view(-1, m, h), post.view(-1, m), comb.view(-1, m, m), got.view(-1, m, h))
    assert not want.isnan().any(), "the shipped op left NaN"
    assert torch.equal(got, want), f"{kernel} differs at m{m} n1 {n1} h{h}"


@pytest.mark.parametrize("kernel", PRE_APPLY_MIX)
@pytest.mark.parametrize("m, n1, h, given", CASES, ids=IDS)
def test_pre_apply_mix_fwd_candidate(rt, require, kernel, m, n1, h, given):
    from tilebin.modeling.mhc import ops

    require(kernel)
    seed("cand_mhc_pre_apply_mix", m, n1, h, given)
    r = _bf16(1, n1, m, h)
    mix = torch.randn(1, n1, m, 1, device="cuda")
    want = _shipped(lambda out: ops.mhc_pre_apply_mix(r, mix, out=out), (1, n1, h), given)
    got = _nan_like((1, n1, h))
    rt.unchecked_launcher(kernel, mhc=m)(
        r.view(-1, m, h), mix.view(-1, m), got.view(-1, h))
    assert not want.isnan().any(), "the shipped op left NaN"
    assert torch.equal(got, want), f"{kernel} differs at m{m} n1 {n1} h{h}"


@pytest.mark.parametrize("kernel", EXPAND)
@pytest.mark.parametrize("m, n1, h, given", EXPAND_CASES, ids=EXPAND_IDS)
def test_expand_fwd_candidate(rt, require, kernel, m, n1, h, given):
    from tilebin.modeling.mhc import ops

    require(kernel)
    seed("cand_mhc_expand", m, n1, h, given)
    x = _bf16(1, n1, h)
    want = _shipped(lambda out: ops.expand_to_mhc(x, m, out=out), (1, n1, m, h), given)
    got = _nan_like((1, n1, m, h))
    rt.unchecked_launcher(kernel)(x.view(-1, h), got.view(-1, m, h))
    assert not want.isnan().any(), "the shipped op left NaN"
    assert torch.equal(got, want), f"{kernel} differs at m{m} n1 {n1} h{h}"


RECOMPUTE_CASES = [(m, n1, h, post) for m in (4, 2, 8) for n1 in N1 for h in HIDDEN for post in (2, 1)]
RECOMPUTE_IDS = [f"m{m}-n{n1}-h{h}-post{post}" for m, n1, h, post in RECOMPUTE_CASES]


@pytest.mark.parametrize("kernel", RECOMPUTE)
@pytest.mark.parametrize("m, n1, h, post", RECOMPUTE_CASES, ids=RECOMPUTE_IDS)
def test_multilayer_recompute_candidate(rt, require, kernel, m, n1, h, post):
    from tilebin.modeling.mhc import ops

    require(kernel)
    seed("cand_mhc_recompute", m, n1, h, post)
    layers = 2
    r0 = _bf16(1, n1, m, h)
    pre = [torch.rand(1, n1, m, 1, device="cuda") for _ in range(layers)]
    outs = [_bf16(1, n1, h) for _ in range(post)]
    posts = [torch.randn(1, n1, m, 1, device="cuda") * 2 for _ in range(post)]
    combs = [torch.rand(1, n1, m, m, device="cuda") for _ in range(post)]

    def written():
        return [_nan_like((1, n1, h)) for _ in range(layers)], [_nan_like((1, n1, m, h)) for _ in range(post)]

    want_in, want_res = written()
    ops.mhc_multilayer_recompute(r0, pre, outs, posts, combs, want_in, want_res)
    got_in, got_res = written()
    rows = (pre, got_in, outs, posts, combs, got_res)
    table = []
    for row in rows:
        table += [t.data_ptr() for t in row] + [0] * (layers - len(row))
    ptrs = torch.tensor(table, dtype=torch.int64, device="cuda").view(6, layers)
    rt.unchecked_launcher(kernel, mhc_mult=m)(r0.view(-1, m, h), ptrs, post)
    for name, got, want in (("layer_input", got_in, want_in), ("residual", got_res, want_res)):
        for i, (g, w) in enumerate(zip(got, want)):
            assert not w.isnan().any(), f"the shipped op left NaN in {name}[{i}]"
            assert torch.equal(g, w), f"{kernel}: {name}[{i}] differs at m{m} n1 {n1} h{h}"
