"""Bit-exact GPU tests of ``engram.grad_w_reduce`` through ``tilebin.ops.engram.grad_w_reduce``.

The op must equal, bit for bit, a torch evaluation of the kernel's fp32 order: 16 row groups,
group ``g`` sums rows ``g, g + 16, ...`` from +0 in order, the group sums are added in group
order, then ``grad_weight_hidden += s * weight_embed`` and
``grad_weight_embed += s * weight_hidden`` (product and sum rounded apart).  The partial rows
span 2**-20..2**20 in magnitude (so another order shows) and hold -0.0 entries.  Row counts: 0,
1, 7, 16, 17, the SM counts of 132-, 114- and 78-SM parts, the device's and 20 fewer, 144, 145
(a second pass) and 300; hidden every multiple of 64 the family tests (576..8192) plus 8 and 64;
hc 1, 3, 4.  The in-place outputs sit between NaN guard bands that must stay untouched.  The
autograd layer (``main_grad`` and plain ``.grad``) at decode and benchmark token counts gives
the same weight-gradient bits as the same order evaluated in torch on the layer's partials.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import poison_cache, seed

GROUPS = 16  # the kernel's row groups (kernels/engram/grad_w_reduce.py R)
GUARD = 64  # fp32 elements of NaN on each side of an in-place output (keeps it 16-byte aligned)
ROWS = (0, 1, 7, 16, 17, 78, 114, 132, 144, 145, 300)
HIDDEN = (8, 64, 576, 1088, 1216, 2048, 2560, 3072, 4096, 6144, 7168, 8192)


@pytest.fixture(scope="module")
def eg(require):
    for name in ("grad_w_reduce", "fused_weight", "engram_gate_fwd", "engram_gate_bwd"):  # the last three: autograd
        require(f"engram.{name}")
    from tilebin.modeling import engram as modeling
    from tilebin.ops import engram

    return engram, modeling


def ordered_reduce(part, wh, we, gh, ge):
    """The kernel's fp32 operations in its order (torch elementwise ops round each one)."""
    total = None
    for g in range(GROUPS):
        acc = torch.zeros(part.shape[1:], dtype=torch.float32, device=part.device)
        for p in range(g, part.shape[0], GROUPS):
            acc = acc + part[p]
        total = acc if total is None else total + acc
    return gh + total * we.float(), ge + total * wh.float()


def _partials(rows: int, hc: int, hidden: int) -> torch.Tensor:
    part = torch.randn(rows, hc, hidden, device="cuda")
    part *= torch.exp2(torch.randint(-20, 21, part.shape, device="cuda").float())
    return part.masked_fill(torch.rand(part.shape, device="cuda") < 0.05, -0.0)


def _guarded(init: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a contiguous copy of ``init`` inside a NaN-guarded buffer, the buffer)."""
    buf = torch.full((init.numel() + 2 * GUARD,), float("nan"), device="cuda")
    out = buf[GUARD:GUARD + init.numel()].view(init.shape)
    out.copy_(init)
    return out, buf


def _check(eg, rows: int, hc: int, hidden: int) -> None:
    part = _partials(rows, hc, hidden)
    wh, we = (torch.randn(hc, hidden, device="cuda").bfloat16() for _ in range(2))
    init_h, init_e = torch.randn(hc, hidden, device="cuda"), torch.randn(hc, hidden, device="cuda")
    want_h, want_e = ordered_reduce(part, wh, we, init_h, init_e)
    poison_cache(2 * (hc * hidden + 2 * GUARD) * 4)
    gh, buf_h = _guarded(init_h)
    ge, buf_e = _guarded(init_e)
    assert eg[0].grad_w_reduce(part, wh, we, gh, ge) is None
    what = f"grad_w_reduce({rows} rows, hc {hc}, hidden {hidden})"
    assert_bits_equal(gh, want_h, f"{what} grad_weight_hidden")
    assert_bits_equal(ge, want_e, f"{what} grad_weight_embed")
    for name, buf in (("grad_weight_hidden", buf_h), ("grad_weight_embed", buf_e)):
        guards = torch.cat([buf[:GUARD], buf[-GUARD:]])
        assert bool(guards.isnan().all()), f"{what}: a write landed outside {name}"


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", (576, 4096, 7168))
def test_grad_w_reduce_rows(eg, rows, hidden):
    seed("reduce_rows", rows, hidden)
    _check(eg, rows, 4, hidden)


@pytest.mark.parametrize("hc", (1, 3, 4))
@pytest.mark.parametrize("hidden", HIDDEN)
def test_grad_w_reduce_hidden(eg, hc, hidden):
    seed("reduce_hidden", hc, hidden)
    _check(eg, 132, hc, hidden)


def test_grad_w_reduce_sm_counts(eg, sm_counts):
    """One partial row per SM of this device (and 20 fewer, 7, 1): what engram_gate_bwd returns."""
    seed("reduce_sms")
    for rows in sm_counts[0]:
        _check(eg, rows, 4, 7168)


def _autograd(eg, tokens: int, hidden: int, main_grad: bool) -> tuple[list, list]:
    """(the layer's weight gradients, the same from the ops' partials reduced in torch's ordered_reduce)."""
    seed("reduce_autograd", tokens, hidden, main_grad)
    x, k = (torch.randn(tokens, 4, hidden, device="cuda").bfloat16() for _ in range(2))
    v = torch.randn(tokens, hidden, device="cuda").bfloat16()
    wh, we = (1 + 0.1 * torch.randn(4, hidden, device="cuda").bfloat16() for _ in range(2))
    go = torch.randn(tokens, 4, hidden, device="cuda").bfloat16()
    params = [t.clone().requires_grad_(True) for t in (x, k, v, wh, we)]
    if main_grad:
        for p in params[3:]:
            p.main_grad = torch.full(p.shape, 0.5, device="cuda")
    eg[1].engram_gate(*params, 1e-6, 1e-20).backward(go)
    if main_grad:
        assert all(p.grad is None for p in params[3:]), "the main_grad path must leave .grad None"
        got = [p.main_grad for p in params[3:]]
    else:
        got = [p.grad for p in params[3:]]
    # the layer's backward, op by op (deterministic kernels: the same partials), reduced in torch
    fused = eg[0].fused_weight(wh, we)
    _, dot, gate_score, rstd_x, rstd_k = eg[0].engram_gate_fwd(x, k, v, fused, 1e-20, 1e-6, True)
    part = eg[0].engram_gate_bwd(go, x, k, v, fused, dot, gate_score, rstd_x, rstd_k, 1e-6)[3]
    init = torch.full((4, hidden), 0.5 if main_grad else 0.0, device="cuda")
    want = ordered_reduce(part, wh, we, init, init)
    return got, [w.to(g.dtype) for w, g in zip(want, got)]


@pytest.mark.parametrize("tokens, hidden", [(1, 576), (4, 7168), (37, 1088), (128, 4096), (128, 7168),
                                            (4001, 7168), (8001, 4096)])
@pytest.mark.parametrize("main_grad", [False, True], ids=["grad", "main_grad"])
def test_autograd_same_bits(eg, tokens, hidden, main_grad):
    """The weight gradients of the autograd layer (which calls grad_w_reduce) are the bits of the
    kernel's order evaluated in torch on the partials of the layer's backward."""
    got, want = _autograd(eg, tokens, hidden, main_grad)
    for what, a, b in zip(("weight_hidden", "weight_embed"), got, want):
        assert_bits_equal(a, b, f"engram_gate({tokens} tokens, hidden {hidden}) {what} gradient")
