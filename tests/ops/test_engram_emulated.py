"""The Engram ops and the autograd layer end to end on CPU, with each kernel replaced by an emulator
built from the torch references (``engram_ref``) that takes the kernel's parameters in the
kernel's order (checked against the TileLang PrimFuncs when tilelang is installed).

What this proves without a GPU: the ops pass the right tensors and scalars in the right order,
allocate outputs of tile_kernels' dtypes/shapes/strides, split tokens into grad_w_partial rows
as the kernel does, and ``tilebin.modeling.engram`` gives autograd's gradients, with the
``main_grad`` convention and its checks.  The kernels' own arithmetic is tested on the H200
(tests/gpu/test_gpu_engram.py)."""

from __future__ import annotations

import math

import pytest
import torch

from engram_ref import gate as ref
from engram_ref import hash as href
from tilebin.modeling import engram as modeling
from tilebin.ops import _spec, engram
from tilebin.ops.engram import _gate as gt, _hash as hs
from tilebin.runtime import ArgumentError

NUM_SMS = 5


def _hash(ngram_token_ids, multipliers, vocab_sizes, offsets, output):
    output.copy_(href.engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets))


def _fused(weight_hidden, weight_embed, weight_fused):
    weight_fused.copy_(ref.fused_weight(weight_hidden, weight_embed))


def _fwd(hidden_states, k, v, weight_fused, output, dot, gate_score, rstd_x, rstd_k, eps, clamp_value, scalar, save):
    x = hidden_states
    assert scalar == x.shape[-1] ** -0.5 and save in (0, 1) and type(eps) is float and type(clamp_value) is float
    for t in (dot, gate_score, rstd_x, rstd_k):  # the kernel's contract: [num_tokens or 0, hc] fp32
        assert t.dtype == torch.float32 and tuple(t.shape) == (x.shape[0] if save else 0, x.shape[1])
    o, *stats = ref.gate_fwd(x, k, v, weight_fused, eps, clamp_value, dtype=torch.float32)
    output.copy_(o)
    if save:
        for dst, src in zip((dot, gate_score, rstd_x, rstd_k), stats):
            dst.copy_(src)


def _bwd(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, grad_x, grad_k, grad_v,
         grad_w_partial, clamp_value, scalar):
    go, x, wf = grad_out, hidden_states, weight_fused
    assert scalar == x.shape[-1] ** -0.5
    gx, gk, gv, _ = ref.gate_bwd(go, x, k, v, wf, dot, gate_score, rstd_x, rstd_k, clamp_value)
    grad_x.copy_(gx), grad_k.copy_(gk), grad_v.copy_(gv)
    blocks, tokens = grad_w_partial.shape[0], x.shape[0]
    q, r = divmod(tokens, blocks)
    for p in range(blocks):  # the kernel's token ranges (sizes q or q + 1); an empty range writes zeros
        lo = p * q + min(p, r)
        sl = slice(lo, lo + q + (p < r))
        grad_w_partial[p] = ref.gate_bwd(go[sl], x[sl], k[sl], v[sl], wf, dot[sl], gate_score[sl], rstd_x[sl],
                                         rstd_k[sl], clamp_value)[3].float()


EMULATORS = {
    "engram.engram_hash": _hash,
    "engram.fused_weight": _fused,
    "engram.engram_gate_fwd": _fwd,
    "engram.engram_gate_bwd": _bwd,
    "engram.grad_w_reduce": ref.grad_w_reduce,
}


@pytest.fixture
def calls(monkeypatch):
    log = []

    def launcher(name, **key):
        assert not key, (name, key)

        def run(*args):
            log.append(name)
            EMULATORS[name](*args)
        return run

    for m in (gt, hs):
        monkeypatch.setattr(m, "launcher", launcher)
        for spec in m.SPECS:  # plans built under this launcher, forgotten after the test
            monkeypatch.setattr(spec, "memo", {})
    for m in (gt, _spec):  # the OpSpecs' device check, and grad_w_reduce's before its overlap check
        monkeypatch.setattr(m, "check_cuda", lambda op, **t: None)
    monkeypatch.setattr(gt, "get_num_sms", lambda device=None: NUM_SMS)
    return log


def test_emulators_take_the_kernels_parameters():
    """Each emulator's parameter names are the kernel PrimFunc's, in order."""
    pytest.importorskip("tilelang", reason="tracing the kernels needs tilelang")
    import importlib
    import inspect

    from tvm.target import Target

    with Target({"kind": "cuda", "arch": "sm_90a"}):
        for name, emu in EMULATORS.items():
            module = importlib.import_module(f"tilebin.kernels.engram.{name.split('.')[1]}")
            (decl,) = [d for d in module.KERNELS if d.name == name]
            params = [p.name.removesuffix("_handle") for p in decl.factory().params]
            assert params == list(inspect.signature(emu).parameters), (name, params)


def _data(tokens=6, hc=4, hidden=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    return r(tokens, hc, hidden), r(tokens, hc, hidden), r(tokens, hidden), r(hc, hidden), r(hc, hidden)


def test_ops_outputs_and_layouts(calls):
    x, k, v, wh, we = _data(tokens=7, hc=3, hidden=72)
    wf = engram.fused_weight(wh, we)
    assert wf.dtype == torch.float32 and wf.shape == (3, 72) and torch.equal(wf, wh.float() * we.float())
    out, dot, gate, rx, rk = engram.engram_gate_fwd(x, k, v, wf, 1e-20, 1e-6)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape and out.stride() == x.stride()
    for t in (dot, gate, rx, rk):
        assert t.dtype == torch.float32 and t.shape == (7, 3) and t.stride() == (3, 1)
    out2, *none = engram.engram_gate_fwd(x, k, v, wf, 1e-20, 1e-6, save_for_backward=False)
    assert none == [None] * 4 and torch.equal(out2, out)
    gx, gk, gv, gwp = engram.engram_gate_bwd(torch.ones_like(x), x, k, v, wf, dot, gate, rx, rk, 1e-6)
    assert (gx.shape, gk.shape, gv.shape, gwp.shape) == (x.shape, x.shape, v.shape, (NUM_SMS, 3, 72))
    assert gx.dtype == gk.dtype == gv.dtype == torch.bfloat16 and gwp.dtype == torch.float32
    assert gx.is_contiguous() and gk.is_contiguous() and gv.is_contiguous() and gwp.is_contiguous()
    assert calls == ["engram.fused_weight", "engram.engram_gate_fwd", "engram.engram_gate_fwd", "engram.engram_gate_bwd"]


def test_zero_tokens(calls):
    x, k, v, wh, we = _data(tokens=0)
    wf = engram.fused_weight(wh, we)
    out, dot, *_ = engram.engram_gate_fwd(x, k, v, wf, 1e-20, 1e-6)
    assert out.shape == (0, 4, 64) and dot.shape == (0, 4)
    assert engram.engram_hash(torch.zeros((0, 3), dtype=torch.int32), torch.ones((2, 3), dtype=torch.int64),
                              torch.ones((2, 2, 8), dtype=torch.int32),
                              torch.zeros((2, 16), dtype=torch.int32)).shape == (2, 0, 16)
    *_, gwp = engram.engram_gate_bwd(x, x, k, v, wf, dot, dot, dot, dot, 1e-6)
    assert torch.equal(gwp, torch.zeros((NUM_SMS, 4, 64)))  # the kernel launches to zero the partials
    assert calls == ["engram.fused_weight", "engram.engram_gate_bwd"]


def test_strided_k_and_v_reach_the_kernel(calls):
    x, _, _, wh, we = _data(tokens=5, hidden=64)
    kv = torch.randn(5, 4, 136).bfloat16()
    k, v = kv[:, :, 8:72], kv[:, 0, 72:]
    wf = engram.fused_weight(wh, we)
    got = engram.engram_gate_fwd(x, k, v, wf, 1e-20, 1e-6)[0]
    assert torch.equal(got, ref.gate_fwd(x, k.contiguous(), v.contiguous(), wf, 1e-20, 1e-6, torch.float32)[0])


def test_hash_op(calls):
    ids = torch.randint(0, 100000, (9, 3), dtype=torch.int32)
    mul = torch.randint(0, 100000, (2, 3), dtype=torch.int64)
    sizes = torch.randint(100000, 1000000, (2, 2, 8), dtype=torch.int32)
    out = engram.engram_hash(ids, mul, sizes, href.make_offsets(sizes))
    assert out.dtype == torch.int32 and out.shape == (2, 9, 16) and out.is_contiguous()


# ---------------------------------------------------------------- the autograd layer
def _autograd_grads(x, k, v, wh, we, go, clamp, eps):
    leaves = [t.double().requires_grad_(True) for t in (x, k, v, wh, we)]
    ref.gate_autograd(*leaves, clamp, eps).backward(go.double())
    return [t.grad for t in leaves]


@pytest.mark.parametrize("lead", [(6,), (2, 3)])
def test_engram_gate_gradients(calls, lead):
    x, k, v, wh, we = _data(tokens=6)
    x, k, v = x.view(*lead, 4, 64), k.view(*lead, 4, 64), v.view(*lead, 64)
    params = [t.clone().requires_grad_(True) for t in (x, k, v, wh, we)]
    out = modeling.engram_gate(*params, 1e-6, 1e-20)
    assert out.shape == x.shape and out.dtype == torch.bfloat16
    go = torch.randn(out.shape).bfloat16()
    out.backward(go)
    want = _autograd_grads(x, k, v, wh, we, go, 1e-6, 1e-20)
    for name, p, w in zip(("x", "k", "v", "wh", "we"), params, want):
        assert p.grad is not None and p.grad.shape == w.shape and p.grad.dtype == torch.bfloat16, name
        err = (p.grad.double() - w).norm() / w.norm()
        assert err < 1e-2, (name, float(err))


def test_engram_gate_main_grad_accumulates_in_place(calls):
    x, k, v, wh, we = _data(tokens=6)
    wh, we = wh.clone().requires_grad_(True), we.clone().requires_grad_(True)
    wh.main_grad = torch.full((4, 64), 0.25)
    keep = wh.main_grad
    go = torch.randn(6, 4, 64).bfloat16()
    x.requires_grad_(True)
    modeling.engram_gate(x, k, v, wh, we, 1e-6, 1e-20).backward(go)
    want = _autograd_grads(x.detach(), k, v, wh.detach(), we.detach(), go, 1e-6, 1e-20)
    assert wh.grad is None, "a weight with main_grad gets None from the Function"
    assert wh.main_grad is keep
    torch.testing.assert_close(keep.double() - 0.25, want[3], rtol=2e-2, atol=2e-2)
    assert we.grad is not None and we.grad.dtype == torch.bfloat16
    torch.testing.assert_close(we.grad.double(), want[4], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bad,match", [
    (torch.zeros((4, 64), dtype=torch.bfloat16), "weight_embed.main_grad has dtype bfloat16; supported: float32"),
    (torch.zeros((4, 32)), r"weight_embed.main_grad is \(4, 32\)"),
    (torch.zeros((64, 4)).T, "contiguous float32 tensor of shape"),
    ("buffer", "must be a torch.Tensor"),
])
def test_bad_main_grad_fails_before_any_launch(calls, bad, match):
    x, k, v, wh, we = _data()
    we = we.clone().requires_grad_(True)
    x.requires_grad_(True)
    out = modeling.engram_gate(x, k, v, wh, we, 1e-6, 1e-20)
    we.main_grad = bad
    calls.clear()
    with pytest.raises(ArgumentError, match=match) as info:
        out.backward(torch.ones_like(out))
    assert str(info.value).startswith("engram_gate:") and calls == []
    with pytest.raises(ArgumentError, match=match):
        modeling.engram_gate(x, k, v, wh, we, 1e-6, 1e-20)  # and the forward refuses it up front


def test_engram_gate_shape_checks(calls):
    x, k, v, wh, we = _data()
    with pytest.raises(ArgumentError, match=r"engram_gate: v has shape \(6, 32\)"):
        modeling.engram_gate(x, k, v[:, :32], wh, we, 1e-6, 1e-20)
    with pytest.raises(ArgumentError, match="engram_gate: k has shape"):
        modeling.engram_gate(x, k[:3], v, wh, we, 1e-6, 1e-20)
    with pytest.raises(ArgumentError, match="fused_weight: weight_hidden has dtype float32"):
        modeling.engram_gate(x, k, v, wh.float(), we, 1e-6, 1e-20)
    assert math.isclose(1.0, 1.0) and calls == []
