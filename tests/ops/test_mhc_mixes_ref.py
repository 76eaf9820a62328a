"""CPU tests of the mHC mixes references (``tests/mhc_ref``: sinkhorn, split_mixes, recompute):
the definitions against finite differences (gradcheck, float64), the kernels' algorithms (the fp32
emulation of the Sinkhorn kernels, the closed-form split-mixes backward, the fp32 recompute)
against the float64 definitions, and the float64 recompute against an einsum formulation of
the same layers (apply mix, then post)."""

from __future__ import annotations

import pytest
import torch

from mhc_ref import recompute as rref
from mhc_ref import sinkhorn as sref
from mhc_ref import split_mixes as mref


# ---------------------------------------------------------------- Sinkhorn
@pytest.mark.parametrize("m,repeat", [(4, 1), (4, 3), (2, 4), (8, 2)])
def test_sinkhorn_definition_gradcheck(m, repeat):
    g = torch.Generator().manual_seed(m * 10 + repeat)
    x = torch.randn((3, m, m), dtype=torch.float64, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: sref.sinkhorn(t, repeat, 1e-6), (x,), eps=1e-6, atol=1e-6)


def test_sinkhorn_is_nearly_doubly_stochastic():
    x = torch.randn((64, 4, 4), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    p = sref.sinkhorn(x, 20, 1e-6)
    assert torch.allclose(p.sum(-2), torch.ones(64, 4, dtype=torch.float64), atol=1e-5)  # last step: columns
    assert torch.allclose(p.sum(-1), torch.ones(64, 4, dtype=torch.float64), atol=1e-3)
    assert bool((p > 0).all())


def test_sinkhorn_repeat_one_is_softmax_then_one_column_step():
    x = torch.randn((5, 4, 4), dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    p = x.softmax(-1) + 1e-6
    assert torch.equal(sref.sinkhorn(x, 1, 1e-6), p / (p.sum(-2, keepdim=True) + 1e-6))


@pytest.mark.parametrize("m", [2, 4, 8])
@pytest.mark.parametrize("repeat,scale", [(1, 1.0), (3, 1.0), (10, 1.0), (10, 6.0), (25, 1.0)])
def test_sinkhorn_kernel_algorithm_matches_float64_autograd(m, repeat, scale):
    """The kernels' fp32 algorithm (sums kept, intermediates rebuilt backwards) is as close to the
    float64 definition as fp32 autograd of the definition itself."""
    g = torch.Generator().manual_seed(m * 100 + repeat)
    x = torch.randn((2048, m, m), generator=g) * scale
    grad = torch.randn((2048, m, m), generator=g)
    x64 = x.double().requires_grad_()
    want = sref.sinkhorn(x64, repeat, 1e-6)
    (want_grad,) = torch.autograd.grad(want, x64, grad.double())
    got = sref.sinkhorn_fwd_emulated(x, repeat, 1e-6)
    got_grad = sref.sinkhorn_bwd_emulated(grad, x, repeat, 1e-6)
    x32 = x.clone().requires_grad_()
    (fp32_grad,) = torch.autograd.grad(sref.sinkhorn(x32, repeat, 1e-6, torch.float32), x32, grad)
    assert float((got.double() - want.detach()).abs().max()) < 1e-6
    err = float((got_grad.double() - want_grad).abs().max())
    assert err < 2e-6 * max(1.0, float(want_grad.abs().max())), err
    assert err <= 3 * float((fp32_grad.double() - want_grad).abs().max()) + 1e-7


# ---------------------------------------------------------------- split mixes
@pytest.mark.parametrize("m", [2, 4, 8])
def test_split_mixes_gradcheck(m):
    g = torch.Generator().manual_seed(m)
    k = m * (m + 2)
    x = torch.randn((2, 3, k), dtype=torch.float64, generator=g).requires_grad_()
    s = torch.randn(3, dtype=torch.float64, generator=g).requires_grad_()
    b = torch.randn(k, dtype=torch.float64, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: mref.split_mixes(*a, m, 2.0, 1e-6), (x, s, b))


@pytest.mark.parametrize("m,post_mult", [(2, 2.0), (4, 2.0), (4, 0.0), (8, 1.0)])
def test_split_mixes_closed_form_backward_matches_autograd(m, post_mult):
    g = torch.Generator().manual_seed(7 + m)
    k = m * (m + 2)
    x = torch.randn((5, 7, k), dtype=torch.float64, generator=g).requires_grad_()
    s = torch.randn(3, dtype=torch.float64, generator=g).requires_grad_()
    b = torch.randn(k, dtype=torch.float64, generator=g).requires_grad_()
    outs = mref.split_mixes(x, s, b, m, post_mult, 1e-6)
    grads = [torch.randn(o.shape, dtype=torch.float64, generator=g) for o in outs]
    want = torch.autograd.grad(outs, (x, s, b), grads)
    got = mref.split_mixes_bwd(*grads, x.detach(), s.detach(), b.detach(), m, post_mult)
    for w, h in zip(want, got):
        assert torch.allclose(h, w, rtol=1e-12, atol=1e-12)


def test_split_mixes_layout_and_values():
    m, k = 4, 24
    x = torch.arange(2 * 3 * k, dtype=torch.float32).reshape(2, 3, k) / 100
    s = torch.tensor([0.5, 2.0, 3.0])
    b = torch.linspace(-1, 1, k)
    pre, post, comb = mref.split_mixes(x, s, b, m, 2.0, 1e-6, torch.float32)
    assert pre.shape == post.shape == (2, 3, m, 1) and comb.shape == (2, 3, m, m)
    assert torch.equal(comb[1, 2, 3, 1], x[1, 2, 8 + 13] * 3.0 + b[8 + 13])
    assert torch.equal(pre[0, 1, 2, 0], torch.sigmoid(x[0, 1, 2] * 0.5 + b[2]) + 1e-6)
    assert torch.equal(post[0, 1, 3, 0], torch.sigmoid(x[0, 1, 7] * 2.0 + b[7]) * 2.0)


# ---------------------------------------------------------------- multilayer recompute
def _layers(n, m, hidden, layers, post, seed):
    g = torch.Generator().manual_seed(seed)
    res = torch.randn((n, m, hidden), generator=g).bfloat16()
    pre = [torch.rand((n, m, 1), generator=g) for _ in range(layers)]
    outs = [torch.randn((n, hidden), generator=g).bfloat16() for _ in range(post)]
    posts = [torch.rand((n, m, 1), generator=g) * 2 for _ in range(post)]
    combs = [sref.sinkhorn(torch.randn((n, m, m), generator=g), 5, 1e-6).float() for _ in range(post)]
    return res, pre, outs, posts, combs


@pytest.mark.parametrize("m,layers,post", [(4, 3, 2), (4, 3, 3), (2, 1, 0), (8, 2, 2), (4, 1, 1)])
def test_recompute_fp32_within_one_bf16_rounding_of_float64(m, layers, post):
    args = _layers(9, m, 64, layers, post, seed=m + layers)
    ins32, res32 = rref.recompute(*args)
    ins64, res64 = rref.recompute(*args, dtype=torch.float64)
    assert len(ins32) == layers and len(res32) == post
    for a, b in zip(ins32 + res32, ins64 + res64):
        a, b = a.double(), b.double()
        # one bf16 ulp (2**-8 relative) of the value, carried through at most `layers` roundings
        assert bool(((a - b).abs() <= (layers + 1) * 2**-8 * b.abs().clamp_min(2**-8)).all())


def test_recompute_matches_apply_mix_then_post():
    """Each layer as tile_kernels' references write it: layer_input = (x * pre).sum(-2),
    residual = post * out + einsum('mn,mc->nc', comb, residual)."""
    m, hidden = 4, 128
    res, pre, outs, posts, combs = _layers(6, m, hidden, 3, 2, seed=11)
    ins, residuals = rref.recompute(res, pre, outs, posts, combs, dtype=torch.float64)
    r = res.double()
    for i in range(2):
        li = (r * pre[i].double()).sum(-2)
        assert torch.equal(ins[i], li.bfloat16())
        nr = (outs[i].double().unsqueeze(-2) * posts[i].double() + torch.einsum("tmn,tmc->tnc", combs[i].double(), r))
        assert torch.equal(residuals[i], nr.bfloat16())
        r = residuals[i].double()
    assert torch.equal(ins[2], (r * pre[2].double()).sum(-2).bfloat16())
