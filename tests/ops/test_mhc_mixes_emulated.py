"""The mHC mixes ops (``sinkhorn_normalize``, ``mhc_pre_split_mixes``, ``mhc_multilayer_recompute``)
on CPU tensors with each kernel replaced by a torch emulation of its contract (the device check
stubbed): the op layer's plumbing (views, output layouts, the autograd wiring, the backward's
scratch and per-block partial sums, the pointer table) against the references, and which kernels
launch with which variant keys (none for 0 tokens)."""

from __future__ import annotations

import pytest
import torch

from mhc_ref import recompute as rref
from mhc_ref import sinkhorn as sref
from mhc_ref import split_mixes as mref
from tilebin.modeling.mhc.ops import multilayer_recompute as rc
from tilebin.modeling.mhc.ops import pre_split_mixes as sm
from tilebin.modeling.mhc.ops import sinkhorn as sk
from tilebin.ops import _spec


class Emulator:
    """Stands in for ``launcher``: each kernel writes what its contract says, in torch."""

    def __init__(self, monkeypatch):
        self.launches: list[tuple[str, dict]] = []
        self.by_ptr: dict[int, torch.Tensor] = {}
        for mod in (sk, sm, rc):
            monkeypatch.setattr(mod, "launcher", self.launcher)
            for spec in mod.SPECS:  # plans built under this launcher, forgotten after the test
                monkeypatch.setattr(spec, "memo", {})
        for mod in (rc, _spec):  # the OpSpecs' device check, and recompute's of its lists' tensors
            monkeypatch.setattr(mod, "check_cuda", lambda *a, **k: None)
        monkeypatch.setattr(sm, "get_num_sms", lambda device=None: 3)

    def launcher(self, name, **key):
        def launch(*args):
            self.launches.append((name, dict(key)))
            getattr(self, name.split(".")[1])(*args)
        return launch

    @staticmethod
    def sinkhorn_fwd(x, out, repeat, eps):
        assert x.dim() == 3 and x.is_contiguous() and type(repeat) is int and type(eps) is float
        out.copy_(sref.sinkhorn_fwd_emulated(x, repeat, eps))

    @staticmethod
    def sinkhorn_bwd(g, x, grad_in, work, eps):
        steps, n, m = work.shape
        assert steps % 2 == 1 and (n, m, m) == tuple(x.shape) == tuple(g.shape) and g.is_contiguous()
        grad_in.copy_(sref.sinkhorn_bwd_emulated(g, x, (steps + 1) // 2, eps))

    @staticmethod
    def pre_split_mixes_fwd(mixes, scale, base, pre, post, comb, post_mult, pre_eps):
        m = pre.shape[1]
        p, q, c = mref.split_mixes(mixes, scale, base, m, post_mult, pre_eps, torch.float32)
        pre.copy_(p.view(pre.shape)); post.copy_(q.view(post.shape)); comb.copy_(c.view(comb.shape))

    @staticmethod
    def pre_split_mixes_bwd(gp, gq, gc, mixes, scale, base, grad_mixes, partial, post_mult):
        n, m = gp.shape
        k = m * (m + 2)
        blocks = partial.shape[0]
        assert partial.shape[1] == k + 3 and blocks == min(-(-n // sm.THREADS), 3)
        gm, _, _ = mref.split_mixes_bwd(gp, gq, gc, mixes, scale, base, m, post_mult, torch.float32)
        grad_mixes.copy_(gm)
        owner = (torch.arange(n) // sm.THREADS) % blocks  # the block whose stride covers each token
        for b in range(blocks):
            rows = owner == b
            _, gs, gb = mref.split_mixes_bwd(gp[rows], gq[rows], gc[rows], mixes[rows], scale, base, m, post_mult,
                                             torch.float32)
            partial[b, :k] = gb
            partial[b, k:] = gs

    def multilayer_recompute(self, initial, ptrs, num_post):
        layers = ptrs.shape[1]
        t = [[self.by_ptr[int(p)] if int(p) else None for p in row] for row in ptrs.tolist()]
        pre, inputs, outs, posts, combs, residuals = t
        ins, res = rref.recompute(initial, pre, outs[:num_post], posts[:num_post], combs[:num_post])
        assert len(ins) == layers
        for dst, src in zip(inputs, ins):
            dst.copy_(src.view(dst.shape))
        for dst, src in zip(residuals[:num_post], res):
            dst.copy_(src.view(dst.shape))


@pytest.fixture
def emu(monkeypatch):
    return Emulator(monkeypatch)


@pytest.mark.parametrize("shape,repeat", [((3, 4, 4), 10), ((2, 5, 4, 4), 3), ((4, 4), 1), ((9, 2, 2), 4),
                                          ((2, 8, 8), 2), ((0, 4, 4), 10)])
def test_sinkhorn_forward_and_backward(emu, shape, repeat):
    g = torch.Generator().manual_seed(len(shape) + repeat)
    x = torch.randn(shape, generator=g).requires_grad_()
    y = sk.sinkhorn_normalize(x, repeat=repeat, eps=1e-6)
    assert y.shape == x.shape and y.dtype == torch.float32
    x64 = x.detach().double().requires_grad_()
    want = sref.sinkhorn(x64, repeat, 1e-6)
    assert torch.allclose(y.double(), want, atol=1e-6)
    grad = torch.randn(shape, generator=g)
    (gx,) = torch.autograd.grad(y, x, grad)
    (want_gx,) = torch.autograd.grad(want, x64, grad.double())
    assert gx.shape == x.shape and torch.allclose(gx.double(), want_gx, atol=2e-6)
    m = shape[-1]
    kernels = [k for k, _ in emu.launches]
    assert kernels == ([] if x.numel() == 0 else ["mhc.sinkhorn_fwd", "mhc.sinkhorn_bwd"])
    assert all(key == {"mhc_mult": m} for _, key in emu.launches)


def test_sinkhorn_non_contiguous_input_and_expanded_grad(emu):
    x = torch.randn((4, 4, 3)).permute(2, 0, 1).requires_grad_()  # [3, 4, 4] view, not contiguous
    y = sk.sinkhorn_normalize(x)
    y.sum().backward()  # an expanded (stride 0) gradient
    x64 = x.detach().double().requires_grad_()
    sref.sinkhorn(x64).sum().backward()
    assert torch.allclose(x.grad.double(), x64.grad, atol=2e-6)


@pytest.mark.parametrize("lead,m,post_mult", [((2, 3), 4, 2.0), ((1, 1), 4, 1.0), ((300,), 4, 2.0), ((5, 77), 2, 0.5),
                                              ((2, 129), 8, 2.0), ((0, 3), 4, 2.0), ((4, 3), 4, 0.0)])
def test_split_mixes_forward_and_backward(emu, lead, m, post_mult):
    g = torch.Generator().manual_seed(m + len(lead))
    k = m * (m + 2)
    x = torch.randn((*lead, k), generator=g).requires_grad_()
    s = torch.randn(3, generator=g).requires_grad_()
    b = torch.randn(k, generator=g).requires_grad_()
    outs = sm.mhc_pre_split_mixes(x, s, b, m, post_mult, 1e-6)
    want = mref.split_mixes(x.detach(), s.detach(), b.detach(), m, post_mult, 1e-6, torch.float32)
    for o, w in zip(outs, want):
        assert o.shape == w.shape and torch.equal(o, w)
    grads = [torch.randn(o.shape, generator=g) for o in outs]
    got = torch.autograd.grad(outs, (x, s, b), grads)
    x64, s64, b64 = (t.detach().double().requires_grad_() for t in (x, s, b))
    want = torch.autograd.grad(mref.split_mixes(x64, s64, b64, m, post_mult, 1e-6), (x64, s64, b64),
                               [gr.double() for gr in grads])
    for h, w in zip(got, want):
        assert h.shape == w.shape and h.dtype == torch.float32
        assert torch.allclose(h.double(), w, rtol=1e-5, atol=1e-5 * max(1.0, float(w.abs().amax()) if w.numel() else 0.0))
    n = x.numel() // k
    assert [k for k, _ in emu.launches] == ([] if n == 0 else ["mhc.pre_split_mixes_fwd", "mhc.pre_split_mixes_bwd"])


def test_split_mixes_unused_outputs_get_zero_gradients(emu):
    x = torch.randn((3, 5, 24)).requires_grad_()
    s, b = torch.ones(3, requires_grad=True), torch.zeros(24, requires_grad=True)
    pre, _, _ = sm.mhc_pre_split_mixes(x, s, b, 4, 2.0, 1e-6)
    pre.sum().backward()
    assert bool((x.grad[..., 4:] == 0).all()) and bool((x.grad[..., :4] != 0).all())
    assert float(s.grad[1]) == 0.0 and float(s.grad[2]) == 0.0


@pytest.mark.parametrize("n,m,hidden,layers,post", [(5, 4, 64, 3, 2), (5, 4, 64, 3, 3), (1, 2, 8, 1, 0),
                                                    (3, 8, 128, 2, 2), (0, 4, 64, 2, 1)])
def test_recompute(emu, n, m, hidden, layers, post):
    g = torch.Generator().manual_seed(n + layers)
    res = torch.randn((n, m, hidden), generator=g).bfloat16()
    pre = [torch.rand((n, m, 1), generator=g) for _ in range(layers)]
    outs = [torch.randn((n, hidden), generator=g).bfloat16() for _ in range(post)]
    posts = [torch.rand((n, m, 1), generator=g) for _ in range(post)]
    combs = [torch.rand((n, m, m), generator=g) for _ in range(post)]
    inputs = [torch.empty((n, hidden), dtype=torch.bfloat16) for _ in range(layers)]
    residuals = [torch.empty((n, m, hidden), dtype=torch.bfloat16) for _ in range(post)]
    for t in pre + outs + posts + combs + inputs + residuals:
        emu.by_ptr[t.data_ptr()] = t
    assert rc.mhc_multilayer_recompute(res, pre, outs, posts, combs, inputs, residuals) is None
    if n == 0:
        assert emu.launches == []
        return
    assert emu.launches == [("mhc.multilayer_recompute", {"mhc_mult": m})]
    want_in, want_res = rref.recompute(res, pre, outs, posts, combs)
    for a, b in zip(inputs + residuals, want_in + want_res):
        assert torch.equal(a.view(b.shape), b)


_KERNEL_FILES = {"mhc.sinkhorn_fwd": "sinkhorn", "mhc.sinkhorn_bwd": "sinkhorn",
                 "mhc.pre_split_mixes_fwd": "pre_split_mixes", "mhc.pre_split_mixes_bwd": "pre_split_mixes",
                 "mhc.multilayer_recompute": "multilayer_recompute"}


def _signature_check(name: str, key: dict, args: tuple) -> None:
    """The launch matches the PrimFunc: parameter count, tensor dtypes and ranks, static dims,
    one value per dynamic dim, scalar types (the unchecked launcher checks none of this)."""
    import importlib

    from tvm.target import Target

    module = importlib.import_module(f"tilebin.kernels.mhc.{_KERNEL_FILES[name]}")
    (decl,) = [d for d in module.KERNELS if d.name == name]
    with Target({"kind": "cuda", "arch": "sm_90a"}):
        func = decl.factory(**key)
    assert len(func.params) == len(args), (name, len(func.params), len(args))
    bound: dict[str, int] = {}
    for var, arg in zip(func.params, args):
        if var in func.buffer_map:
            buf = func.buffer_map[var]
            assert isinstance(arg, torch.Tensor) and arg.is_contiguous(), (name, buf.name)
            assert str(arg.dtype).removeprefix("torch.") == str(buf.dtype), (name, buf.name, arg.dtype, buf.dtype)
            assert arg.dim() == len(buf.shape), (name, buf.name, tuple(arg.shape), buf.shape)
            for dim, size in zip(buf.shape, arg.shape):
                if hasattr(dim, "value"):
                    assert int(dim.value) == size, (name, buf.name, tuple(arg.shape), buf.shape)
                else:
                    assert bound.setdefault(str(dim), size) == size, (name, buf.name, str(dim), bound, size)
        else:
            want = float if "float" in str(var.dtype) else int
            assert type(arg) is want, (name, var.name, type(arg))


def test_launches_match_the_kernels_signatures(monkeypatch):
    pytest.importorskip("tilelang", reason="tracing the kernels needs tilelang")
    recorded = []
    emu = Emulator(monkeypatch)
    inner = emu.launcher

    def launcher(name, **key):
        fn = inner(name, **key)

        def launch(*args):
            recorded.append((name, key, args))
            fn(*args)
        return launch

    for mod in (sk, sm, rc):
        monkeypatch.setattr(mod, "launcher", launcher)
    for m in (4, 2):
        x = torch.randn((3, 5, m * (m + 2)), requires_grad=True)
        s, b = torch.ones(3, requires_grad=True), torch.zeros(m * (m + 2), requires_grad=True)
        pre, post, comb = sm.mhc_pre_split_mixes(x, s, b, m, 2.0, 1e-6)
        y = sk.sinkhorn_normalize(comb, 3, 1e-6)
        torch.autograd.backward([y, pre, post], [torch.ones_like(y), torch.ones_like(pre), torch.ones_like(post)])
        res = torch.randn((15, m, 64)).bfloat16()
        ins = [torch.empty((15, 64), dtype=torch.bfloat16) for _ in range(2)]
        outs = [torch.randn((15, 64)).bfloat16()]
        rs = [torch.empty((15, m, 64), dtype=torch.bfloat16)]
        for t in [pre, post, comb] + ins + outs + rs:
            emu.by_ptr[t.data_ptr()] = t
        rc.mhc_multilayer_recompute(res, [pre, pre], outs, [post], [comb.detach()], ins, rs)
    assert sorted({n for n, _, _ in recorded}) == sorted([rc._KERNEL, "mhc.pre_split_mixes_bwd", sm._FWD_KERNEL,
                                                          "mhc.sinkhorn_bwd", "mhc.sinkhorn_fwd"])
    for name, key, args in recorded:
        _signature_check(name, key, args)
