"""Ops of tilebin.ops captured in CUDA graphs: a warmed-up op (its memo, launcher and stand-in
tensors created) records into a graph and its replays recompute the same bits; a cooperative
MoE launch (group_count above 4096 entries) captures too.  Outputs allocated during capture come
from the graph's private pool, as for any torch op."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up on a side stream, as torch recommends before capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def _same(a, b, what):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, f"{what}[{i}]: {x.dtype} {tuple(x.shape)} vs {y.dtype} {tuple(y.shape)}"
        xb = x.contiguous().reshape(-1).view(torch.uint8)
        yb = y.contiguous().reshape(-1).view(torch.uint8)
        bad = int((xb != yb).sum())
        assert bad == 0, f"{what}[{i}]: {bad} bytes differ between the graph replay and an eager call"


def test_quant_ops_replay_in_graphs():
    from tilebin.ops import quant

    x = torch.randn(257, 7168, device="cuda", dtype=torch.bfloat16)
    for name, fn in [
        ("per_token_cast e4m3", lambda: quant.per_token_cast(x, "e4m3", 128)),
        ("per_token_cast e2m1 ue8m0", lambda: quant.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True,
                                                                  round_sf=True, use_packed_ue8m0=True)),
        ("per_block_cast", lambda: quant.per_block_cast(x, "e4m3", (128, 128))),
        ("per_channel_cast", lambda: quant.per_channel_cast(x, "e4m3", 128)),
        ("swiglu_forward_and_per_token_cast", lambda: quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128)),
    ]:
        g, out = _capture(fn)
        x.normal_()  # new input values: the replay must use them
        g.replay()
        torch.cuda.synchronize()
        _same(out, fn(), name)


def test_moe_ops_replay_in_graphs():
    from tilebin.ops import moe

    scores = torch.randn(4001, 256, device="cuda", dtype=torch.float32)
    idx = torch.randint(0, 8, (4001, 8), device="cuda", dtype=torch.int64)  # 32008 entries: cooperative path
    for name, fn in [
        ("topk_gate", lambda: moe.topk_gate(scores, 8)),
        ("group_count (cooperative)", lambda: moe.group_count(idx, 8)),
        ("aux_fi (cooperative)", lambda: moe.aux_fi(idx, 8, 8)),
    ]:
        g, out = _capture(fn)
        scores.normal_()
        idx.random_(0, 8)
        g.replay()
        torch.cuda.synchronize()
        _same(out, fn(), name)
