"""An mHC block under ``torch.compile(fullgraph=True)`` on CPU, the launches stubbed (``ops_stub``).

The block is ``mhc_pre -> linear -> mhc_post``.  Without autograd ``mhc_pre`` takes its fused path
(``tilebin::mhc_pre_big_fuse``); with it, the unfused ops run forward and backward through their
autograd Functions.  Compiled, every mHC launch is a ``tilebin::<op>`` custom op in the recorded
graphs (forward and backward), none breaks the graph, and the kernels launched are the eager
block's (the fused residual-gradient accumulation is eager-only: compiled, each gradient is
returned and summed by autograd, so only the accumulate flags differ).  ``torch.library.opcheck``
of the ``<op>_out`` variants, which the random cases of ``test_torch_library.py`` reach by chance.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ops_stub import StubbedOps  # noqa: E402

from tilebin.modeling.mhc import functional as F  # noqa: E402
from tilebin.ops._torch import register_all  # noqa: E402

M, H, T = 4, 64, 6


@pytest.fixture()
def stub(monkeypatch):
    register_all()
    return StubbedOps(monkeypatch)


def _block(residual, fn, scale, base, weight):
    x, (post_mix, comb_mix) = F.mhc_pre(residual, fn, scale, base, mhc_mult=M)
    y = torch.nn.functional.linear(x.float(), weight).to(torch.bfloat16)
    return F.mhc_post(y, residual, post_mix, comb_mix)


def _inputs(grad: bool):
    g = torch.Generator().manual_seed(0)
    k = M * H
    residual = torch.randn(2, T // 2, M, H, generator=g).to(torch.bfloat16)
    fn = torch.randn(M * (M + 2), k, generator=g) * k ** -0.5
    scale, base = torch.tensor([0.5, 0.7, 1.3]), torch.randn(M * (M + 2), generator=g) * 0.1
    weight = torch.randn(H, H, generator=g) * H ** -0.5
    return [t.requires_grad_(grad and t.is_floating_point()) for t in (residual, fn, scale, base, weight)]


def _custom_ops(graphs) -> set:
    """The tilebin custom ops the graphs call (a mutating one through auto_functionalized)."""
    ops = set()
    for gm in graphs:
        for n in gm.graph.nodes:
            target = n.args[0] if "auto_functionalized" in str(n.target) else n.target
            if n.op == "call_function" and str(target).startswith("tilebin."):
                ops.add(str(target).split(".")[1])
    return ops


def _kernels(stub) -> Counter:
    names = Counter(name for name, _, _ in stub.launches)
    stub.launches.clear()
    return names


def test_inference_block_compiles_to_the_fused_ops(stub):
    torch._dynamo.reset()
    args = _inputs(grad=False)
    with torch.no_grad():
        eager = _block(*args)
        want = _kernels(stub)
        backend = AotEagerAndRecordGraphs()
        got = torch.compile(_block, fullgraph=True, backend=backend)(*args)
    assert _kernels(stub) == want and "mhc.pre_big_fuse" in want
    assert _custom_ops(backend.fw_graphs) == {"mhc_pre_big_fuse", "mhc_post_fwd"}
    assert (got.shape, got.dtype) == (eager.shape, eager.dtype)


def test_training_block_compiles_forward_and_backward(stub):
    torch._dynamo.reset()
    args = _inputs(grad=True)
    _block(*args).float().sum().backward()
    want = _kernels(stub)
    eager_grads = [t.grad for t in args]
    for t in args:
        t.grad = None
    backend = AotEagerAndRecordGraphs()
    out = torch.compile(_block, fullgraph=True, backend=backend)(*args)
    out.float().sum().backward()
    assert _kernels(stub) == want
    forward = {"mhc_pre_norm_fn", "mhc_pre_split_mixes", "sinkhorn_normalize", "mhc_pre_apply_mix", "mhc_post_fwd"}
    assert _custom_ops(backend.fw_graphs) == forward
    assert _custom_ops(backend.bw_graphs) == {"mhc_pre_norm_fn_bwd", "mhc_pre_split_mixes_bwd",
                                              "sinkhorn_normalize_bwd", "mhc_pre_apply_mix_bwd", "mhc_post_bwd"}
    assert [(t.grad.shape, t.grad.dtype) for t in args] == [(g.shape, g.dtype) for g in eager_grads]


def test_out_variants_opcheck(stub):
    register_all()
    r, p, c = torch.randn(T, M, H).bfloat16(), torch.rand(T, M, 1), torch.rand(T, M, M)
    x = torch.randn(T, H).bfloat16()
    ops = torch.ops.tilebin
    for op, args in ((ops.expand_to_mhc_out, (x, M, torch.empty(T, M, H, dtype=torch.bfloat16))),
                     (ops.mhc_post_fwd_out, (x, r, p, c, torch.empty(T, M, H, dtype=torch.bfloat16))),
                     (ops.mhc_pre_apply_mix_out, (r, p, torch.empty(T, H, dtype=torch.bfloat16)))):
        torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))


def test_out_under_compile_records_the_out_op(stub):
    from tilebin.modeling.mhc.ops import expand_to_mhc

    torch._dynamo.reset()
    x = torch.randn(T, H).bfloat16()
    backend = AotEagerAndRecordGraphs()

    def fill(x, out):
        expand_to_mhc(x, M, out)
        return out

    out = torch.empty(T, M, H, dtype=torch.bfloat16)
    assert torch.compile(fill, fullgraph=True, backend=backend)(x, out) is out
    assert _custom_ops(backend.fw_graphs) == {"expand_to_mhc_out"}
    assert [name for name, _, _ in stub.launches] == ["mhc.expand_fwd"]
