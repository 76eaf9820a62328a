"""``tilebin.modeling.swiglu`` on the GPU: the autograd Function's outputs and gradients.

Forward: ``(out, out_sf)`` bit-exact against ``quant_ref.swiglu.swiglu_forward_and_per_token_cast``
(the forward op's reference, as test_gpu_quant_swiglu checks it), the gradient handle bf16 zeros
with strides 0.  Backward: ``x.grad`` and ``topk_weights.grad`` against a float32 torch
reference: torch.autograd of the plain SwiGLU expression (``silu(clamp(gate)) * clamp(up)`` times
the row's routing weight) evaluated at the same e4m3 copy of x the Function saves
(``quant_ref.cast`` with ``(1, saved_num_per_channels)`` blocks, dequantized), for the same
activation gradient.  x.grad is the kernel's fp32 gradient rounded once to bf16 (then cast to
x's dtype): within one bf16 rounding (rtol 2**-7) of the reference, plus a small atol for the
fp32 evaluation order near the zero of silu'; topk_weights.grad is a row sum whose order
differs: atol = rtol = 1e-4 as tile_kernels' own backward test.  Tokens 0, 1, 7 and 1000,
routed (MoE-like maps: dropped (token, topk) slots, padding rows) and plain.  Before the forward
and before the backward the caching allocator's free blocks of each output's size are filled
with 0xFF (NaN), so an element a kernel never wrote shows up as a mismatch.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import quant_ref  # noqa: E402
from quant_ref import swiglu as ref  # noqa: E402

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
TOPK = 4
PADDING_ROWS = 3
FWD_KERNEL, BWD_KERNEL = "quant.swiglu_forward_and_per_token_cast", "quant.swiglu_backward_and_per_token_cast"


@pytest.fixture(scope="module")
def swiglu():
    from tilebin.modeling import swiglu

    return swiglu


def _poison_pool(*numels: int) -> None:
    """Return 0xFF-filled blocks to torch's caching allocator so the next outputs start as poison."""
    blocks = [torch.empty(max(n, 1), dtype=torch.uint8, device=DEVICE) for n in numels]
    for b in blocks:
        quant_ref.poison_(b)
    del blocks


def _routing(rng, tokens: int):
    """``(topk_weights, pos_to_token_topk, token_topk_to_pos)`` of an MoE-like routing of ``tokens``
    tokens: about one (token, topk) slot in eight dropped (no row, token_topk_to_pos -1), the kept
    slots' rows in a random order, then PADDING_ROWS rows of -1 (none without tokens)."""
    slots = tokens * TOPK
    kept = torch.rand(slots, device=DEVICE, generator=rng.gen) >= 0.125
    ids = torch.arange(slots, dtype=torch.int32, device=DEVICE)[kept]
    ids = ids[torch.randperm(ids.numel(), device=DEVICE, generator=rng.gen)]
    pad = torch.full((PADDING_ROWS if tokens else 0,), -1, dtype=torch.int32, device=DEVICE)
    ptt = torch.cat([ids, pad])
    ttp = torch.full((slots,), -1, dtype=torch.int32, device=DEVICE)
    ttp[ids.long()] = torch.arange(ids.numel(), dtype=torch.int32, device=DEVICE)
    weights = rng.uniform((tokens, TOPK), 0.1, 1.0)
    return weights, ptt, ttp.view(tokens, TOPK)


def _reference_grads(x, saved: int, clamp, grad_act, weights=None, ptt=None):
    """float32 ``(x.grad, topk_weights.grad)`` by torch.autograd of the plain SwiGLU at the e4m3
    copy of x the Function saves."""
    x_ref = quant_ref.dequantize(quant_ref.cast(x, "e4m3", (1, saved)), (1, saved)).requires_grad_()
    hidden = x_ref.shape[1] // 2
    gate, up = x_ref[:, :hidden], x_ref[:, hidden:]
    if clamp is not None:
        gate, up = gate.clamp(max=clamp), up.clamp(min=-clamp, max=clamp)
    act = torch.nn.functional.silu(gate) * up
    w_ref = None
    if weights is not None:
        w_ref = weights.detach().clone().requires_grad_()
        row_w = w_ref.flatten()[ptt.clamp(min=0).long()] * (ptt >= 0)  # padding rows weigh 0
        act = act * row_w.unsqueeze(1)
    (act * grad_act.float()).sum().backward()
    return x_ref.grad, (None if w_ref is None else w_ref.grad)


CASES = [
    dict(dtype="bfloat16", hidden=512, npc=128, layout="row", saved=128, clamp=None, round_sf=False, routed=True),
    dict(dtype="bfloat16", hidden=576, npc=128, layout="ue8m0", saved=32, clamp=0.5, round_sf=True, routed=True),
    dict(dtype="float32", hidden=1024, npc=128, layout="col", saved=128, clamp=10.0, round_sf=False, routed=True),
    dict(dtype="bfloat16", hidden=256, npc=256, layout="row", saved=32, clamp=None, round_sf=True, routed=False),
    dict(dtype="float32", hidden=2048, npc=128, layout="row", saved=128, clamp=0.5, round_sf=False, routed=False),
]


def _case_id(c):
    return "-".join(f"{k}={v}" for k, v in c.items())


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("tokens", [0, 1, 7, 1000])
def test_swiglu_autograd_matches_torch_autograd(swiglu, require, rng, tokens, case):
    require(FWD_KERNEL)
    require(BWD_KERNEL)
    hidden, saved, clamp = case["hidden"], case["saved"], case["clamp"]
    weights = ptt = ttp = None
    if case["routed"]:
        weights, ptt, ttp = _routing(rng, tokens)
        weights.requires_grad_()
    rows = tokens if ptt is None else ptt.numel()
    x = rng.normal((rows, 2 * hidden), getattr(torch, case["dtype"]), scale=3.0).requires_grad_()
    grad_act = rng.normal((rows, hidden), torch.bfloat16)
    col, packed = case["layout"] in ("col", "ue8m0"), case["layout"] == "ue8m0"
    desc = f"tokens={tokens} rows={rows} {_case_id(case)}"
    w_plain = None if weights is None else weights.detach()

    want = ref.swiglu_forward_and_per_token_cast(x.detach(), "e4m3", case["npc"], ptt, w_plain, None, col,
                                                 case["round_sf"], packed, clamp)
    _poison_pool(rows * hidden, rows * (hidden // 32 + 64), rows * 2 * hidden, rows * (2 * hidden // saved) * 4)
    out, out_sf, handle = swiglu.swiglu_per_token_cast(
        x, "e4m3", case["npc"], weights, ptt, ttp, use_tma_aligned_col_major_sf=col, round_sf=case["round_sf"],
        use_packed_ue8m0=packed, swiglu_clamp_value=clamp, saved_num_per_channels=saved)
    torch.cuda.synchronize()
    quant_ref.assert_equal(out, want[0], f"out ({desc})")
    quant_ref.assert_equal(out_sf, want[1], f"out_sf ({desc})")
    assert (handle.dtype, tuple(handle.shape), handle.stride()) == (torch.bfloat16, (rows, hidden), (0, 0)), desc
    assert handle.requires_grad and not out.requires_grad and not bool(handle.any()), desc

    # the backward's outputs: out (bf16), x_grad_fp8, x_grad_sf, x_grad (bf16), weight_grad
    _poison_pool(rows * hidden * 2, rows * 2 * hidden, rows * (2 * hidden // saved) * 4, rows * 2 * hidden * 2,
                 0 if weights is None else weights.numel() * 4)
    torch.autograd.backward(handle, grad_act)
    torch.cuda.synchronize()
    x_grad_ref, w_grad_ref = _reference_grads(x.detach(), saved, clamp, grad_act, weights, ptt)
    assert x.grad.dtype == x.dtype and x.grad.shape == x.shape, desc
    assert not torch.isnan(x.grad).any(), f"x.grad ({desc}): {int(torch.isnan(x.grad).sum())} NaN (unwritten?)"
    torch.testing.assert_close(x.grad.float(), x_grad_ref, rtol=2**-7, atol=1e-4,
                               msg=lambda m: f"x.grad ({desc}): {m}")
    if weights is not None:
        assert weights.grad.dtype == torch.float32 and weights.grad.shape == weights.shape, desc
        assert torch.all(weights.grad[ttp < 0] == 0), f"topk_weights.grad ({desc}): dropped slots are not 0"
        torch.testing.assert_close(weights.grad, w_grad_ref, rtol=1e-4, atol=1e-4,
                                   msg=lambda m: f"topk_weights.grad ({desc}): {m}")


def test_swiglu_autograd_through_a_consumer(swiglu, require, rng):
    """The intended use: a consumer Function takes (out, out_sf, handle) and returns the activation's
    gradient for the handle; gradients reach x as with the handle alone."""
    require(FWD_KERNEL)
    require(BWD_KERNEL)

    class Dequantized(torch.autograd.Function):
        """(out, out_sf, handle) -> the dequantized activation (fp32), its gradient sent to handle."""

        @staticmethod
        def forward(ctx, out, out_sf, handle):
            return quant_ref.dequantize((out, out_sf), (1, 128))

        @staticmethod
        def backward(ctx, grad):
            return None, None, grad

    x = rng.normal((300, 2 * 512), torch.bfloat16, scale=3.0).requires_grad_()
    grad_act = rng.normal((300, 512), torch.bfloat16)
    out, out_sf, handle = swiglu.swiglu_per_token_cast(x, "e4m3", 128, swiglu_clamp_value=10.0)
    (Dequantized.apply(out, out_sf, handle) * grad_act.float()).sum().backward()
    x_grad_ref, _ = _reference_grads(x.detach(), 128, 10.0, grad_act)
    torch.testing.assert_close(x.grad.float(), x_grad_ref, rtol=2**-7, atol=1e-4)
