"""GPU tests of ``mhc_pre_norm_fn`` and ``mhc_pre_big_fuse`` (``tilebin.modeling.mhc.ops``) against
the float64 references in ``tests/mhc_ref`` (``norm_fn``, ``big_fuse``).

tile_kernels' grid: n0 {1, 2} x n1 {1, 13, 48, 512, 1024, 4096, 8192} x hidden {1280, 2560, 4096,
7168}, mhc_mult 4, with and without norm weight, plus 0 tokens and mhc_mult 2 and 8.

* Forward: within the error of an fp32 sum of exact TF32 products: ``|out - ref| <= FWD_ERR *
  rms * sum_k |x_k fn_k|`` (FWD_ERR covers tensor-core accumulation that truncates, ~K / 8 steps
  of at most an ulp) plus ``REL_ERR * |ref|`` (the fp32 sum of squares and rsqrt), and calc_diff
  below ``FWD_DIFF``; the reference uses the same TF32-rounded fn as the kernels (the rounding is
  part of the definition).  A missing or doubled 128-column block shows as calc_diff ~ 1e-3.
* Gradients (autograd through ``MHCPreNormFn``) vs float64 autograd of the reference: the
  kernels round the mul gradient to TF32 (as tile_kernels) and the residual gradient to bf16, so
  ``|err| <= 2**-8 |ref| + BWD_ERR * (the sum of |terms|)`` per element.
* ``fuse_grad_acc``: the residual gradient added into ``grad_from_mhc_post`` in place; the
  ``main_grad`` convention of the norm-weight path.
* Big fuse: bit-exact against the unfused ops (``mhc_pre_norm_fn`` -> ``mhc_pre_split_mixes``
  -> ``sinkhorn_normalize`` -> ``mhc_pre_apply_mix``), and close to the float64 composition.

Before each op call the caching allocator's free memory is filled with 0xFF (NaN for floats), so
an element a kernel forgot to write shows up.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import poison_cache, seed
from mhc_ref import big_fuse as bref
from mhc_ref import norm_fn as ref

KERNELS = ("norm_fn_prep", "norm_fn_fwd_mul", "norm_fn_fwd_norm", "norm_fn_bwd_norm", "norm_fn_bwd_mul",
           "norm_fn_grad_reduce", "pre_big_fuse")
N0 = (1, 2)
N1 = (1, 13, 48, 512, 1024, 4096, 8192)
HIDDEN = (1280, 2560, 4096, 7168)
EPS = 1e-6
FWD_ERR = 2.0 ** -12  # per |term| sum: ~K/8 truncating fp32 accumulations of the MMA (<= 3584 * 2**-23 ~ 4e-4 worst)
BWD_ERR = 2.0 ** -9  # per |term| sum: TF32 rounding of the mul gradient (2**-11) + fp32 sums
REL_ERR = 2.0 ** -15  # relative: the fp32 sum of squares (~sqrt(K / 4) roundings, halved by rsqrt), rsqrtf, products
FWD_DIFF = 1e-8  # calc_diff of the forward vs float64 (TF32 MMA accumulation; bugs give >= 1e-4)


@pytest.fixture(scope="module")
def ops(require):
    for name in KERNELS:
        require(f"mhc.{name}")
    from tilebin.modeling.mhc.ops import norm_fn, pre_big_fuse

    return norm_fn, pre_big_fuse


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """tile_kernels' similarity measure: 1 - 2<x, y> / (|x|^2 + |y|^2), in float64."""
    x, y = x.double(), y.double()
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0 else 1.0 - 2.0 * float((x * y).sum()) / den


def assert_within(got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, what: str,
                  max_diff: float | None = None) -> None:
    """``|got - want| <= bound`` elementwise (no NaN), and calc_diff below ``max_diff``."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    if not got.numel():
        return
    g = got.double()
    err = (g - want).abs()
    bad = ~(err <= bound)
    if int(bad.sum()):
        i = int(torch.nan_to_num(err - bound, nan=1e300).argmax())
        at = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), err.shape))
        raise AssertionError(f"{what}: {int(torch.isnan(g).sum())} NaN, {int(bad.sum())}/{got.numel()} outside the "
                             f"bound; worst at {at}: got {g[at].item()!r}, want {want[at].item()!r}, "
                             f"bound {bound[at].item():.3e}")
    if max_diff is not None:
        diff = calc_diff(g, want)
        assert diff < max_diff, f"{what}: calc_diff {diff:.3e} (limit {max_diff:.0e})"


def _inputs(n0, n1, hidden, m=4, weight=False):
    res = torch.randn(n0, n1, m, hidden, device="cuda").bfloat16()
    k = m * hidden
    fn = torch.randn(m * (m + 2), k, device="cuda") * k ** -0.5
    w = (1 + 0.25 * torch.randn(k, device="cuda")) if weight else None
    return res, fn, w


def _fwd_bound(res, fn, w):
    """``FWD_ERR * rms * sum_k |x_k fn_eff[j, k]|`` + a few ulps of |ref|, float64 [n0, n1, N]."""
    m, h = res.shape[-2:]
    x = res.reshape(-1, m * h).double()
    f = ref.fn_eff(fn, w).double()
    rms = ((x * x).sum(-1, keepdim=True) / (m * h) + EPS).rsqrt()
    terms = (x.abs() @ f.abs().T) * rms
    return (FWD_ERR * terms).reshape(*res.shape[:-2], -1)


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("n1", N1)
@pytest.mark.parametrize("n0", N0)
def test_norm_fn_forward(ops, n0, n1, hidden):
    for weight in (False, True):
        seed("normfn_fwd", n0, n1, hidden, weight)
        res, fn, w = _inputs(n0, n1, hidden, weight=weight)
        poison_cache(n0 * n1 * 24 * 4 * 40)
        with torch.no_grad():
            out = ops[0].mhc_pre_norm_fn(res, fn, w, EPS)
        assert out.dtype == torch.float32 and tuple(out.shape) == (n0, n1, 24) and out.is_contiguous()
        want = ref.pre_norm_fn(res, fn, w, EPS)
        bound = _fwd_bound(res, fn, w) + REL_ERR * want.abs()
        assert_within(out, want, bound, f"mhc_pre_norm_fn({n0}x{n1}x4x{hidden}, weight={weight})", FWD_DIFF)


@pytest.mark.parametrize("n_splits", [1, 3, 16, 64])
def test_norm_fn_forward_any_split_count(ops, n_splits):
    seed("normfn_splits", n_splits)
    res, fn, _ = _inputs(1, 48, 2560)
    poison_cache(1 << 24)
    with torch.no_grad():
        out = ops[0].mhc_pre_norm_fn(res, fn, None, EPS, n_splits=n_splits)
    want = ref.pre_norm_fn(res, fn, None, EPS)
    assert_within(out, want, _fwd_bound(res, fn, None) + REL_ERR * want.abs(), f"n_splits={n_splits}", FWD_DIFF)


@pytest.mark.parametrize("m", [2, 8])
def test_norm_fn_mult_2_and_8_odd_hidden(ops, m):
    n = m * (m + 2)
    for n1, hidden in ((13, 64), (1000, 1088), (3, 8192)):
        seed("normfn_m", m, n1, hidden)
        res, fn, w = _inputs(1, n1, hidden, m=m, weight=True)
        poison_cache(1 << 24)
        with torch.no_grad():
            out = ops[0].mhc_pre_norm_fn(res, fn, w, EPS)
        assert tuple(out.shape) == (1, n1, n)
        want = ref.pre_norm_fn(res, fn, w, EPS)
        assert_within(out, want, _fwd_bound(res, fn, w) + REL_ERR * want.abs(), f"mhc_mult {m}, {n1}x{hidden}", FWD_DIFF)
    # and the backward once
    res, fn, w = _inputs(1, 300, 1088, m=m, weight=True)
    go = torch.randn(1, 300, n, device="cuda")
    leaves = [t.clone().requires_grad_(True) for t in (res, fn, w)]
    ops[0].mhc_pre_norm_fn(*leaves, EPS).backward(go)
    want = ref.pre_norm_fn_grads(res, fn, w, EPS, go)
    bounds = _bwd_bounds(res, fn, w, go)
    assert_within(leaves[0].grad, want[0], 2.0 ** -8 * want[0].abs() + bounds[0], f"mhc_mult {m} d residual")
    assert_within(leaves[1].grad, want[1], bounds[1] + 1e-30, f"mhc_mult {m} d fn")
    assert_within(leaves[2].grad, want[2], bounds[2] + 1e-30, f"mhc_mult {m} d norm_weight")


def test_norm_fn_zero_tokens(ops):
    res, fn, w = _inputs(2, 0, 1280, weight=True)
    res.requires_grad_(True)
    fn.requires_grad_(True)
    w.requires_grad_(True)
    out = ops[0].mhc_pre_norm_fn(res, fn, w, EPS)
    assert tuple(out.shape) == (2, 0, 24)
    out.sum().backward()
    assert tuple(res.grad.shape) == tuple(res.shape)
    assert torch.equal(fn.grad, torch.zeros_like(fn)) and torch.equal(w.grad, torch.zeros_like(w))


def _bwd_bounds(res, fn, w, go):
    """Elementwise error bounds of (d residual, d fn, d w): ``BWD_ERR * sum|terms|``."""
    m, h = res.shape[-2:]
    k = m * h
    x = res.reshape(-1, k).double()
    f = ref.fn_eff(fn, w).double()
    g = go.reshape(-1, f.shape[0]).double()
    sq = (x * x).sum(-1)
    rms = (sq / k + EPS).rsqrt()
    g_mul = g * rms[:, None]
    g_sq = (g * (x @ f.T)).abs().sum(-1) * rms / (sq + EPS * k) / 2
    dx = g_mul.abs() @ f.abs() + 2 * x.abs() * g_sq[:, None]
    dfe = g_mul.abs().T @ x.abs()
    if w is None:
        return BWD_ERR * dx.reshape(res.shape), BWD_ERR * dfe, None
    return BWD_ERR * dx.reshape(res.shape), BWD_ERR * dfe * w.double().abs(), BWD_ERR * (dfe * fn.double().abs()).sum(0)


BWD_CASES = [(1, n1, h) for n1 in (1, 13, 512, 4096) for h in (1280, 7168)] + [(2, 8192, 4096), (2, 48, 2560)]


@pytest.mark.parametrize("case", BWD_CASES, ids=lambda c: "x".join(map(str, c)))
def test_norm_fn_backward(ops, case):
    n0, n1, hidden = case
    for weight in (False, True):
        seed("normfn_bwd", case, weight)
        res, fn, w = _inputs(n0, n1, hidden, weight=weight)
        go = torch.randn(n0, n1, 24, device="cuda")
        leaves = [res.clone().requires_grad_(True), fn.clone().requires_grad_(True)]
        if weight:
            leaves.append(w.clone().requires_grad_(True))
        out = ops[0].mhc_pre_norm_fn(leaves[0], leaves[1], leaves[2] if weight else None, EPS)
        poison_cache(res.numel() * 2 + fn.numel() * 8)
        out.backward(go)
        want = ref.pre_norm_fn_grads(res, fn, w, EPS, go)
        bounds = _bwd_bounds(res, fn, w, go)
        what = f"mhc_pre_norm_fn backward({case}, weight={weight})"
        assert leaves[0].grad.dtype == torch.bfloat16
        assert_within(leaves[0].grad, want[0], 2.0 ** -8 * want[0].abs() + bounds[0], f"{what} d residual")
        assert_within(leaves[1].grad, want[1], bounds[1] + 1e-30, f"{what} d fn")
        if weight:
            assert_within(leaves[2].grad, want[2], bounds[2] + 1e-30, f"{what} d norm_weight")


def test_norm_fn_fused_grad_acc_and_main_grad(ops):
    seed("normfn_fused")
    res, fn, w = _inputs(1, 513, 4096, weight=True)
    go = torch.randn(1, 513, 24, device="cuda")
    leaf = res.clone().requires_grad_(True)
    x = leaf * 1  # the stash lives on the storage of the tensor the op sees
    stash = torch.randn(res.shape, device="cuda").bfloat16()
    before = stash.clone()
    x.untyped_storage().grad_from_mhc_post = stash
    fl, wl = fn.clone().requires_grad_(True), w.clone().requires_grad_(True)
    fl.main_grad = torch.ones_like(fn)
    wl.main_grad = torch.full_like(w, -1.0)
    out = ops[0].mhc_pre_norm_fn(x, fl, wl, EPS)
    poison_cache(1 << 26)
    out.backward(go)
    assert leaf.grad is None and fl.grad is None and wl.grad is None
    assert not hasattr(x.untyped_storage(), "grad_from_mhc_post")
    want = ref.pre_norm_fn_grads(res, fn, w, EPS, go)
    bounds = _bwd_bounds(res, fn, w, go)
    total = before.double() + want[0]
    assert_within(stash, total, 2.0 ** -8 * total.abs() + bounds[0] + 2.0 ** -8 * before.double().abs(),
                  "grad_from_mhc_post after the fused accumulation")
    assert_within(fl.main_grad, 1 + want[1], bounds[1] + 2.0 ** -23 * (1 + want[1].abs()), "fn.main_grad")
    assert_within(wl.main_grad, -1 + want[2], bounds[2] + 2.0 ** -23 * (1 + want[2].abs()), "norm_weight.main_grad")


# ---------------------------------------------------------------- big fuse
def _mix_params(m=4):
    scale = torch.rand(3, device="cuda") * 0.5 + 0.1
    base = torch.randn(m * (m + 2), device="cuda") * 0.5
    return scale, base


def _unfused(res, fn, scale, base, post_mult, repeat, n_splits=16):
    from tilebin.modeling.mhc.ops.pre_apply_mix import mhc_pre_apply_mix
    from tilebin.modeling.mhc.ops.pre_split_mixes import mhc_pre_split_mixes
    from tilebin.modeling.mhc.ops.sinkhorn import sinkhorn_normalize
    from tilebin.modeling.mhc.ops.norm_fn import mhc_pre_norm_fn

    m = res.shape[-2]
    mixes = mhc_pre_norm_fn(res, fn, None, EPS, n_splits=n_splits)
    pre, post, comb = mhc_pre_split_mixes(mixes, scale, base, m, post_mult, EPS)
    comb = sinkhorn_normalize(comb, repeat=repeat, eps=EPS)
    return post, comb, mhc_pre_apply_mix(res, pre)


BIG_CASES = [(n0, n1, h) for n0 in N0 for n1 in N1 for h in (1280, 7168)] + [(1, 4096, 2560), (1, 512, 4096)]
BIG_KERNELS = ("mhc.pre_big_fuse",)  # the kernels the op may launch (one; a speed candidate joins here)


@pytest.fixture(params=BIG_KERNELS)
def big_fuse_kernel(request, ops, require, monkeypatch):
    """Which kernel ``mhc_pre_big_fuse`` launches."""
    require(request.param)
    monkeypatch.setattr(ops[1], "_KERNEL", request.param)
    monkeypatch.setattr(ops[1].BIG_FUSE, "memo", {})  # its plans hold the kernel they were built with
    return request.param


@pytest.mark.parametrize("case", BIG_CASES, ids=lambda c: "x".join(map(str, c)))
def test_big_fuse_equals_unfused(ops, big_fuse_kernel, case):
    n0, n1, hidden = case
    seed("big_fuse", case)
    res, fn, _ = _inputs(n0, n1, hidden)
    scale, base = _mix_params()
    with torch.no_grad():
        poison_cache(res.numel() + n0 * n1 * 400)
        post, comb, li = ops[1].mhc_pre_big_fuse(res, fn, scale, base, EPS, EPS, EPS, 2.0, 20)
        u_post, u_comb, u_li = _unfused(res, fn, scale, base, 2.0, 20)
    assert (post.shape, comb.shape, li.shape) == ((n0, n1, 4, 1), (n0, n1, 4, 4), (n0, n1, hidden))
    assert (post.dtype, comb.dtype, li.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    assert_bits_equal(post, u_post, f"big fuse post_mix {case}")
    assert_bits_equal(comb, u_comb, f"big fuse comb_mix {case}")
    assert_bits_equal(li, u_li, f"big fuse layer_input {case}")
    if n1 in (13, 4096):  # and the float64 composition
        wp, wc, wl = bref.pre_big_fuse(res, fn, scale, base, EPS, EPS, EPS, 2.0, 20)
        # post_mix = 2 sigmoid(mix * scale[1] + base): the TF32 GEMM's error on the mixes (_fwd_bound)
        # times the sigmoid's slope (<= 1/4) -- past 1e-5 relative at K = 4 * 7168
        mix_err = _fwd_bound(res, fn, None).amax(-1)[..., None, None]
        assert_within(post, wp, 2.0 * 0.25 * scale[1].item() * mix_err + 1e-5 * wp.abs() + 1e-6,
                      f"big fuse post_mix {case} vs float64")
        assert_within(comb, wc, 1e-4 * wc.abs() + 1e-6, f"big fuse comb_mix {case} vs float64")
        li_bound = 2.0 ** -8 * wl.abs() + 1e-4 * (res.double().abs().sum(-2) + 1e-30)
        assert_within(li, wl, li_bound, f"big fuse layer_input {case} vs float64")


@pytest.mark.parametrize("m", [2, 8])
def test_big_fuse_mult_2_and_8_repeat1_and_zero_tokens(ops, big_fuse_kernel, m):
    seed("big_fuse_m", m)
    res, fn, _ = _inputs(3, 77, 1088, m=m)
    scale, base = _mix_params(m)
    with torch.no_grad():
        for repeat, splits in ((1, 5), (7, 16)):
            poison_cache(1 << 24)
            got = ops[1].mhc_pre_big_fuse(res, fn, scale, base, EPS, EPS, EPS, 1.0, repeat, n_splits=splits)
            want = _unfused(res, fn, scale, base, 1.0, repeat, n_splits=splits)
            for g, u, name in zip(got, want, ("post_mix", "comb_mix", "layer_input")):
                assert_bits_equal(g, u, f"big fuse mhc_mult {m} repeat {repeat} {name}")
        empty = ops[1].mhc_pre_big_fuse(res[:, :0], fn, scale, base, EPS, EPS, EPS, 1.0, 3)
    assert [tuple(t.shape) for t in empty] == [(3, 0, m, 1), (3, 0, m, m), (3, 0, 1088)]
