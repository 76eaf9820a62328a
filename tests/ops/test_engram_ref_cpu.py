"""CPU tests of the Engram torch references (``tests/engram_ref``): the hash against plain Python
integers (wrap-around, negative values, floored remainder), the gate's closed-form backward
against torch autograd of the forward (float64, incl. the clamp's flat region), a central
finite-difference check of the autograd forward itself, and the fp32 reference against fp64."""

from __future__ import annotations

import pytest
import torch

from engram_ref import gate as ref
from engram_ref import hash as href


# ---------------------------------------------------------------- hash
@pytest.mark.parametrize("tokens,n,layers,tables", [(7, 3, 2, 8), (5, 2, 1, 1), (4, 4, 3, 2), (0, 3, 2, 8)])
def test_hash_matches_python_integers(tokens, n, layers, tables):
    g = torch.Generator().manual_seed(tokens * 100 + n)
    ids = torch.randint(-2**31, 2**31, (tokens, n), dtype=torch.int32, generator=g)
    mul = torch.randint(-2**62, 2**62, (layers, n), dtype=torch.int64, generator=g)  # products wrap
    sizes = torch.randint(1, 2**31 - 1, (layers, n - 1, tables), dtype=torch.int32, generator=g)
    offs = torch.randint(-2**31, 2**31, (layers, (n - 1) * tables), dtype=torch.int32, generator=g)
    got = href.engram_hash(ids, mul, sizes, offs)
    assert got.dtype == torch.int32 and tuple(got.shape) == (layers, tokens, (n - 1) * tables)
    assert got.tolist() == href.engram_hash_python(ids, mul, sizes, offs)


def test_hash_tile_kernels_ranges_and_floored_remainder():
    ids = torch.tensor([[3, 5, 7], [0, 0, 0], [99999, 1, 2]], dtype=torch.int32)
    mul = torch.tensor([[11, 13, 17], [-2, 3, 5]], dtype=torch.int64)
    sizes = torch.tensor([[[10, 7], [9, 4]], [[10, 7], [9, 4]]], dtype=torch.int32)
    offs = href.make_offsets(sizes)
    assert offs.tolist() == [[0, 10, 17, 26], [0, 10, 17, 26]]
    out = href.engram_hash(ids, mul, sizes, offs)
    h1 = (3 * -2) ^ (5 * 3)               # layer 1, token 0, bigram: negative XOR
    assert out[1, 0, 0].item() == h1 % 10 and h1 < 0 and h1 % 10 >= 0
    assert out[0, 0, 2].item() == ((3 * 11) ^ (5 * 13) ^ (7 * 17)) % 9 + 17
    assert out.tolist() == href.engram_hash_python(ids, mul, sizes, offs)


# ---------------------------------------------------------------- gate
def _inputs(tokens=5, hc=3, hidden=64, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16).to(dtype)  # noqa: E731  bf16 values
    return r(tokens, hc, hidden), r(tokens, hc, hidden), r(tokens, hidden), r(hc, hidden), r(hc, hidden)


@pytest.mark.parametrize("clamp", [1e-6, 0.3])
def test_closed_form_backward_equals_autograd(clamp):
    x, k, v, wh, we = _inputs(tokens=9)
    eps = 1e-20
    leaves = [t.clone().requires_grad_(True) for t in (x, k, v, wh, we)]
    out = ref.gate_autograd(*leaves, clamp, eps)
    go = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out.backward(go)
    wf = wh * we
    o, dot, gate, rx, rk = ref.gate_fwd(x, k, v, wf, eps, clamp, out_dtype=torch.float64)
    torch.testing.assert_close(o, out.detach(), rtol=1e-12, atol=1e-12)
    s = dot * rx * rk * x.shape[-1] ** -0.5
    if clamp > 0.01:
        assert (s.abs() < clamp).any() and (s.abs() >= clamp).any(), "both clamp regions must be exercised"
    gx, gk, gv, gw = ref.gate_bwd(go, x, k, v, wf, dot, gate, rx, rk, clamp, out_dtype=torch.float64)
    for name, got, want in (("x", gx, leaves[0].grad), ("k", gk, leaves[1].grad), ("v", gv, leaves[2].grad),
                            ("wh", gw * we, leaves[3].grad), ("we", gw * wh, leaves[4].grad)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=f"grad_{name}")


def test_autograd_forward_passes_finite_differences():
    x, k, v, wh, we = _inputs(tokens=2, hc=2, hidden=16, seed=3)
    leaves = tuple(t.clone().requires_grad_(True) for t in (x, k, v, wh, we))
    assert torch.autograd.gradcheck(lambda *a: ref.gate_autograd(*a, 1e-6, 1e-20), leaves, eps=1e-6, atol=1e-7)


def test_gate_sign_at_zero_follows_copysign():
    x, k, v, wh, we = _inputs(tokens=2, hc=1, hidden=8)
    wf = torch.zeros_like(wh)  # dot == +0 exactly
    _, dot, gate, _, _ = ref.gate_fwd(x, k, v, wf, 1e-20, 1e-6)
    assert (dot == 0).all()
    torch.testing.assert_close(gate, torch.sigmoid(torch.full_like(gate, 1e-3)), rtol=1e-12, atol=0)


def test_fp32_reference_is_close_to_fp64():
    x, k, v, wh, we = _inputs(tokens=16, hc=4, hidden=576, seed=5, dtype=torch.bfloat16)
    wf = ref.fused_weight(wh, we)
    o32, *s32 = ref.gate_fwd(x, k, v, wf, 1e-20, 1e-6, dtype=torch.float32)
    o64, *s64 = ref.gate_fwd(x, k, v, wf, 1e-20, 1e-6, dtype=torch.float64)
    assert (o32.float() - o64.float()).abs().max() <= 2 ** -6 * o64.float().abs().max()
    for a, b in zip(s32, s64):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_grad_w_reduce_reference():
    g = torch.Generator().manual_seed(7)
    part = torch.randn(5, 2, 16, generator=g)
    wh, we = torch.randn(2, 16, generator=g).bfloat16(), torch.randn(2, 16, generator=g).bfloat16()
    gh, ge = torch.randn(2, 16, generator=g), torch.randn(2, 16, generator=g)
    gh0, ge0 = gh.clone(), ge.clone()
    ref.grad_w_reduce(part, wh, we, gh, ge)
    torch.testing.assert_close(gh, gh0 + part.sum(0) * we.float())
    torch.testing.assert_close(ge, ge0 + part.sum(0) * wh.float())
