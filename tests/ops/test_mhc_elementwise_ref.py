"""The float64 references of the mHC stream ops are self-consistent: their explicit gradients equal
torch autograd of their forward definitions (and finite differences), the emulated kernel bits
agree with the float64 values within the bounds the GPU tests use, and the forward matches the
textbook formula (output stream ``n`` takes comb column ``n``)."""

from __future__ import annotations

import pytest
import torch

from mhc_ref import apply_mix as aref
from mhc_ref import expand as eref
from mhc_ref import head as href
from mhc_ref import post as pref
from mhc_ref.close import assert_bf16_close

F64 = torch.float64


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_expand_gradcheck_and_emulation():
    x = _r(2, 3, 8).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: eref.expand(t, 4), (x,))
    g = _r(2, 3, 4, 8, seed=1)
    (gx,) = torch.autograd.grad(eref.expand(x, 4), x, g)
    assert torch.allclose(gx, eref.expand_bwd(g))
    gb = g.to(torch.bfloat16)
    assert_bf16_close(eref.expand_bwd_emulated(gb), eref.expand_bwd(gb), gb.double().abs().sum(-2))


def test_apply_mix_grads_match_autograd():
    x, mix = _r(3, 4, 16).requires_grad_(), _r(3, 4, 1, seed=1).requires_grad_()
    assert torch.autograd.gradcheck(aref.apply_mix, (x, mix))
    g = _r(3, 16, seed=2)
    gx, gm = torch.autograd.grad(aref.apply_mix(x, mix), (x, mix), g)
    want_x, want_m, _ = aref.apply_mix_bwd(g, x.detach(), mix.detach())
    assert torch.allclose(gx, want_x) and torch.allclose(gm, want_m)


def test_post_grads_match_autograd():
    args = [_r(2, 16), _r(2, 4, 16, seed=1), _r(2, 4, 1, seed=2), _r(2, 4, 4, seed=3)]
    args = [a.requires_grad_() for a in args]
    assert torch.autograd.gradcheck(pref.post, tuple(args))
    g = _r(2, 4, 16, seed=4)
    got = torch.autograd.grad(pref.post(*args), args, g)
    want = pref.post_bwd(g, *[a.detach() for a in args])
    for name, gv in zip(("x", "residual", "post_mix", "comb"), got):
        assert torch.allclose(gv, want[name][0]), name


def test_post_stream_convention():
    """out[n] = post[n] * x + sum_m comb[m, n] * residual[m]: a comb with a single 1 at (m, n)
    routes input stream m to output stream n."""
    x, r = torch.zeros(1, 8, dtype=F64), _r(1, 4, 8)
    p = torch.zeros(1, 4, 1, dtype=F64)
    c = torch.zeros(1, 4, 4, dtype=F64)
    c[0, 1, 3] = 1.0
    out = pref.post(x, r, p, c)
    assert torch.equal(out[0, 3], r[0, 1]) and not out[0, :3].any()


def test_head_grads_match_autograd():
    a, s, b = _r(2, 3, 4).requires_grad_(), _r(1, seed=1).requires_grad_(), _r(4, seed=2).requires_grad_()
    f = lambda a, s, b: href.head_mix(a, s, b, 1e-6)  # noqa: E731
    assert torch.autograd.gradcheck(f, (a, s, b))
    g = _r(2, 3, 4, seed=3)
    got = torch.autograd.grad(f(a, s, b), (a, s, b), g)
    want = href.head_mix_bwd(g, a.detach(), s.detach(), b.detach())
    for name, gv in zip(("input", "scale", "base"), got):
        assert torch.allclose(gv, want[name][0]), name


@pytest.mark.parametrize("mhc", [2, 4, 8])
def test_apply_mix_emulated_grad_x_is_one_rounding(mhc):
    g = _r(5, 32).to(torch.bfloat16)
    mix = _r(5, mhc, 1, seed=1).float()
    got = aref.apply_mix_grad_x_emulated(g, mix)
    want = aref.apply_mix_bwd(g, torch.zeros(5, mhc, 32), mix)[0]
    assert_bf16_close(got, want, want.abs())


@pytest.mark.parametrize("mhc", [2, 4, 8])
def test_emulated_kernel_bits_are_within_the_bounds(mhc):
    """The bit-level emulations the GPU tests compare against agree with the float64 definitions."""
    x, r = _r(3, 64).to(torch.bfloat16), _r(3, mhc, 64, seed=1).to(torch.bfloat16)
    p, c = _r(3, mhc, 1, seed=2).float(), _r(3, mhc, mhc, seed=3).float()
    assert_bf16_close(pref.post_emulated(x, r, p, c), pref.post(x, r, p, c), pref.post_terms_abs(x, r, p, c))
    g = _r(3, mhc, 64, seed=4).to(torch.bfloat16)
    gx, gr = pref.post_bwd_emulated(g, p, c)
    want = pref.post_bwd(g, x, r, p, c)
    assert_bf16_close(gx, *want["x"])
    assert_bf16_close(gr, *want["residual"])
    assert_bf16_close(aref.apply_mix_emulated(r, p), aref.apply_mix(r, p), aref.apply_mix_terms_abs(r, p))
    old = _r(3, mhc, 64, seed=5).to(torch.bfloat16)
    gi = _r(3, 64, seed=6).to(torch.bfloat16)
    acc = aref.apply_mix_grad_x_acc_emulated(gi, p, old)
    exact = aref.apply_mix_bwd(gi, r, p)[0] + old.double()
    assert_bf16_close(acc, exact, exact.abs() + old.double().abs())
