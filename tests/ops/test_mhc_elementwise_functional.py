"""``tilebin.modeling.mhc.functional`` (``expand_from_embedding``, ``mhc_pre``, ``mhc_head``) on CPU:
the stream ops run with their kernels emulated (as in test_mhc_elementwise_emulated), the other
helpers' ops (norm-fn, split mixes, Sinkhorn, big fuse) are replaced by their torch definitions
from ``mhc_ref.pipeline`` with every call recorded.

What this proves: the functions pass tile_kernels' arguments through (epsilons, repeat count,
split count, mhc_mult, post multiplier), take the fused path exactly when autograd is off (with
the norm weight folded into ``fn``), pad the head's ``fn`` to ``M * (M + 2)`` rows and slice its
mixes, and their values and gradients equal ``mhc_ref.pipeline``'s.
"""

from __future__ import annotations

import pytest
import torch

import test_mhc_elementwise_emulated as emu
from mhc_ref import pipeline as ref
from mhc_ref.sinkhorn import sinkhorn
from mhc_ref.split_mixes import split_mixes
from tilebin.modeling.mhc import functional as F

M, H = 4, 64
BF16, F32 = torch.bfloat16, torch.float32


@pytest.fixture
def calls(monkeypatch, launches):
    del launches  # the stream ops' kernels are emulated by that fixture
    log = []

    def norm_fn(residual, fn, norm_weight, norm_eps, fuse_grad_acc=True, n_splits=16):
        log.append(("norm_fn", fn.shape[0], norm_weight is not None, norm_eps, n_splits))
        return ref.norm_fn(residual, fn, norm_weight, norm_eps)

    def split(mixes, scale, base, mhc_mult, post_mult_value, pre_eps):
        log.append(("split", mhc_mult, post_mult_value, pre_eps))
        return split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps, dtype=F32)

    def sk(x, repeat=10, eps=1e-6):
        log.append(("sinkhorn", repeat, eps))
        return sinkhorn(x, repeat, eps, dtype=F32)

    def big_fuse(residual, fn, scale, base, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value,
                 sinkhorn_repeat, n_splits=16):
        log.append(("big_fuse", rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits))
        x, (post, comb) = ref.pre(residual, fn, scale, base, norm_eps=rms_eps, mhc_mult=residual.shape[-2],
                                  post_mult_value=mhc_post_mult_value, pre_eps=mhc_pre_eps,
                                  sinkhorn_eps=mhc_sinkhorn_eps, sinkhorn_repeat=sinkhorn_repeat)
        log.append(("big_fuse_fn", fn))
        return post, comb, x

    monkeypatch.setattr(F, "mhc_pre_norm_fn", norm_fn)
    monkeypatch.setattr(F, "mhc_pre_split_mixes", split)
    monkeypatch.setattr(F, "sinkhorn_normalize", sk)
    monkeypatch.setattr(F, "mhc_pre_big_fuse", big_fuse)
    return log


launches = emu.launches
prim_params = emu.prim_params


def _inputs(seed=0, lead=(2, 3)):
    g = torch.Generator().manual_seed(seed)
    k = M * H
    residual = torch.randn(*lead, M, H, generator=g).to(BF16)
    fn = torch.randn(M * (M + 2), k, generator=g) * k ** -0.5
    scale = torch.tensor([0.5, 0.7, 1.3])
    base = torch.randn(M * (M + 2), generator=g) * 0.1
    nw = 1 + 0.1 * torch.randn(k, generator=g)
    return residual, fn, scale, base, nw


def test_expand_from_embedding(calls):
    x = torch.randn(2, 3, H).to(BF16)
    assert torch.equal(F.expand_from_embedding(x), ref.expand(x, 4))
    assert F.expand_from_embedding(x, 2).shape == (2, 3, 2, H)


@pytest.mark.parametrize("weighted", [False, True])
def test_mhc_pre_unfused_matches_reference(calls, weighted):
    residual, fn, scale, base, nw = _inputs()
    w = nw if weighted else None
    r1 = residual.clone().requires_grad_()
    f1 = fn.clone().requires_grad_()
    x, (post, comb) = F.mhc_pre(r1, f1, scale, base, norm_weight=w, norm_eps=1e-5, post_mult_value=2.0,
                                pre_eps=1e-4, sinkhorn_eps=1e-3, sinkhorn_repeat=7, n_splits=3)
    assert [c[0] for c in calls] == ["norm_fn", "split", "sinkhorn"]
    assert calls[0] == ("norm_fn", 24, weighted, 1e-5, 3)
    assert calls[1] == ("split", 4, 2.0, 1e-4) and calls[2] == ("sinkhorn", 7, 1e-3)
    r2 = residual.clone().requires_grad_()
    f2 = fn.clone().requires_grad_()
    xr, (pr, cr) = ref.pre(r2, f2, scale, base, norm_weight=w, norm_eps=1e-5, post_mult_value=2.0, pre_eps=1e-4,
                           sinkhorn_eps=1e-3, sinkhorn_repeat=7)
    assert x.dtype == BF16 and post.shape == (2, 3, M, 1) and comb.shape == (2, 3, M, M)
    assert torch.equal(post, pr) and torch.equal(comb, cr)
    assert (x.float() - xr.float()).abs().max() <= 2.0**-7 * xr.float().abs().max()
    g = torch.randn_like(x.float()).to(BF16)
    (x.float() * g.float()).sum().backward()
    (xr.float() * g.float()).sum().backward()
    assert torch.allclose(f1.grad, f2.grad, rtol=2e-2, atol=1e-3)
    assert (r1.grad.float() - r2.grad.float()).abs().max() <= 2e-2 * r2.grad.float().abs().max()


@pytest.mark.parametrize("weighted", [False, True])
def test_mhc_pre_fused_when_grad_is_off(calls, weighted):
    residual, fn, scale, base, nw = _inputs(1)
    w = nw if weighted else None
    with torch.no_grad():
        x, (post, comb) = F.mhc_pre(residual, fn, scale, base, norm_weight=w, norm_eps=1e-5, post_mult_value=2.0,
                                    pre_eps=1e-4, sinkhorn_eps=1e-3, sinkhorn_repeat=7, n_splits=3)
    assert calls[0] == ("big_fuse", 1e-5, 1e-4, 1e-3, 2.0, 7, 3)
    assert torch.equal(calls[1][1], fn * nw if weighted else fn)  # the weight folded into fn
    assert [c[0] for c in calls] == ["big_fuse", "big_fuse_fn"]
    xr, (pr, cr) = ref.pre(residual, fn, scale, base, norm_weight=w, norm_eps=1e-5, post_mult_value=2.0,
                           pre_eps=1e-4, sinkhorn_eps=1e-3, sinkhorn_repeat=7)
    assert torch.equal(x, xr) and torch.equal(post, pr) and torch.equal(comb, cr)


def test_mhc_head_matches_reference(calls):
    residual, _, _, _, nw = _inputs(2)
    g = torch.Generator().manual_seed(5)
    fn = (torch.randn(M, M * H, generator=g) * (M * H) ** -0.5).requires_grad_()
    scale = torch.tensor(0.8).requires_grad_()  # a 0-d scale: reshaped to [1]
    base = (torch.randn(M, generator=g) * 0.1).requires_grad_()
    r1 = residual.clone().requires_grad_()
    out = F.mhc_head(r1, fn, scale, base, norm_weight=nw, norm_eps=1e-5, pre_eps=1e-4, n_splits=5)
    assert calls == [("norm_fn", 24, True, 1e-5, 5)]  # fn padded to M * (M + 2) rows
    assert out.shape == (2, 3, H) and out.dtype == BF16
    fn2, scale2, base2 = (t.detach().clone().requires_grad_() for t in (fn, scale, base))
    r2 = residual.clone().requires_grad_()
    want = ref.head(r2, fn2, scale2, base2, norm_weight=nw, norm_eps=1e-5, pre_eps=1e-4)
    assert (out.float() - want.float()).abs().max() <= 2.0**-7 * want.float().abs().max()
    gout = torch.randn(2, 3, H, generator=g).to(BF16)
    (out.float() * gout.float()).sum().backward()
    (want.float() * gout.float()).sum().backward()
    for a, b, name in ((fn.grad, fn2.grad, "fn"), (scale.grad, scale2.grad, "scale"), (base.grad, base2.grad, "base"),
                       (r1.grad.float(), r2.grad.float(), "residual")):
        assert a.shape == b.shape, name
        assert float((a - b).norm()) <= 2e-2 * float(b.norm()) + 1e-6, name
