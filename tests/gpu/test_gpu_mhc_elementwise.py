"""GPU tests of the mHC stream ops (``expand_to_mhc``, ``mhc_pre_apply_mix``, ``mhc_post``,
``mhc_head_compute_mix``) against ``mhc_ref``.

tile_kernels' grid: leading dims ``(n0, n1)`` with n0 {1, 2} x n1 {1, 13, 48, 512, 1024, 4096,
8192} x hidden {1280, 2560, 4096, 7168} at mhc 4 (n0 = 2 with n1 > 1024 at hidden 7168 only,
for time), plus 0 tokens, and mhc 2 and 8 on a few shapes.  Bit-exact: expand (a copy; the backward's fp32 stream sum), every bf16 output of
apply-mix and post forward and backward (their documented fp32 product / fused multiply-add
chains, emulated in ``mhc_ref``), each also within the float64 bound of ``mhc_ref.close``.  The
fp32 sums over hidden (the mix gradients) and the head mix are held to the float64 references
within fp32 summation bounds.  The fused residual-gradient accumulation (post's gradient left on
the residual's storage, apply-mix adding into it) is checked through autograd.  Before each op
call the caching allocator's free memory is filled with 0xFF (NaN for floats), so an element a
kernel forgot to write shows up.  The forwards also run the grid n1 {1, 13, 4096} x hidden {1280,
4096, 4160, 7168} x mhc {4, 2, 8}, ``out=`` (NaN-filled) given and not (``test_*_fwd_grid``).
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import poison_cache, seed
from mhc_ref import apply_mix as aref
from mhc_ref import expand as eref
from mhc_ref import head as href
from mhc_ref import post as pref
from mhc_ref.close import assert_bf16_close, assert_bitwise, assert_fp32_close

KERNELS = ("expand_fwd", "expand_bwd", "pre_apply_mix_fwd", "pre_apply_mix_bwd", "post_fwd", "post_bwd",
           "head_compute_mix_fwd", "head_compute_mix_bwd")
HIDDEN = (1280, 2560, 4096, 7168)
N1 = (1, 13, 48, 512, 1024, 4096, 8192)
# n0 = 2 up to 1024 tokens per sequence everywhere, and at 8192 for hidden 7168 only (the largest
# problem; the rest of n0 = 2 repeats n0 = 1's coverage at twice the test time)
LEADS = [(1, n1) for n1 in N1] + [(2, n1) for n1 in N1 if n1 <= 1024] + [(2, 0)]
BIG = [(2, 8192)]
OTHER_MHC = [(2, (1, 48), 4096), (8, (1, 48), 4096), (2, (2, 513), 7168), (8, (1, 13), 1280)]
BF16, F32 = torch.bfloat16, torch.float32


@pytest.fixture(scope="module")
def ops(require):
    for name in KERNELS:
        require(f"mhc.{name}")
    from tilebin.modeling.mhc import ops

    return ops


def _bf16(*shape):
    return torch.randn(*shape, device="cuda").to(BF16)


def _unit(*shape, lo=0.0, hi=1.0):
    return torch.rand(*shape, device="cuda") * (hi - lo) + lo


def _poison(*shape_like: torch.Tensor) -> None:
    poison_cache(4 * sum(t.numel() * t.element_size() for t in shape_like) + (64 << 20))


def _cases():
    for h in HIDDEN:
        for lead in LEADS + (BIG if h == 7168 else []):
            yield 4, lead, h
    yield from OTHER_MHC


def _small(lead) -> bool:
    """Also hold the bit-exact bf16 outputs to the float64 bounds (which validate the emulation)
    on shapes up to 2048 tokens; the large ones are checked bit for bit only (time)."""
    n = 1
    for d in lead:
        n *= d
    return n <= 2048


@pytest.mark.parametrize("hidden", HIDDEN)
def test_expand(ops, hidden):
    for m, lead, h in [c for c in _cases() if c[2] == hidden]:
        seed("expand", m, lead, h)
        x = _bf16(*lead, h).requires_grad_()
        _poison(x, x)
        out = ops.expand_to_mhc(x, m)
        assert_bitwise(out.detach(), eref.expand(x.detach(), m), f"expand {lead} h{h} m{m}")
        g = _bf16(*lead, m, h)
        _poison(g)
        (gx,) = torch.autograd.grad(out, x, g)
        assert_bitwise(gx, eref.expand_bwd_emulated(g), f"expand bwd {lead} h{h} m{m}")
        if _small(lead):
            assert_bf16_close(gx, eref.expand_bwd(g), g.double().abs().sum(-2), f"expand bwd {lead} h{h}")


def test_expand_into_out(ops):
    x = _bf16(3, 5, 4096)
    out = torch.empty(3, 5, 4, 4096, dtype=BF16, device="cuda").fill_(float("nan"))
    assert ops.expand_to_mhc(x, 4, out) is out
    assert_bitwise(out, eref.expand(x, 4))


@pytest.mark.parametrize("hidden", HIDDEN)
def test_apply_mix(ops, hidden):
    for m, lead, h in [c for c in _cases() if c[2] == hidden]:
        what = f"apply_mix {lead} h{h} m{m}"
        seed("apply_mix", m, lead, h)
        x = _bf16(*lead, m, h).requires_grad_()
        mix = _unit(*lead, m, 1).requires_grad_()
        _poison(x)
        out = ops.mhc_pre_apply_mix(x, mix)
        xd, md = x.detach(), mix.detach()
        assert_bitwise(out.detach(), aref.apply_mix_emulated(xd, md), what)
        if _small(lead):
            assert_bf16_close(out.detach(), aref.apply_mix(xd, md), aref.apply_mix_terms_abs(xd, md), what)
        g = _bf16(*lead, h)
        _poison(x, x)
        gx, gm = torch.autograd.grad(out, (x, mix), g)
        assert_bitwise(gx, aref.apply_mix_grad_x_emulated(g, md), what + " grad_x")
        _, want_m, terms = aref.apply_mix_bwd(g, xd, md)
        assert_fp32_close(gm, want_m, terms, what + " grad_mix")


@pytest.mark.parametrize("hidden", HIDDEN)
def test_post(ops, hidden):
    for m, lead, h in [c for c in _cases() if c[2] == hidden]:
        what = f"post {lead} h{h} m{m}"
        seed("post", m, lead, h)
        x = _bf16(*lead, h)
        r = _bf16(*lead, m, h)
        p = _unit(*lead, m, 1, hi=2.0)
        c = _unit(*lead, m, m)
        _poison(r, r)
        out = ops.mhc_post_fwd(x, r, p, c)
        assert_bitwise(out, pref.post_emulated(x, r, p, c), what)
        if _small(lead):
            assert_bf16_close(out, pref.post(x, r, p, c), pref.post_terms_abs(x, r, p, c), what)
        g = _bf16(*lead, m, h)
        _poison(r, r, r)
        d_x, d_r, d_p, d_c = ops.mhc_post_bwd(x, r, p, c, g, fuse_grad_acc=False)
        want = pref.post_bwd(g, x, r, p, c)
        ex, er = pref.post_bwd_emulated(g, p, c)
        assert_bitwise(d_x, ex, what + " d_x")
        assert_bitwise(d_r, er, what + " d_residual")
        if _small(lead):
            assert_bf16_close(d_x, *want["x"], what + " d_x")
            assert_bf16_close(d_r, *want["residual"], what + " d_residual")
        assert_fp32_close(d_p, *want["post_mix"], what + " d_post_layer_mix")
        assert_fp32_close(d_c, *want["comb"], what + " d_comb_res_mix")
        assert not hasattr(r.untyped_storage(), "grad_from_mhc_post")


def test_post_into_out_and_strided_residual(ops):
    x = _bf16(2, 48, 4096)
    r = _bf16(4, 2, 48, 4096).permute(1, 2, 0, 3)  # [2, 48, 4, 4096], not contiguous
    p, c = _unit(2, 48, 4, 1), _unit(2, 48, 4, 4)
    out = torch.empty(2, 48, 4, 4096, dtype=BF16, device="cuda").fill_(float("nan"))
    assert ops.mhc_post(x, r, p, c, out=out) is out
    assert_bitwise(out, pref.post_emulated(x, r, p, c))


GRID_N1 = (1, 13, 4096)
GRID_HIDDEN = (1280, 4096, 4160, 7168)  # 4160 = 65 x 64: a last 128-vector item of 8 vectors


def _grid(m: int, h: int):
    """The forward shapes the cp.async-ring kernels were verified on (n1 x hidden x mhc, ``out=``
    given and not) that ``test_apply_mix`` / ``test_post`` do not already run."""
    covered = {(mm, lead, hh) for mm, lead, hh in _cases()}
    for n1 in GRID_N1:
        for given in (False, True):
            if given or (m, (1, n1), h) not in covered:
                yield n1, given


def _into(fn, shape, given: bool) -> torch.Tensor:
    """``fn(out)`` into a NaN-filled ``out`` when ``given`` (the result must be ``out``'s storage),
    else ``fn(None)``."""
    if not given:
        return fn(None)
    out = torch.full(shape, float("nan"), dtype=BF16, device="cuda")
    assert fn(out).data_ptr() == out.data_ptr()
    return out


@pytest.mark.parametrize("m", (4, 2, 8))
@pytest.mark.parametrize("h", GRID_HIDDEN)
def test_apply_mix_fwd_grid(ops, m, h):
    for n1, given in _grid(m, h):
        seed("apply_mix_grid", m, n1, h, given)
        x, mix = _bf16(1, n1, m, h), torch.randn(1, n1, m, 1, device="cuda")
        _poison(x)
        out = _into(lambda o: ops.mhc_pre_apply_mix(x, mix, out=o), (1, n1, h), given)
        assert_bitwise(out, aref.apply_mix_emulated(x, mix), f"apply_mix n1 {n1} h{h} m{m} out={given}")


@pytest.mark.parametrize("m", (4, 2, 8))
@pytest.mark.parametrize("h", GRID_HIDDEN)
def test_post_fwd_grid(ops, m, h):
    for n1, given in _grid(m, h):
        seed("post_grid", m, n1, h, given)
        x, r = _bf16(1, n1, h), _bf16(1, n1, m, h)
        p, c = torch.randn(1, n1, m, 1, device="cuda") * 2, torch.randn(1, n1, m, m, device="cuda")
        _poison(r, r)
        out = _into(lambda o: ops.mhc_post_fwd(x, r, p, c, out=o), r.shape, given)
        assert_bitwise(out, pref.post_emulated(x, r, p, c), f"post n1 {n1} h{h} m{m} out={given}")


@pytest.mark.parametrize("lead,h", [((1, 512), 4096), ((2, 4096), 7168), ((1, 13), 1280)])
def test_fused_residual_gradient(ops, lead, h):
    """residual -> apply_mix -> sublayer -> post(., residual): apply-mix's residual gradient is
    added in place into the one post's backward left (one launch with accumulate=1), and the
    residual's gradient equals both paths' sum."""
    seed("fused", lead, h)
    r = _bf16(*lead, 4, h).requires_grad_()
    pre, p, c = _unit(*lead, 4, 1), _unit(*lead, 4, 1, hi=2.0), _unit(*lead, 4, 4)
    w = _bf16(*lead, 4, h)
    y = ops.mhc_pre_apply_mix(r, pre) * 2
    out = ops.mhc_post(y, r, p, c)
    _poison(r, r, r)
    out.backward(w)
    rd = r.detach()
    d_post = pref.post_bwd(w, y.detach(), rd, p, c)
    _, d_res_bits = pref.post_bwd_emulated(w, p, c)
    g_y = pref.post_bwd_emulated(w, p, c)[0]
    g_in = (g_y.float() * 2).to(BF16)
    assert_bitwise(r.grad, aref.apply_mix_grad_x_acc_emulated(g_in, pre, d_res_bits), f"fused {lead} h{h}")
    exact = d_post["residual"][0] + aref.apply_mix_bwd(g_in, rd, pre)[0]
    bound = (d_post["residual"][0].abs() + exact.abs()) * 2.0**-8 + d_post["residual"][1] * 2.0**-20
    assert bool(((r.grad.double() - exact).abs() <= bound).all())


def test_head_compute_mix(ops):
    for m, lead in [(4, (n0, n1)) for n0, n1 in LEADS] + [(1, (7, 3)), (2, (1, 513)), (8, (2, 4096))]:
        what = f"head {lead} m{m}"
        seed("head", m, lead)
        a = _unit(*lead, m, lo=-4.0, hi=4.0).requires_grad_()
        s = _unit(1, lo=0.5, hi=2.0).requires_grad_()
        b = _unit(m, lo=-1.0, hi=1.0).requires_grad_()
        _poison(a, a)
        out = ops.mhc_head_compute_mix(a, s, b, 1e-6)
        ad, sd, bd = a.detach(), s.detach(), b.detach()
        ref = href.head_mix(ad, sd, bd, 1e-6)
        assert_fp32_close(out.detach(), ref, ref.abs() + (ad * sd).abs() + bd.abs(), what, rel=2.0**-20)
        g = _unit(*lead, m, lo=-1.0, hi=1.0)
        _poison(a, a, a)
        ga, gs, gb = torch.autograd.grad(out, (a, s, b), g)
        want = href.head_mix_bwd(g, ad, sd, bd)
        assert_fp32_close(ga, *want["input"], what + " grad_input")
        assert_fp32_close(gs, *want["scale"], what + " grad_scale")
        assert_fp32_close(gb, *want["base"], what + " grad_base")
        ga2, gs2, gb2 = torch.autograd.grad(ops.mhc_head_compute_mix(a, s, b, 1e-6), (a, s, b), g)
        assert_bitwise(gs2, gs, what + " deterministic scale sum")
        assert_bitwise(gb2, gb, what + " deterministic base sum")
