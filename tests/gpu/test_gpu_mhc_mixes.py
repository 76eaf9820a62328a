"""GPU tests of ``sinkhorn_normalize``, ``mhc_pre_split_mixes`` and ``mhc_multilayer_recompute``
(``tilebin.modeling.mhc.ops``) against the references in ``tests/mhc_ref``.

Grid: tile_kernels' token counts n0 {1, 2} x n1 {1, 13, 48, 512, 1024, 4096, 8192} at mhc_mult 4
(hidden {1280, 2560, 4096, 7168} for the recompute, the only op here that has one), plus 0 tokens,
mhc_mult 2 and 8, other repeat counts / eps / post_mult_value, and odd shapes.

- Sinkhorn: forward within 1e-6 of the float64 definition (values are <= 1), the gradient within
  2e-6 * max(1, max|grad|) of float64 autograd (the kernels' fp32 algorithm is shown as close as
  fp32 autograd of the definition in tests/ops/test_mhc_mixes_ref.py).
- Split mixes: comb bit-exact against fp32 torch (``x * scale + base``, two roundings, as the
  kernel), pre/post within 1e-6 (x post_mult_value) of float64; grad input_mixes within 1e-5
  relative of float64 autograd; the scale and base gradients (sums over tokens) within the fp32
  summation bound ``1e-6 * tokens * max|term|`` (a wrong gradient is off by the sum itself).
- Multilayer recompute: bit-exact against the fp32 reference (same operation order, no FMA).
- Outputs are poisoned first (0xFF in the allocator's free memory: NaN; explicit NaN fill for the
  recompute's caller-owned outputs), so unwritten elements show up; fwd + bwd of Sinkhorn and
  split mixes replay under CUDA-graph capture bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import poison_cache, seed
from mhc_ref import recompute as rref
from mhc_ref import sinkhorn as sref
from mhc_ref import split_mixes as mref

KERNELS = ("sinkhorn_fwd", "sinkhorn_bwd", "pre_split_mixes_fwd", "pre_split_mixes_bwd", "multilayer_recompute")
N0, N1 = (1, 2), (1, 13, 48, 512, 1024, 4096, 8192)
HIDDEN = (1280, 2560, 4096, 7168)
GRID = [(a, b) for a in N0 for b in N1]


@pytest.fixture(scope="module")
def ops(require):
    for name in KERNELS:
        require(f"mhc.{name}")
    from tilebin.modeling.mhc.ops import multilayer_recompute, pre_split_mixes, sinkhorn

    return sinkhorn, pre_split_mixes, multilayer_recompute


def _check_close(got: torch.Tensor, want: torch.Tensor, atol: float, what: str, rtol: float = 0.0) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    if not got.numel():
        return
    g, w = got.double(), want.double()
    err = (g - w).abs()
    bad = ~(err <= atol + rtol * w.abs())  # NaN counts as bad
    if bool(bad.any()):
        i = int(torch.nan_to_num(err, nan=float("inf")).flatten().argmax())
        raise AssertionError(f"{what}: {int(bad.sum())}/{got.numel()} outside atol={atol:.1e} rtol={rtol:.0e}; "
                             f"worst flat index {i}: got {g.flatten()[i].item()!r}, want {w.flatten()[i].item()!r}")


# ---------------------------------------------------------------- Sinkhorn
def _sinkhorn_case(sk, shape, repeat, eps, scale=1.0):
    x = torch.randn(shape, device="cuda") * scale
    grad = torch.randn(shape, device="cuda")
    xg = x.clone().requires_grad_()
    poison_cache(3 * x.numel() * 4 + (2 * repeat) * x.numel())
    y = sk.sinkhorn_normalize(xg, repeat=repeat, eps=eps)
    poison_cache(3 * x.numel() * 4 + (2 * repeat) * x.numel())
    (gx,) = torch.autograd.grad(y, xg, grad)
    x64 = x.double().requires_grad_()
    want = sref.sinkhorn(x64, repeat, eps)
    (want_gx,) = torch.autograd.grad(want, x64, grad.double())
    what = f"sinkhorn {tuple(shape)} repeat={repeat} eps={eps} scale={scale}"
    assert y.dtype == gx.dtype == torch.float32
    _check_close(y, want.detach(), 1e-6, what + " forward")
    bound = 2e-6 * max(1.0, float(want_gx.abs().max()) if want_gx.numel() else 0.0)
    _check_close(gx, want_gx, bound, what + " grad")


@pytest.mark.parametrize("n0,n1", GRID, ids=[f"{a}x{b}" for a, b in GRID])
def test_sinkhorn_grid(ops, n0, n1):
    seed("sinkhorn", n0, n1)
    _sinkhorn_case(ops[0], (n0, n1, 4, 4), 10, 1e-6)


@pytest.mark.parametrize("shape,repeat,eps,scale", [
    ((0, 4, 4), 10, 1e-6, 1.0), ((4, 4), 10, 1e-6, 1.0), ((3, 333, 4, 4), 1, 1e-6, 1.0),
    ((4097, 4, 4), 3, 1e-3, 1.0), ((2, 1000, 4, 4), 25, 1e-6, 1.0), ((8191, 4, 4), 10, 1e-6, 8.0),
    ((2, 777, 2, 2), 10, 1e-6, 1.0), ((1, 999, 8, 8), 10, 1e-6, 1.0), ((5, 8, 8), 4, 1e-4, 3.0),
])
def test_sinkhorn_shapes_and_settings(ops, shape, repeat, eps, scale):
    seed("sinkhorn-var", shape, repeat)
    _sinkhorn_case(ops[0], shape, repeat, eps, scale)


# ---------------------------------------------------------------- split mixes
def _split_case(smod, lead, m, post_mult, pre_eps=1e-6):
    k = m * (m + 2)
    x = torch.randn((*lead, k), device="cuda")
    s = torch.randn(3, device="cuda")
    b = torch.randn(k, device="cuda")
    xs, ss, bs = (t.clone().requires_grad_() for t in (x, s, b))
    poison_cache(8 * x.numel() * 4)
    outs = smod.mhc_pre_split_mixes(xs, ss, bs, m, post_mult, pre_eps)
    what = f"split_mixes {lead} M={m} post_mult={post_mult}"
    p32, q32, c32 = mref.split_mixes(x, s, b, m, post_mult, pre_eps, torch.float32)
    p64, q64, _ = mref.split_mixes(x, s, b, m, post_mult, pre_eps)
    assert [tuple(o.shape) for o in outs] == [(*lead, m, 1), (*lead, m, 1), (*lead, m, m)]
    assert all(o.dtype == torch.float32 for o in outs)
    assert_bits_equal(outs[2], c32, what + " comb")
    _check_close(outs[0], p64, 1e-6, what + " pre")
    _check_close(outs[1], q64, 1e-6 * max(1.0, abs(post_mult)), what + " post")
    grads = [torch.randn(o.shape, device="cuda") for o in outs]
    poison_cache(8 * x.numel() * 4)
    got = torch.autograd.grad(outs, (xs, ss, bs), grads)
    x64, s64, b64 = (t.double().requires_grad_() for t in (x, s, b))
    want = torch.autograd.grad(mref.split_mixes(x64, s64, b64, m, post_mult, pre_eps), (x64, s64, b64),
                               [g.double() for g in grads])
    gmax = float(want[0].abs().max()) if want[0].numel() else 0.0
    _check_close(got[0], want[0], 1e-6 * max(1.0, gmax), what + " grad input_mixes", rtol=1e-5)
    # bound of an fp32 sum over the tokens: tokens * eps_fp32-ish * the largest term
    n = x.numel() // k
    # |dz| <= |grad| * max(1, |post_mult| / 4): sigmoid' <= 1/4; a term is dz or dz * x
    term = max(float(g.abs().max()) for g in grads) * max(1.0, abs(post_mult)) * (1 + float(x.abs().max())) if n else 0.0
    _check_close(got[1], want[1], 1e-6 * max(n, 1) * term + 1e-6, what + " grad scale")
    _check_close(got[2], want[2], 1e-6 * max(n, 1) * term + 1e-6, what + " grad base")


SPLIT_KERNELS = ("mhc.pre_split_mixes_fwd",)  # the kernels the op may launch (a speed candidate joins here)


@pytest.fixture(params=SPLIT_KERNELS)
def split_kernel(request, ops, require, monkeypatch):
    """Which forward kernel ``mhc_pre_split_mixes`` launches."""
    require(request.param)
    monkeypatch.setattr(ops[1], "_FWD_KERNEL", request.param)
    monkeypatch.setattr(ops[1].SPLIT, "memo", {})  # its plans hold the kernel they were built with
    return request.param


@pytest.mark.parametrize("n0,n1", GRID, ids=[f"{a}x{b}" for a, b in GRID])
def test_split_mixes_grid(ops, split_kernel, n0, n1):
    seed("split", n0, n1)
    _split_case(ops[1], (n0, n1), 4, 2.0)


@pytest.mark.parametrize("lead,m,post_mult", [((0, 7), 4, 2.0), ((1, 0), 4, 2.0), ((33, 129), 4, 1.0),
                                              ((2, 4097), 4, 0.0), ((3, 1111), 2, 2.0), ((2, 999), 8, 2.0),
                                              ((20000,), 4, 2.0)])
def test_split_mixes_shapes_and_settings(ops, split_kernel, lead, m, post_mult):
    seed("split-var", lead, m)
    _split_case(ops[1], lead, m, post_mult)


# ---------------------------------------------------------------- multilayer recompute
def _recompute_case(rmod, n, m, hidden, layers, post):
    res = torch.randn((n, m, hidden), device="cuda").bfloat16()
    pre = [torch.rand((n, m, 1), device="cuda") for _ in range(layers)]
    outs = [torch.randn((n, hidden), device="cuda").bfloat16() for _ in range(post)]
    posts = [torch.rand((n, m, 1), device="cuda") * 2 for _ in range(post)]
    combs = [sref.sinkhorn(torch.randn((n, m, m), device="cuda"), 10, 1e-6).float() for _ in range(post)]
    nan = float("nan")
    inputs = [torch.full((n, hidden), nan, dtype=torch.bfloat16, device="cuda") for _ in range(layers)]
    residuals = [torch.full((n, m, hidden), nan, dtype=torch.bfloat16, device="cuda") for _ in range(post)]
    assert rmod.mhc_multilayer_recompute(res, pre, outs, posts, combs, inputs, residuals) is None
    want_in, want_res = rref.recompute(res, pre, outs, posts, combs)
    what = f"recompute n={n} M={m} hidden={hidden} layers={layers} post={post}"
    for i, (a, b) in enumerate(zip(inputs, want_in)):
        assert_bits_equal(a, b, f"{what} layer_input[{i}]")
    for i, (a, b) in enumerate(zip(residuals, want_res)):
        assert_bits_equal(a, b, f"{what} residual[{i}]")


RECOMPUTE_KERNELS = ("mhc.multilayer_recompute",)  # the kernels the op may launch (a speed candidate joins here)


@pytest.fixture(params=RECOMPUTE_KERNELS)
def recompute_kernel(request, ops, require, monkeypatch):
    """Which kernel ``mhc_multilayer_recompute`` launches."""
    require(request.param)
    monkeypatch.setattr(ops[2], "_KERNEL", request.param)
    return request.param


@pytest.mark.parametrize("n0,n1", GRID, ids=[f"{a}x{b}" for a, b in GRID])
def test_recompute_grid(ops, recompute_kernel, n0, n1):
    seed("recompute", n0, n1)
    _recompute_case(ops[2], n0 * n1, 4, 4096, 3, 2)


@pytest.mark.parametrize("n,m,hidden,layers,post", [
    *[(1024, 4, h, 4, 4) for h in HIDDEN], *[(1, 4, h, 2, 1) for h in HIDDEN],
    (0, 4, 7168, 3, 2), (8192, 4, 7168, 2, 1), (13, 4, 8192, 1, 0), (77, 4, 64, 6, 6),
    (333, 2, 1280, 3, 2), (129, 8, 2560, 3, 3),
])
def test_recompute_shapes(ops, recompute_kernel, n, m, hidden, layers, post):
    seed("recompute-var", n, m, hidden, layers)
    _recompute_case(ops[2], n, m, hidden, layers, post)


# ---------------------------------------------------------------- CUDA graphs
def test_sinkhorn_and_split_mixes_in_cuda_graph(ops):
    """split + Sinkhorn, forward and backward, captured after a warm-up; a replay on new inputs
    equals eager calls bit for bit."""
    sk, smod, _ = ops
    seed("graph")
    x = torch.randn((2, 1000, 24), device="cuda", requires_grad=True)
    s = torch.randn(3, device="cuda", requires_grad=True)
    b = torch.randn(24, device="cuda", requires_grad=True)
    go = torch.randn((2, 1000, 4, 4), device="cuda")

    def step():
        pre, post, comb = smod.mhc_pre_split_mixes(x, s, b, 4, 2.0, 1e-6)
        out = sk.sinkhorn_normalize(comb, 10, 1e-6)
        torch.autograd.backward([out, pre, post], [go, torch.ones_like(pre), torch.ones_like(post)])
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (x, s, b):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    with torch.no_grad():
        for t in (x, s, b, go):
            t.copy_(torch.randn(t.shape, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    got = [out.clone(), x.grad.clone(), s.grad.clone(), b.grad.clone()]
    for t in (x, s, b):
        t.grad = None
    eager = step()
    for name, a, w in zip(("out", "grad x", "grad scale", "grad base"), got, [eager, x.grad, s.grad, b.grad]):
        assert_bits_equal(a, w, f"mixes graph replay vs eager: {name}")
