"""GPU tests of the mHC layer functions end to end (``tilebin.modeling.mhc``): a toy 2-layer mHC
model (expand -> mhc_pre -> sublayer -> mhc_post, twice -> mhc_head -> loss) trained for a few
SGD steps gives the losses and gradients of the same model on the torch reference
(``mhc_ref.pipeline``: the per-op definitions with bf16 roundings where the ops store bf16);
a whole training step captured in a CUDA graph after warm-up replays to the eager step's
values; and ``mhc_pre``'s fused inference path (autograd off: ``mhc_pre_big_fuse``) returns the
unfused composition's values bit for bit, with and without a norm weight.
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import seed
from mhc_ref.pipeline import Reference

MINE = ("expand_fwd", "expand_bwd", "pre_apply_mix_fwd", "pre_apply_mix_bwd", "post_fwd", "post_bwd",
        "head_compute_mix_fwd", "head_compute_mix_bwd")
M, LAYERS, LR = 4, 2, 0.05
BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def api(require):
    for name in MINE:
        require(f"mhc.{name}")
    from tilebin.modeling import mhc

    class Api:  # the functional API, with mhc_post from the ops
        expand_from_embedding = staticmethod(mhc.expand_from_embedding)
        mhc_pre = staticmethod(mhc.mhc_pre)
        mhc_head = staticmethod(mhc.mhc_head)
        mhc_post = staticmethod(mhc.ops.mhc_post)

    return Api


def _params(hidden: int) -> dict[str, torch.Tensor]:
    k = M * hidden
    g = {}
    g["emb"] = torch.randn(2, 64, hidden, device="cuda")
    for layer in range(LAYERS):
        g[f"fn{layer}"] = torch.randn(M * (M + 2), k, device="cuda") * k ** -0.5
        g[f"scale{layer}"] = torch.tensor([0.5, 0.7, 1.3], device="cuda")
        g[f"base{layer}"] = torch.randn(M * (M + 2), device="cuda") * 0.1
        g[f"w{layer}"] = torch.randn(hidden, hidden, device="cuda") * hidden ** -0.5
    g["nw0"] = 1 + 0.1 * torch.randn(k, device="cuda")  # layer 0 with a norm weight, layer 1 without
    g["head_fn"] = torch.randn(M, k, device="cuda") * k ** -0.5
    g["head_scale"] = torch.tensor([0.8], device="cuda")
    g["head_base"] = torch.zeros(M, device="cuda")
    g["target"] = torch.randn(2, 64, hidden, device="cuda")
    return g


def _loss(api, p: dict[str, torch.Tensor]) -> torch.Tensor:
    residual = api.expand_from_embedding(p["emb"].to(BF16), M)
    for layer in range(LAYERS):
        x, (post_mix, comb_mix) = api.mhc_pre(residual, p[f"fn{layer}"], p[f"scale{layer}"], p[f"base{layer}"],
                                              norm_weight=p.get(f"nw{layer}"), mhc_mult=M)
        y = torch.tanh(x.float() @ p[f"w{layer}"]).to(BF16)
        residual = api.mhc_post(y, residual, post_mix, comb_mix)
    h = api.mhc_head(residual, p["head_fn"], p["head_scale"], p["head_base"], mhc_mult=M)
    return ((h.float() - p["target"]) ** 2).mean()


def _leaves(init: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone().requires_grad_(k != "target") for k, v in init.items()}


def _sgd(p: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for k, v in p.items():
            if v.grad is not None:
                v.sub_(LR * v.grad)
                v.grad = None


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("hidden", [1280, 4096])
def test_training_matches_the_reference(api, hidden):
    seed("pipeline", hidden)
    init = _params(hidden)
    ours, ref = _leaves(init), _leaves(init)
    losses = []
    for step in range(4):
        lo = _loss(api, ours)
        lr = _loss(Reference(), ref)
        lo.backward()
        lr.backward()
        losses.append((float(lo), float(lr)))
        assert abs(float(lo) - float(lr)) <= 2e-3 * abs(float(lr)), (step, losses)
        if step == 0:  # every parameter's gradient, through all ops' backward
            for k in ours:
                if k == "target":
                    continue
                assert ours[k].grad is not None, k
                assert _rel(ours[k].grad, ref[k].grad) < 2e-2, (k, _rel(ours[k].grad, ref[k].grad))
        _sgd(ours)
        _sgd(ref)
    assert losses[-1][0] < losses[0][0], losses  # it trains


def test_cuda_graph_training_step(api):
    seed("pipeline-graph")
    init = _params(2560)
    eager, cap = _leaves(init), _leaves(init)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (launchers, allocator)
        for _ in range(2):
            _loss(api, cap).backward()
            for v in cap.values():
                v.grad = None
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = _loss(api, cap)
        static_loss.backward()
        with torch.no_grad():
            for k, v in cap.items():
                if v.grad is not None:
                    v.sub_(LR * v.grad)
    for step in range(3):
        graph.replay()
        want = _loss(api, eager)
        want.backward()
        _sgd(eager)
        torch.cuda.synchronize()
        assert abs(float(static_loss) - float(want)) <= 1e-5 * abs(float(want)), (step, float(static_loss), float(want))
    for k in init:
        assert _rel(cap[k].detach(), eager[k].detach()) < 1e-5, k


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("lead,hidden", [((2, 48), 4096), ((1, 1), 7168), ((1, 1024), 1280)])
def test_fused_inference_equals_unfused(api, lead, hidden, weighted):
    from tilebin.modeling import mhc

    seed("fused-inference", lead, hidden, weighted)
    k = M * hidden
    residual = torch.randn(*lead, M, hidden, device="cuda").to(BF16)
    fn = torch.randn(M * (M + 2), k, device="cuda") * k ** -0.5
    scale = torch.tensor([0.5, 0.7, 1.3], device="cuda")
    base = torch.randn(M * (M + 2), device="cuda") * 0.1
    nw = (1 + 0.1 * torch.randn(k, device="cuda")) if weighted else None
    with torch.enable_grad():
        x_u, (p_u, c_u) = mhc.mhc_pre(residual, fn, scale, base, norm_weight=nw)
    with torch.no_grad():
        x_f, (p_f, c_f) = mhc.mhc_pre(residual, fn, scale, base, norm_weight=nw)
    for name, a, b in (("layer_input", x_f, x_u), ("post_mix", p_f, p_u), ("comb_mix", c_f, c_u)):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert _rel(a, b) < 1e-3, (name, _rel(a, b))  # close first: a real mismatch reads differently
        assert torch.equal(a, b), (name, int((a != b).sum()), "of", a.numel(), "differ in bits")
    with torch.no_grad():  # the whole model: fused pre in every layer
        init = _params(hidden)
    with torch.no_grad():
        fused = _loss(api, init)
    unfused = _loss(api, {k2: v.clone() for k2, v in init.items()})
    assert torch.equal(fused, unfused.detach()), (float(fused), float(unfused))
