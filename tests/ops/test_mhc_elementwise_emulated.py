"""The mHC stream ops (``expand_to_mhc``, ``mhc_pre_apply_mix``, ``mhc_post``,
``mhc_head_compute_mix``) end to end on CPU, each kernel replaced by an emulator (torch) that
takes the kernel's parameters in the PrimFunc's order (checked against the TileLang PrimFuncs)
and follows its documented arithmetic.

What this proves without a GPU: the op layer passes the right tensors and scalars in the right
order and variant, returns tile_kernels' dtypes and shapes (leading dims, 0 tokens, ``out=``),
and wires the backward (incl. the fused residual-gradient accumulation between ``mhc_post`` and
``mhc_pre_apply_mix``) to the gradients of the float64 references.  The kernels' own arithmetic
is tested on the H200 (tests/gpu/test_gpu_mhc_elementwise.py).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from mhc_ref import apply_mix as aref
from mhc_ref import expand as eref
from mhc_ref import head as href
from mhc_ref import post as pref
from mhc_ref.close import assert_bf16_close, assert_bitwise, assert_fp32_close
from tilebin.modeling.mhc.ops import expand as ex
from tilebin.modeling.mhc.ops import head_compute_mix as hm
from tilebin.modeling.mhc.ops import post as po
from tilebin.modeling.mhc.ops import pre_apply_mix as am
from tilebin.ops import _spec

F32, BF16 = torch.float32, torch.bfloat16


def _fma(a, b, c):
    """fp32 fused multiply-add, emulated in float64 (exact product, one rounding of the sum
    up to float64's own rounding)."""
    return (a.double() * b.double() + c.double()).float()


def _expand_fwd(x, out):
    out.copy_(x.unsqueeze(1).expand_as(out))


def _expand_bwd(grad_out, grad_x):
    grad_x.copy_(eref.expand_bwd_emulated(grad_out))


def _apply_fwd(x, mix, out):
    acc = mix[:, :1] * x[:, 0].float()
    for m in range(1, x.shape[1]):
        acc = _fma(mix[:, m:m + 1], x[:, m].float(), acc)
    out.copy_(acc.to(BF16))


def _apply_bwd(grad_out, x, mix, grad_x, grad_mix, accumulate):
    assert type(accumulate) is int and accumulate in (0, 1)
    g = grad_out.float().unsqueeze(1)
    w = mix.unsqueeze(-1)
    new = _fma(w, g, grad_x.float()) if accumulate else w * g
    grad_mix.copy_((g.double() * x.double()).sum(-1).float())
    grad_x.copy_(new.to(BF16))


def _post_fwd(x, residual, post_mix, comb_mix, out):
    m = residual.shape[1]
    for n in range(m):
        acc = post_mix[:, n:n + 1] * x.float()
        for k in range(m):
            acc = _fma(comb_mix[:, k, n:n + 1], residual[:, k].float(), acc)
        out[:, n] = acc.to(BF16)


def _post_bwd(grad_out, x, residual, post_mix, comb_mix, grad_x, grad_residual, grad_post_mix, grad_comb_mix):
    g, r = grad_out.double(), residual.double()
    gx, gr = pref.post_bwd_emulated(grad_out, post_mix.unsqueeze(-1), comb_mix)
    grad_x.copy_(gx)
    grad_residual.copy_(gr)
    grad_post_mix.copy_((g * x.double().unsqueeze(1)).sum(-1).float())
    grad_comb_mix.copy_(torch.einsum("tmi,tni->tmn", r, g).float())


def _head_fwd(input_mix, scale, base, output_mix, pre_eps):
    assert type(pre_eps) is float
    output_mix.copy_(torch.sigmoid(_fma(input_mix, scale, base)) + pre_eps)


def _head_bwd(grad_output, input_mix, scale, base, grad_input, partial, grad_scale, grad_base):
    assert partial.shape == (128, 9) and partial.dtype == F32  # the kernel meta: parts 128, max_mhc 8
    s = torch.sigmoid(_fma(input_mix, scale, base))
    d = s * (1 - s) * grad_output
    grad_input.copy_(d * scale)
    grad_scale.copy_((d.double() * input_mix.double()).sum().reshape(1).float())
    grad_base.copy_(d.double().sum(0).float())


EMULATORS = {
    "mhc.expand_fwd": _expand_fwd, "mhc.expand_bwd": _expand_bwd,
    "mhc.pre_apply_mix_fwd": _apply_fwd, "mhc.pre_apply_mix_bwd": _apply_bwd,
    "mhc.post_fwd": _post_fwd, "mhc.post_bwd": _post_bwd,
    "mhc.head_compute_mix_fwd": _head_fwd, "mhc.head_compute_mix_bwd": _head_bwd,
}
KERNEL_FILES = {"expand": ("mhc.expand_fwd", "mhc.expand_bwd"),
                "pre_apply_mix": ("mhc.pre_apply_mix_fwd", "mhc.pre_apply_mix_bwd"),
                "post": ("mhc.post_fwd", "mhc.post_bwd"),
                "head_compute_mix": ("mhc.head_compute_mix_fwd", "mhc.head_compute_mix_bwd")}


def _prim_params() -> dict[tuple[str, tuple], list[tuple[str, tuple | None, str]]]:
    """``{(kernel, key): [(param, shape or None, dtype)]}`` traced from the TileLang PrimFuncs."""
    tilelang = pytest.importorskip("tilelang")
    from tvm.target import Target

    del tilelang
    out = {}
    for mod in KERNEL_FILES:
        decls = importlib.import_module(f"tilebin.kernels.mhc.{mod}").KERNELS
        for decl in decls:
            for variant in decl.grid:
                with Target({"kind": "cuda", "arch": "sm_90a"}):
                    func = decl.factory(**dict(variant))
                params = []
                for p in func.params:
                    buf = func.buffer_map.get(p)
                    if buf is None:
                        params.append((p.name, None, str(p.dtype)))
                    else:
                        params.append((buf.name, tuple(str(s) for s in buf.shape), str(buf.dtype)))
                out[(decl.name, tuple(sorted(variant.items())))] = params
    return out


@pytest.fixture(scope="module")
def prim_params():
    return _prim_params()


@pytest.fixture
def launches(monkeypatch, prim_params):
    """Every launch recorded as (kernel, key, args), checked against the PrimFunc (count, ranks,
    dtypes, int/float scalars) and then emulated.  The OpSpecs' device check is off (CPU tensors)
    and their memos fresh (plans built under this launcher, forgotten after the test)."""
    log = []
    monkeypatch.setattr(_spec, "check_cuda", lambda *a, **k: None)

    def launcher(name, **key):
        params = prim_params[(name, tuple(sorted(key.items())))]

        def launch(*args):
            assert len(args) == len(params), (name, len(args), len(params))
            for a, (pname, shape, dtype) in zip(args, params):
                if shape is None:
                    want = int if dtype.startswith("int") else float
                    assert type(a) is want, (name, pname, type(a), dtype)
                else:
                    assert isinstance(a, torch.Tensor) and a.dim() == len(shape), (name, pname, a.shape, shape)
                    assert str(a.dtype).removeprefix("torch.") == dtype, (name, pname, a.dtype, dtype)
                    assert a.is_contiguous(), (name, pname)
                    for s, want in zip(a.shape, shape):
                        if want.isdigit():
                            assert s == int(want), (name, pname, a.shape, shape)
            log.append((name, dict(key), args))
            EMULATORS[name](*args)

        return launch

    for mod in (ex, am, po, hm):
        monkeypatch.setattr(mod, "launcher", launcher)
        for spec in mod.SPECS:
            monkeypatch.setattr(spec, "memo", {})
    return log


def _bf16(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(BF16)


def _f32(*shape, seed=0, lo=-1.0, hi=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) * (hi - lo) + lo


def test_primfunc_parameter_lists(prim_params):
    names = {k[0]: [p[0] for p in v] for k, v in prim_params.items()}
    assert names["mhc.post_bwd"] == ["grad_out", "x", "residual", "post_mix", "comb_mix", "grad_x",
                                     "grad_residual", "grad_post_mix", "grad_comb_mix"]
    assert names["mhc.pre_apply_mix_bwd"][-1] == "accumulate"
    assert {k[1] for k in prim_params if k[0] == "mhc.post_fwd"} == {(("mhc", 2),), (("mhc", 4),), (("mhc", 8),)}


@pytest.mark.parametrize("lead", [(3,), (2, 5), (0,), (1, 1)])
@pytest.mark.parametrize("mhc", [4, 2, 8])
def test_expand(launches, lead, mhc):
    x = _bf16(*lead, 64).requires_grad_()
    out = ex.expand_to_mhc(x, mhc)
    assert out.shape == (*lead, mhc, 64) and out.dtype == BF16
    assert_bitwise(out.detach(), eref.expand(x.detach(), mhc))
    g = _bf16(*lead, mhc, 64, seed=1)
    out.backward(g)
    assert_bitwise(x.grad, eref.expand_bwd_emulated(g))
    names = [n for n, _, _ in launches]
    assert names == ([] if 0 in lead else ["mhc.expand_fwd", "mhc.expand_bwd"])


def test_expand_into_out(launches):
    x = _bf16(4, 128)
    out = torch.full((4, 4, 128), float("nan"), dtype=BF16)
    got = ex.expand_to_mhc(x, 4, out)
    assert got is out
    assert_bitwise(out, eref.expand(x, 4))


@pytest.mark.parametrize("lead", [(3,), (2, 5), (0,)])
@pytest.mark.parametrize("mhc", [4, 2, 8])
def test_apply_mix(launches, lead, mhc):
    x = _bf16(*lead, mhc, 128).requires_grad_()
    mix = _f32(*lead, mhc, 1, seed=2, lo=0.0).requires_grad_()
    out = am.mhc_pre_apply_mix(x, mix)
    assert out.shape == (*lead, 128) and out.dtype == BF16
    assert_bf16_close(out.detach(), aref.apply_mix(x.detach(), mix.detach()), aref.apply_mix_terms_abs(x, mix.detach()))
    g = _bf16(*lead, 128, seed=3)
    out.backward(g)
    gx, gm, gm_abs = aref.apply_mix_bwd(g, x.detach(), mix.detach())
    assert_bitwise(x.grad, aref.apply_mix_grad_x_emulated(g, mix.detach()))
    assert_fp32_close(mix.grad.detach(), gm, gm_abs, "grad_mix")
    if not 0 in lead:
        assert [(n, k) for n, k, _ in launches] == [("mhc.pre_apply_mix_fwd", {"mhc": mhc}),
                                                   ("mhc.pre_apply_mix_bwd", {"mhc": mhc})]
        assert launches[1][2][-1] == 0  # a fresh gradient: no accumulation


@pytest.mark.parametrize("lead", [(3,), (2, 5), (0,)])
@pytest.mark.parametrize("mhc", [4, 2, 8])
def test_post(launches, lead, mhc):
    x = _bf16(*lead, 64).requires_grad_()
    r = _bf16(*lead, mhc, 64, seed=1).requires_grad_()
    p = _f32(*lead, mhc, 1, seed=2).requires_grad_()
    c = _f32(*lead, mhc, mhc, seed=3).requires_grad_()
    out = po.mhc_post(x, r, p, c)
    assert out.shape == r.shape and out.dtype == BF16
    args = [t.detach() for t in (x, r, p, c)]
    assert_bf16_close(out.detach(), pref.post(*args), pref.post_terms_abs(*args))
    g = _bf16(*lead, mhc, 64, seed=4)
    out.backward(g)
    want = pref.post_bwd(g, *args)
    assert_bf16_close(x.grad, *want["x"], "grad_x")
    assert_bf16_close(r.grad, *want["residual"], "grad_residual")
    assert_fp32_close(p.grad, *want["post_mix"], "grad_post_mix")
    assert_fp32_close(c.grad, *want["comb"], "grad_comb_mix")
    stash = getattr(r.untyped_storage(), "grad_from_mhc_post", None)
    assert stash is r.grad or torch.equal(stash, r.grad)  # left for the pre ops of this residual


def test_post_fwd_out_and_noncontiguous_residual(launches):
    x = _bf16(6, 64)
    r = _bf16(4, 6, 64, seed=1).transpose(0, 1)  # [6, 4, 64], not contiguous: copied as tile_kernels
    p, c = _f32(6, 4, 1, seed=2), _f32(6, 4, 4, seed=3)
    out = torch.empty(6, 4, 64, dtype=BF16)
    got = po.mhc_post_fwd(x, r, p, c, out=out)
    assert got is out
    assert_bf16_close(out, pref.post(x, r, p, c), pref.post_terms_abs(x, r, p, c))


def test_post_bwd_without_fusion_leaves_no_stash(launches):
    x, r = _bf16(5, 64), _bf16(5, 4, 64, seed=1)
    p, c, g = _f32(5, 4, 1, seed=2), _f32(5, 4, 4, seed=3), _bf16(5, 4, 64, seed=4)
    d = po.mhc_post_bwd(x, r, p, c, g, fuse_grad_acc=False)
    assert [t.shape for t in d] == [x.shape, r.shape, p.shape, c.shape]
    assert [t.dtype for t in d] == [BF16, BF16, F32, F32]
    assert not hasattr(r.untyped_storage(), "grad_from_mhc_post")


def test_fused_residual_gradient(launches):
    """residual -> apply_mix -> (sublayer) -> post(residual): the residual's gradient sums both
    paths, apply_mix's added in place into the gradient post's backward left (tile_kernels' protocol)."""
    t, m, h = 6, 4, 64
    r = _bf16(t, m, h).requires_grad_()
    pre = _f32(t, m, 1, seed=1, lo=0.0)
    p, c = _f32(t, m, 1, seed=2), _f32(t, m, m, seed=3)
    w = _bf16(t, m, h, seed=4).float()
    layer_in = am.mhc_pre_apply_mix(r, pre)
    y = (layer_in.float() * 2).to(BF16)
    out = po.mhc_post(y, r, p, c)
    (out.float() * w).sum().backward()
    bwd = [(n, a[-1]) for n, _, a in launches if n == "mhc.pre_apply_mix_bwd"]
    assert bwd == [("mhc.pre_apply_mix_bwd", 1)]  # accumulated into the stash
    # float64 reference of the same graph (the bf16 rounding of y's gradient included)
    g_out = w.to(BF16)
    d_post = pref.post_bwd(g_out, y.detach(), r.detach(), p, c)
    g_y = d_post["x"][0].to(BF16)
    g_layer_in = (g_y.double() * 2).to(BF16)
    via_apply = aref.apply_mix_bwd(g_layer_in, r.detach(), pre)[0]
    want = d_post["residual"][0] + via_apply
    # two bf16 roundings: post's gradient, then the in-place sum
    bound = (d_post["residual"][0].abs() + want.abs()) * 2.0**-8 + d_post["residual"][1] * 2.0**-20
    err = (r.grad.double() - want).abs()
    assert bool((err <= bound).all()), float((err - bound).max())
    assert float(via_apply.abs().mean()) > 0.1  # the apply path is not negligible: a lost term would show


@pytest.mark.parametrize("lead", [(3, 5), (2,), (0, 4)])
@pytest.mark.parametrize("mhc", [4, 1, 8])
def test_head_compute_mix(launches, lead, mhc):
    a = _f32(*lead, mhc, lo=-3, hi=3).requires_grad_()
    scale = torch.tensor([0.7]).requires_grad_()
    base = _f32(mhc, seed=1).requires_grad_()
    out = hm.mhc_head_compute_mix(a, scale, base, 1e-6)
    assert out.shape == a.shape and out.dtype == F32
    ref = href.head_mix(a.detach(), scale.detach(), base.detach(), 1e-6)
    assert_fp32_close(out.detach(), ref, ref.abs() + a.detach().abs(), "head mix", rel=2.0**-20)
    g = _f32(*lead, mhc, seed=2)
    out.backward(g)
    want = href.head_mix_bwd(g, a.detach(), scale.detach(), base.detach())
    assert_fp32_close(a.grad, *want["input"], "grad_input")
    assert_fp32_close(scale.grad, *want["scale"], "grad_scale")
    assert_fp32_close(base.grad, *want["base"], "grad_base")


def test_head_compute_mix_strided_input(launches):
    mixes = _f32(2, 3, 24, lo=-2, hi=2)
    view = mixes[..., :4]  # mhc_head's slice of the pre-norm mixes
    out = hm.mhc_head_compute_mix(view, torch.tensor([1.5]), _f32(4, seed=1), 1e-6)
    ref = href.head_mix(view, torch.tensor([1.5]), _f32(4, seed=1), 1e-6)
    assert_fp32_close(out, ref, ref.abs() + view.abs(), "strided", rel=2.0**-20)
