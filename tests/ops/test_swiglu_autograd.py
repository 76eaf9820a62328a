"""``tilebin.modeling.swiglu`` (CPU, launches stubbed): the autograd Function's plumbing.

The forward launches the fused forward op (and, when a gradient is wanted, the per-token e4m3
cast of x it saves); the backward launches the fused backward op on that saved copy, the
routing and the incoming gradient, and hands its ``x_grad`` / ``weight_grad`` to autograd (the
stubbed backward kernel writes 1.5 and 2.5 into them, so the gradients read back are the op's).
Bad arguments are refused before any launch.  The values are checked on the GPU
(``tests/gpu/test_gpu_swiglu_autograd.py``).
"""

from __future__ import annotations

import pytest
import torch

from ops_stub import StubbedOps
from tilebin.modeling import swiglu as ms
from tilebin.ops.quant import _swiglu as sw
from tilebin.runtime import ArgumentError

BF16, FP32, E4M3, I32 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int32
FWD_KERNEL, BWD_KERNEL = "quant.swiglu_forward_and_per_token_cast", "quant.swiglu_backward_and_per_token_cast"
X_GRAD, WEIGHT_GRAD = 1.5, 2.5


@pytest.fixture
def stub(monkeypatch):
    """StubbedOps whose backward kernel writes X_GRAD into x_grad and WEIGHT_GRAD into weight_grad."""
    ops = StubbedOps(monkeypatch)

    def launcher(name, **key):
        record = ops._launcher(name, **key)
        if name != BWD_KERNEL:
            return record

        def launch(*args):
            record(*args)
            args[9].fill_(X_GRAD)  # x_grad, weight_grad: the kernel's 10th and 11th parameters
            args[10].fill_(WEIGHT_GRAD)

        return launch

    monkeypatch.setattr(sw, "launcher", launcher)
    return ops


def _routing(tokens=3, topk=2):
    """Every (token, topk) slot has a row, plus one padding row at the end."""
    rows = tokens * topk + 1
    ptt = torch.cat([torch.arange(tokens * topk, dtype=I32), torch.tensor([-1], dtype=I32)])
    ttp = torch.arange(tokens * topk, dtype=I32).view(tokens, topk)
    return rows, torch.rand(tokens, topk, requires_grad=True), ptt, ttp


def _storage(t):
    return t.untyped_storage().data_ptr()


def _names(ops):
    return [name for name, _, _ in ops.launches]


@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_routed_gradients_are_the_backward_ops(stub, dtype):
    rows, weights, ptt, ttp = _routing()
    x = torch.randn(rows, 512).to(dtype).requires_grad_()
    out, out_sf, handle = ms.swiglu_per_token_cast(x, "e4m3", 128, weights, ptt, ttp, swiglu_clamp_value=7.0,
                                                   round_sf=True)
    assert _names(stub)[0] == FWD_KERNEL and len(stub.launches) == 2  # the forward, then x's saved e4m3 copy
    fwd_args, cast_args = stub.launches[0][2], stub.launches[1][2]
    assert fwd_args[0] is x and fwd_args[1] is out and fwd_args[2] is out_sf and fwd_args[3] is ptt
    assert fwd_args[4] is weights and fwd_args[7] == 7.0 and fwd_args[9] == 1
    assert (out.dtype, out.shape, out_sf.shape) == (E4M3, (rows, 256), (rows, 2))
    assert not out.requires_grad and not out_sf.requires_grad and handle.requires_grad
    assert (handle.dtype, handle.shape, handle.stride()) == (BF16, (rows, 256), (0, 0)) and not handle.any()

    grad = torch.randn(rows, 256)  # fp32: autograd casts it to the handle's bf16
    torch.autograd.backward(handle, grad)
    assert _names(stub)[2:] == [BWD_KERNEL]
    (name, key, args) = stub.launches[2]
    assert key == {"num_per_channels": 128}
    saved = [a for a in cast_args if isinstance(a, torch.Tensor) and a is not x]
    data, sf = args[0], args[1]
    assert data.dtype == E4M3 and data.shape == (rows, 512) and any(_storage(data) == _storage(t) for t in saved)
    assert sf.dtype == FP32 and sf.shape == (rows, 4) and any(_storage(sf) == _storage(t) for t in saved)
    assert args[2].dtype == BF16 and args[2].is_contiguous() and torch.equal(args[2], grad.to(BF16))
    assert args[3] is weights and args[4] is ptt and args[5] is ttp
    assert args[11:] == (7.0, 1)  # clamp, round_sf
    assert x.grad.dtype == dtype and x.grad.shape == x.shape and bool((x.grad == X_GRAD).all())
    assert weights.grad.shape == weights.shape and bool((weights.grad == WEIGHT_GRAD).all())


def test_plain_swiglu_routes_every_row_with_weight_one(stub):
    x = torch.randn(5, 256).to(BF16).requires_grad_()
    out, out_sf, handle = ms.swiglu_per_token_cast(x, "e4m3", 128, saved_num_per_channels=32)
    assert stub.launches[0][2][3].numel() == 1  # the forward op's stand-in: no routing tensors
    handle.sum().backward()  # an expanded (stride-0) gradient: passed on contiguous
    (name, key, args) = stub.launches[-1]
    assert name == BWD_KERNEL and key == {"num_per_channels": 32}
    assert args[1].shape == (5, 8) and args[2].is_contiguous() and bool((args[2] == 1).all())
    assert torch.equal(args[3], torch.ones(5, 1)) and torch.equal(args[4], torch.arange(5, dtype=I32))
    assert torch.equal(args[5], torch.arange(5, dtype=I32).view(5, 1))
    assert args[11:] == (float("inf"), 0)
    assert bool((x.grad == X_GRAD).all())


def test_no_saved_copy_without_a_gradient(stub):
    rows, weights, ptt, ttp = _routing()
    x = torch.randn(rows, 256).to(BF16)
    _, _, handle = ms.swiglu_per_token_cast(x, "e4m3", 128, weights.detach(), ptt, ttp)
    assert _names(stub) == [FWD_KERNEL] and not handle.requires_grad
    with torch.no_grad():
        ms.swiglu_per_token_cast(x.requires_grad_(), "e4m3", 128, weights, ptt, ttp)
    assert _names(stub) == [FWD_KERNEL] * 2


def test_only_the_weights_need_a_gradient(stub):
    rows, weights, ptt, ttp = _routing()
    x = torch.randn(rows, 256).to(BF16)
    _, _, handle = ms.swiglu_per_token_cast(x, "e4m3", 128, weights, ptt, ttp)
    handle.backward(torch.ones(rows, 128, dtype=BF16))
    assert _names(stub)[-1] == BWD_KERNEL and bool((weights.grad == WEIGHT_GRAD).all()) and x.grad is None


def test_layouts_and_zero_rows(stub):
    for rows in (0, 3):
        x = torch.randn(rows, 256).to(BF16).requires_grad_()
        out, out_sf, handle = ms.swiglu_per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True,
                                                       round_sf=True, use_packed_ue8m0=True)
        want = sw.swiglu_forward_and_per_token_cast(x.detach(), "e4m3", 128, None, None, None, True, True, True)
        assert [(t.dtype, t.shape, t.stride()) for t in (out, out_sf)] == [
            (t.dtype, t.shape, t.stride()) for t in want]
        torch.autograd.backward(handle, torch.ones(rows, 128))
        assert x.grad.shape == x.shape


@pytest.mark.parametrize("kw, match", [
    (dict(saved_num_per_channels=64), r"saved_num_per_channels=64 is not supported; supported: 32, 128"),
    (dict(saved_num_per_channels=True), r"saved_num_per_channels=True is not supported"),
    (dict(ttp=None), r"got topk_weights, pos_to_token_topk only; the routing needs"),
    (dict(weights=None, ptt=None), r"got token_topk_to_pos only"),
    (dict(ttp=torch.zeros(3, 2, dtype=torch.int64)), r"token_topk_to_pos has dtype int64; supported: int32"),
    (dict(ttp=torch.zeros(2, 3, dtype=I32)), r"token_topk_to_pos has shape \(2, 3\); it must match topk_weights"),
    (dict(ttp=torch.zeros(2, 3, dtype=I32).T), r"token_topk_to_pos must be contiguous"),
    (dict(x=torch.randn(7, 384).to(BF16)), r"x has 384 columns; the saved e4m3 copy of x needs hidden .* multiple "
                                           r"of saved_num_per_channels=128"),
    (dict(ttp=torch.zeros(3, 2, dtype=I32, device="meta")), r"token_topk_to_pos is on meta but x is on cpu"),
])
def test_bad_arguments_are_refused_before_any_launch(stub, kw, match):
    rows, weights, ptt, ttp = _routing()
    args = dict(x=torch.randn(rows, 512).to(BF16).requires_grad_(), weights=weights, ptt=ptt, ttp=ttp)
    args.update(kw)
    extra = {k: v for k, v in args.items() if k == "saved_num_per_channels"}
    with pytest.raises(ArgumentError, match="swiglu_per_token_cast: " + match):
        ms.swiglu_per_token_cast(args["x"], "e4m3", 128, args["weights"], args["ptt"], args["ttp"], **extra)
    assert stub.launches == []


def test_the_forward_ops_refusals_come_first(stub):
    """x's own faults get the forward op's message (its checks run before the forward launch)."""
    rows, weights, ptt, ttp = _routing()
    with pytest.raises(ArgumentError, match=r"swiglu_forward_and_per_token_cast: x has 192 columns"):
        ms.swiglu_per_token_cast(torch.randn(rows, 192).to(BF16), "e4m3", 128, weights, ptt, ttp)
    with pytest.raises(ArgumentError, match=r"swiglu_forward_and_per_token_cast: pos_to_token_topk has 6 entries"):
        ms.swiglu_per_token_cast(torch.randn(rows, 512).to(BF16), "e4m3", 128, weights, ptt[:6], ttp)
    assert stub.launches == []
