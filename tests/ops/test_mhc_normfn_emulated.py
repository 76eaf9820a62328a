"""``mhc_pre_norm_fn`` and ``mhc_pre_big_fuse`` end to end on CPU, with each kernel replaced by an
emulator (torch, fp32) that takes the kernel's parameters in the kernel's order (checked against
the TileLang PrimFuncs when tilelang is installed) and follows its documented arithmetic: the
split-K column ranges, partials summed in split order, the norm factor after the GEMM, the TF32
rounding of fn and of the mul gradient.

What this proves without a GPU: the op layer passes the right tensors and scalars in the right
order, allocates tile_kernels' dtypes and shapes, picks the split count it documents, wires the
backward (incl. ``fuse_grad_acc`` through ``grad_from_mhc_post`` and the ``main_grad``
convention of the norm-weight path) to autograd's gradients of the float64 reference, and the
fused inference path computes the reference composition.  The kernels' own arithmetic is tested
on the H200 (tests/gpu/test_gpu_mhc_normfn.py).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from mhc_ref import big_fuse as bref
from mhc_ref import norm_fn as ref
from tilebin.modeling.mhc.ops import norm_fn as nf
from tilebin.modeling.mhc.ops import pre_big_fuse as bf
from tilebin.ops import _spec


def _split_ranges(k: int, s: int) -> list[tuple[int, int]]:
    nkb = k // 128
    return [(i * nkb // s * 128, (i + 1) * nkb // s * 128) for i in range(s)]


def _prep(fn, w, fn_eff, has_weight):
    assert has_weight in (0, 1) and fn_eff.dtype == torch.float32
    fn_eff.copy_(ref.tf32(fn * w if has_weight else fn))


def _fwd_mul(x, fn_eff, part_mul, part_sq):
    s, t, n = part_mul.shape
    assert x.dtype == torch.bfloat16 and x.shape == (t, fn_eff.shape[1]) and part_sq.shape == (s, t)
    for i, (lo, hi) in enumerate(_split_ranges(x.shape[1], s)):
        assert hi > lo, "every split owns at least one column block"
        xs = x[:, lo:hi].float()
        part_mul[i] = xs @ fn_eff[:, lo:hi].T
        part_sq[i] = (xs * xs).sum(-1)


def _fwd_norm(part_mul, part_sq, out, out_mul, sqrsum, mhc_hidden, eps):
    assert type(mhc_hidden) is int and type(eps) is float
    mul, sq = part_mul[0].clone(), part_sq[0].clone()
    for i in range(1, part_mul.shape[0]):
        mul += part_mul[i]
        sq += part_sq[i]
    rms = torch.rsqrt(sq / mhc_hidden + eps)
    out.copy_(mul * rms[:, None])
    out_mul.copy_(mul)
    sqrsum.copy_(sq)


def _bwd_norm(out_grad, out_mul, sqrsum, g_mul, g_sq, mhc_hidden, eps):
    rms = torch.rsqrt(sqrsum / mhc_hidden + eps)
    g_mul.copy_(ref.tf32(out_grad * rms[:, None]))
    g_sq.copy_((out_grad * out_mul).sum(-1) * rms / (sqrsum + eps * mhc_hidden) / -2)


def _bwd_mul(g_mul, g_sq, x, fn_eff, x_grad, fn_grad_part, accumulate):
    assert accumulate in (0, 1) and x_grad.dtype == torch.bfloat16
    xf = x.float()
    base = x_grad.float() if accumulate else torch.zeros_like(xf)
    x_grad.copy_((base + g_mul @ fn_eff + 2 * xf * g_sq[:, None]).to(torch.bfloat16))
    splits, ntb = fn_grad_part.shape[0], -(-x.shape[0] // 64)
    for s in range(splits):  # the kernel's token ranges; an empty range writes zeros
        lo, hi = min(s * ntb // splits * 64, x.shape[0]), min((s + 1) * ntb // splits * 64, x.shape[0])
        fn_grad_part[s] = g_mul[lo:hi].T @ xf[lo:hi]


def _grad_reduce(fn_grad_part, fn, w, fn_grad, w_grad, has_weight, accumulate):
    assert has_weight in (0, 1) and accumulate in (0, 1)
    dfe = fn_grad_part[0].clone()
    for s in range(1, fn_grad_part.shape[0]):
        dfe += fn_grad_part[s]
    dfn = dfe * w if has_weight else dfe
    if accumulate:
        fn_grad += dfn
    else:
        fn_grad.copy_(dfn)
    if has_weight:
        dw = (dfe * fn).sum(0)
        if accumulate:
            w_grad += dw
        else:
            w_grad.copy_(dw)


def _big_fuse(part_mul, part_sq, scale, base, residual, post_mix, comb_mix, layer_input, rms_eps, pre_eps,
              sinkhorn_eps, post_mult_value, repeat):
    s, t, n = part_mul.shape
    m = residual.shape[1]
    out, mul, sq = (torch.empty(t, n), torch.empty(t, n), torch.empty(t))
    _fwd_norm(part_mul, part_sq, out, mul, sq, m * residual.shape[2], rms_eps)
    pre, post, comb = bref.split_mixes(out, scale, base, m, post_mult_value, pre_eps)
    post_mix.copy_(post[..., 0])
    comb_mix.copy_(bref.sinkhorn(comb, repeat, sinkhorn_eps).reshape(t, m * m))
    layer_input.copy_((residual.double() * pre).sum(-2).to(torch.bfloat16))


EMULATORS = {
    "mhc.norm_fn_prep": _prep,
    "mhc.norm_fn_fwd_mul": _fwd_mul,
    "mhc.norm_fn_fwd_norm": _fwd_norm,
    "mhc.norm_fn_bwd_norm": _bwd_norm,
    "mhc.norm_fn_bwd_mul": _bwd_mul,
    "mhc.norm_fn_grad_reduce": _grad_reduce,
    "mhc.pre_big_fuse": _big_fuse,
}


@pytest.fixture
def calls(monkeypatch):
    log = []

    def launcher(name, **key):
        def run(*args):
            log.append((name, dict(key), args))
            EMULATORS[name](*args)

        return run

    for mod in (nf, bf):
        monkeypatch.setattr(mod, "launcher", launcher)
        for spec in mod.SPECS:  # plans built under this launcher, forgotten after the test
            monkeypatch.setattr(spec, "memo", {})
    monkeypatch.setattr(_spec, "check_cuda", lambda *a, **k: None)
    return log


def test_emulators_take_the_kernels_parameters_in_order():
    pytest.importorskip("tilelang")
    from tilelang import tvm  # noqa: F401  (the target context below)
    from tvm.target import Target

    from tilebin.kernels.mhc import norm_fn as knf
    from tilebin.kernels.mhc import pre_big_fuse as kbf

    decls = {d.name: d for d in knf.KERNELS + kbf.KERNELS}
    assert set(decls) == set(EMULATORS)
    with Target({"kind": "cuda", "arch": "sm_90a"}):
        for name, decl in decls.items():
            func = decl.factory(**dict(decl.grid[0]))
            params = [p.name.removesuffix("_handle") for p in func.params]
            want = list(inspect.signature(EMULATORS[name]).parameters)
            assert params == want, name


def _inputs(outer=(2, 3), m=4, h=128, weight=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    res = torch.randn(*outer, m, h, generator=g).to(torch.bfloat16)
    fn = torch.randn(m * (m + 2), m * h, generator=g) * (m * h) ** -0.5
    w = (1 + 0.1 * torch.randn(m * h, generator=g)) if weight else None
    return res, fn, w


@pytest.mark.parametrize("tokens,k,n_splits,want", [
    (1, 1024, 16, 8), (1, 16384, 16, 16), (128, 16384, 16, 16), (4096, 16384, 16, 8), (8192, 28672, 16, 4),
    (16384, 16384, 16, 2), (100000, 16384, 16, 1), (13, 256, 16, 2), (13, 16384, 3, 3), (0, 1024, 16, 8)])
def test_split_count(tokens, k, n_splits, want):
    assert nf.num_splits(tokens, k, n_splits) == want


@pytest.mark.parametrize("tokens,k,want", [
    (0, 16384, 1), (1, 16384, 1), (64, 5120, 1), (65, 5120, 2), (8192, 5120, 7), (8192, 16384, 2),
    (16384, 28672, 2), (100, 1024, 2), (10**6, 256, 128)])
def test_token_split_count(tokens, k, want):
    assert nf.num_token_splits(tokens, k) == want


def test_op_constants_match_the_kernels():
    pytest.importorskip("tilelang")
    from tilebin.kernels.mhc import norm_fn as knf

    assert (nf.KB, nf.TB, nf.TB_BWD, nf.MULTS) == (knf.KB, knf.TB, knf.TB_BWD, knf.MULTS)


@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("outer,m,h", [((2, 3), 4, 128), ((1, 13), 4, 64), ((5,), 2, 192), ((1, 1), 4, 320),
                                       ((3,), 8, 64)])
def test_forward_matches_reference(calls, weight, outer, m, h):
    res, fn, w = _inputs(outer, m, h, weight)
    out = nf.mhc_pre_norm_fn(res, fn, w, 1e-6)
    assert out.dtype == torch.float32 and tuple(out.shape) == (*outer, m * (m + 2))
    torch.testing.assert_close(out.double(), ref.pre_norm_fn(res, fn, w, 1e-6), rtol=1e-5, atol=1e-5)
    names = [c[0] for c in calls]
    assert names == ["mhc.norm_fn_prep", "mhc.norm_fn_fwd_mul", "mhc.norm_fn_fwd_norm"]
    assert all(c[1] in ({}, {"mhc_mult": m}) for c in calls)
    t = res.numel() // (m * h)
    assert calls[1][2][2].shape[0] == nf.num_splits(t, m * h, 16)


def test_forward_zero_tokens(calls):
    res, fn, w = _inputs((0, 3), 4, 64, True)
    out = nf.mhc_pre_norm_fn(res, fn, w, 1e-6)
    assert tuple(out.shape) == (0, 3, 24) and out.dtype == torch.float32
    assert [c[0] for c in calls] == ["mhc.norm_fn_prep"]


def _grads(res, fn, w, out_grad, fuse=False, n_splits=16):
    leaves = [res.clone().requires_grad_(True), fn.clone().requires_grad_(True)]
    if w is not None:
        leaves.append(w.clone().requires_grad_(True))
    out = nf.mhc_pre_norm_fn(leaves[0], leaves[1], leaves[2] if w is not None else None, 1e-6,
                             fuse_grad_acc=fuse, n_splits=n_splits)
    out.backward(out_grad)
    return [t.grad for t in leaves]


@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("outer,m,h", [((2, 3), 4, 128), ((1, 13), 4, 64), ((5,), 2, 192), ((300,), 4, 64),
                                       ((70,), 8, 64)])
def test_backward_matches_reference(calls, weight, outer, m, h):
    res, fn, w = _inputs(outer, m, h, weight, seed=1)
    go = torch.randn(*outer, m * (m + 2), generator=torch.Generator().manual_seed(2))
    got = _grads(res, fn, w, go)
    want = ref.pre_norm_fn_grads(res, fn, w, 1e-6, go)
    assert got[0].dtype == torch.bfloat16
    torch.testing.assert_close(got[0].double(), want[0], rtol=2**-7, atol=1e-3 * float(want[0].abs().max()))
    torch.testing.assert_close(got[1].double(), want[1], rtol=1e-2, atol=1e-3 * float(want[1].abs().max()))
    if weight:
        torch.testing.assert_close(got[2].double(), want[2], rtol=1e-2, atol=1e-3 * float(want[2].abs().max()))


def test_backward_zero_tokens(calls):
    res, fn, w = _inputs((0,), 4, 64, True)
    got = _grads(res, fn, w, torch.zeros(0, 24))
    assert tuple(got[0].shape) == (0, 4, 64)
    assert torch.equal(got[1], torch.zeros_like(fn)) and torch.equal(got[2], torch.zeros_like(w))


def test_fused_grad_acc_adds_into_grad_from_mhc_post(calls):
    res, fn, _ = _inputs((3, 2), 4, 64, False, seed=3)
    go = torch.randn(3, 2, 24, generator=torch.Generator().manual_seed(4))
    leaf = res.clone().requires_grad_(True)
    x = leaf * 1  # a non-leaf whose storage carries the stash, as mhc_post's backward leaves it
    stash = torch.randn(x.shape).to(torch.bfloat16)
    before = stash.clone()
    x.untyped_storage().grad_from_mhc_post = stash
    nf.mhc_pre_norm_fn(x, fn, None, 1e-6).backward(go)  # fuse_grad_acc defaults to True
    assert leaf.grad is None  # the gradient went into the stash, None was returned
    assert not hasattr(x.untyped_storage(), "grad_from_mhc_post")
    want = before.double() + ref.pre_norm_fn_grads(res, fn, None, 1e-6, go)[0]
    torch.testing.assert_close(stash.double(), want, rtol=2**-7, atol=1e-3 * float(want.abs().max()))
    bwd_mul = [c for c in calls if c[0] == "mhc.norm_fn_bwd_mul"]
    assert len(bwd_mul) == 1 and bwd_mul[0][2][-1] == 1  # the accumulate flag


def test_fused_grad_acc_without_stash_returns_the_gradient(calls):
    res, fn, _ = _inputs((4,), 4, 64, False, seed=5)
    go = torch.randn(4, 24, generator=torch.Generator().manual_seed(6))
    got = _grads(res, fn, None, go, fuse=True)
    want = ref.pre_norm_fn_grads(res, fn, None, 1e-6, go)
    torch.testing.assert_close(got[0].double(), want[0], rtol=2**-7, atol=1e-3 * float(want[0].abs().max()))


def test_main_grad_convention_with_norm_weight(calls):
    res, fn, w = _inputs((6,), 4, 64, True, seed=7)
    go = torch.randn(6, 24, generator=torch.Generator().manual_seed(8))
    fl, wl = fn.clone().requires_grad_(True), w.clone().requires_grad_(True)
    fl.main_grad = torch.ones_like(fn)
    wl.main_grad = torch.full_like(w, 2.0)
    nf.mhc_pre_norm_fn(res, fl, wl, 1e-6).backward(go)
    assert fl.grad is None and wl.grad is None
    _, dfn, dw = ref.pre_norm_fn_grads(res, fn, w, 1e-6, go)
    torch.testing.assert_close(fl.main_grad.double(), 1 + dfn, rtol=1e-2, atol=1e-3 * float(dfn.abs().max()))
    torch.testing.assert_close(wl.main_grad.double(), 2 + dw, rtol=1e-2, atol=1e-3 * float(dw.abs().max()))


@pytest.mark.parametrize("outer,m,h,repeat", [((2, 5), 4, 128, 10), ((1, 1), 4, 64, 1), ((7,), 2, 128, 3),
                                              ((3,), 8, 64, 4)])
def test_big_fuse_matches_reference(calls, outer, m, h, repeat):
    res, fn, _ = _inputs(outer, m, h, False, seed=9)
    g = torch.Generator().manual_seed(10)
    scale = torch.rand(3, generator=g) + 0.5
    base = torch.randn(m * (m + 2), generator=g)
    post, comb, li = bf.mhc_pre_big_fuse(res, fn, scale, base, 1e-6, 1e-6, 1e-6, 2.0, repeat)
    assert (post.dtype, comb.dtype, li.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    assert tuple(post.shape) == (*outer, m, 1) and tuple(comb.shape) == (*outer, m, m) and tuple(li.shape) == (*outer, h)
    wp, wc, wl = bref.pre_big_fuse(res, fn, scale, base, 1e-6, 1e-6, 1e-6, 2.0, repeat)
    torch.testing.assert_close(post.double(), wp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(comb.double(), wc, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(li.double(), wl, rtol=2**-7, atol=1e-6)
    assert [c[0] for c in calls] == ["mhc.norm_fn_prep", "mhc.norm_fn_fwd_mul", "mhc.pre_big_fuse"]


def test_big_fuse_zero_tokens(calls):
    res, fn, _ = _inputs((0, 2), 4, 64)
    post, comb, li = bf.mhc_pre_big_fuse(res, fn, torch.ones(3), torch.zeros(24), 1e-6, 1e-6, 1e-6, 1.0, 5)
    assert tuple(post.shape) == (0, 2, 4, 1) and tuple(comb.shape) == (0, 2, 4, 4) and tuple(li.shape) == (0, 2, 64)
    assert calls == []
