"""CPU sanity of the float64 references in ``tests/mhc_ref/norm_fn.py`` and ``big_fuse.py``: the TF32
rounding, the forward against a direct evaluation, the closed-form gradients against autograd,
autograd against central finite differences (the definition), and the big-fuse composition."""

from __future__ import annotations

import pytest
import torch

from mhc_ref import big_fuse as bref
from mhc_ref import norm_fn as ref


def test_tf32_rounds_half_away_from_zero_and_clears_low_bits():
    u = 2.0 ** -10  # TF32 spacing at 1
    vals = torch.tensor([1.0, 1 + u / 2, 1 + u / 2 - 2 ** -23, 1 + u / 2 + 2 ** -23, -(1 + u / 2), 3 * u, 0.0, -0.0])
    want = torch.tensor([1.0, 1 + u, 1.0, 1 + u, -(1 + u), 3 * u, 0.0, -0.0])
    got = ref.tf32(vals)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    r = ref.tf32(x)
    assert int((r.view(torch.int32) & 0x1FFF).abs().sum()) == 0
    assert bool(((r - x).abs() <= x.abs() * 2.0 ** -11).all())


def test_fn_eff_multiplies_in_fp32_then_rounds():
    g = torch.Generator().manual_seed(1)
    fn, w = torch.randn(24, 256, generator=g), torch.randn(256, generator=g)
    assert torch.equal(ref.fn_eff(fn, w), ref.tf32(fn * w))
    assert torch.equal(ref.fn_eff(fn, None), ref.tf32(fn))


def _inputs(outer=(2, 3), m=4, h=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    res = torch.randn(*outer, m, h, generator=g).to(torch.bfloat16)
    fn = torch.randn(m * (m + 2), m * h, generator=g) * 0.1
    w = 1 + 0.2 * torch.randn(m * h, generator=g)
    return res, fn, w


@pytest.mark.parametrize("weight", [False, True])
def test_forward_is_the_definition(weight):
    res, fn, w = _inputs()
    w = w if weight else None
    got = ref.pre_norm_fn(res, fn, w, 1e-6)
    x = res.reshape(-1, 256).double()
    f = ref.fn_eff(fn, w).double()
    want = torch.stack([torch.stack([(x[t] * f[j]).sum() / ((x[t] ** 2).mean() + 1e-6).sqrt() for j in range(24)])
                        for t in range(x.shape[0])])
    torch.testing.assert_close(got.reshape(-1, 24), want, rtol=1e-12, atol=1e-12)
    assert got.dtype == torch.float64 and tuple(got.shape) == (2, 3, 24)


@pytest.mark.parametrize("weight", [False, True])
@pytest.mark.parametrize("m", [4, 2])
def test_closed_form_gradients_equal_autograd(weight, m):
    res, fn, w = _inputs((5,), m, 64, seed=2)
    fn = fn[: m * (m + 2), : m * 64].contiguous()
    w = w[: m * 64].contiguous() if weight else None
    go = torch.randn(5, m * (m + 2), generator=torch.Generator().manual_seed(3))
    a = ref.pre_norm_fn_grads(res, fn, w, 1e-6, go)
    c = ref.pre_norm_fn_grads_closed(res, fn, w, 1e-6, go)
    for x, y in zip(a, c):
        if x is None:
            assert y is None
        else:
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


def test_autograd_equals_finite_differences():
    """The definition in float64 (x as a real variable, fn_eff = fn * w + the fixed TF32 offset)."""
    res, fn, w = _inputs((3,), 2, 64, seed=4)
    fn, w = fn[:8, :128].contiguous(), w[:128].contiguous()
    go = torch.randn(3, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    dx, dfn, dw = ref.pre_norm_fn_grads(res, fn, w, 1e-6, go)
    x0, f0, w0 = res.reshape(3, 128).double(), fn.double(), w.double()
    offset = ref.fn_eff(fn, w).double() - f0 * w0

    def loss(x, f, v):
        rms = ((x * x).sum(-1, keepdim=True) / 128 + 1e-6).rsqrt()
        return float(((x @ (f * v + offset).T) * rms * go).sum())

    h = 1e-6
    for arg, grad, idx in ((0, dx.reshape(3, 128), [(0, 5), (2, 127), (1, 64)]),
                           (1, dfn, [(0, 0), (7, 100), (3, 64)]), (2, dw, [(0,), (77,), (127,)])):
        for i in idx:
            args = [x0.clone(), f0.clone(), w0.clone()]
            args[arg][i] += h
            hi = loss(*args)
            args[arg][i] -= 2 * h
            fd = (hi - loss(*args)) / (2 * h)
            assert abs(fd - float(grad[i])) <= 1e-6 * (1 + abs(fd)), (arg, i, fd, float(grad[i]))


def test_sinkhorn_reference_is_doubly_stochastic_and_follows_the_steps():
    x = torch.randn(7, 4, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    p = bref.sinkhorn(x, 30, 1e-6)
    torch.testing.assert_close(p.sum(-1), torch.ones(7, 4, dtype=torch.float64), rtol=0, atol=1e-4)
    torch.testing.assert_close(p.sum(-2), torch.ones(7, 4, dtype=torch.float64), rtol=0, atol=1e-4)
    q = x.softmax(-1) + 1e-6
    q = q / (q.sum(-2, keepdim=True) + 1e-6)
    torch.testing.assert_close(bref.sinkhorn(x, 1, 1e-6), q, rtol=0, atol=0)


def test_big_fuse_reference_composition():
    res, fn, _ = _inputs((2, 3), 4, 64, seed=7)
    g = torch.Generator().manual_seed(8)
    scale, base = torch.rand(3, generator=g), torch.randn(24, generator=g)
    post, comb, li = bref.pre_big_fuse(res, fn, scale, base, 1e-6, 1e-3, 1e-6, 2.0, 5)
    mixes = ref.pre_norm_fn(res, fn, None, 1e-6)
    z = mixes * torch.cat([scale[0].expand(4), scale[1].expand(4), scale[2].expand(16)]).double() + base.double()
    torch.testing.assert_close(post[..., 0], z[..., 4:8].sigmoid() * 2.0, rtol=1e-12, atol=0)
    torch.testing.assert_close(comb, bref.sinkhorn(z[..., 8:].reshape(2, 3, 4, 4), 5, 1e-6), rtol=1e-12, atol=0)
    pre = z[..., :4].sigmoid() + 1e-3
    torch.testing.assert_close(li, (res.double() * pre[..., None]).sum(-2), rtol=1e-12, atol=1e-12)
    assert tuple(post.shape) == (2, 3, 4, 1) and tuple(comb.shape) == (2, 3, 4, 4) and tuple(li.shape) == (2, 3, 64)
