"""GPU tests of the ``mhc.multilayer_recompute`` speed candidates (issue 9, round 6) against the
shipped op, bit for bit.

Each candidate kernel of ``kernels/mhc/multilayer_recompute_candidate.py`` (``_i2s3``, ``_i2s2``,
``_i3s3``: the shipped kernel at other (S, ITEMS, blocks/SM) at M = 4) is launched
directly as ``bench/bench_mhc.py``'s ``_recompute_call`` launches it:
``runtime.unchecked_launcher(name, mhc_mult=M)(initial_residual.view(n, M, hidden), ptrs,
num_post)`` with the op's pointer table (rows pre_mix, layer_input, layer_output, post_mix,
comb_mix, residual; unused slots 0).  Its written tensors start NaN-filled (an element it forgot
stays NaN) and are compared with ``torch.equal`` to the shipped op's (also NaN-filled) on the same
fresh random inputs.  Shapes: leading dims ``(1, n1)``, n1 in {1, 13, 4096} (the op launches
nothing at 0 tokens), hidden in {1280, 4096, 4160, 7168} (1280: one half-idle segment; 4160: a
last segment of 8 vectors), mhc_mult 4, and (num_layers, num_post) in (1, 0), (1, 1),
(2, 1), (2, 2), (3, 2), (3, 3) (3 layers: layer 2's output by LDG; n1 13 x hidden 1280 / 4160: blocks spanning two
tokens and partial chunks).
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import seed

BF16 = torch.bfloat16
CANDIDATES = tuple(f"mhc._multilayer_recompute_candidate_{t}" for t in ("i2s3", "i2s2", "i3s3"))
N1 = (1, 13, 4096)
HIDDEN = (1280, 4096, 4160, 7168)
LAYERS = ((1, 0), (1, 1), (2, 1), (2, 2), (3, 2), (3, 3))
# M = 4 only: at M = 2 and 8 the candidates are the shipped kernel
CASES = [(m, n1, h, layers, post) for m in (4,) for n1 in N1 for h in HIDDEN for layers, post in LAYERS]
IDS = [f"m{m}-n{n1}-h{h}-L{layers}-post{post}" for m, n1, h, layers, post in CASES]


def _bf16(*shape) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(BF16)


def _nan(*shape) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=BF16, device="cuda")


@pytest.mark.parametrize("kernel", CANDIDATES)
@pytest.mark.parametrize("m, n1, h, layers, post", CASES, ids=IDS)
def test_multilayer_recompute_candidate(rt, require, kernel, m, n1, h, layers, post):
    from tilebin.modeling.mhc import ops

    require("mhc.multilayer_recompute")
    require(kernel)
    seed("cand_mhc_recompute_r6", m, n1, h, layers, post)
    r0 = _bf16(1, n1, m, h)
    pre = [torch.rand(1, n1, m, 1, device="cuda") for _ in range(layers)]
    outs = [_bf16(1, n1, h) for _ in range(post)]
    posts = [torch.randn(1, n1, m, 1, device="cuda") * 2 for _ in range(post)]
    combs = [torch.rand(1, n1, m, m, device="cuda") for _ in range(post)]

    def written():
        return [_nan(1, n1, h) for _ in range(layers)], [_nan(1, n1, m, h) for _ in range(post)]

    want_in, want_res = written()
    ops.mhc_multilayer_recompute(r0, pre, outs, posts, combs, want_in, want_res)
    got_in, got_res = written()
    table = []
    for row in (pre, got_in, outs, posts, combs, got_res):
        table += [t.data_ptr() for t in row] + [0] * (layers - len(row))
    ptrs = torch.tensor(table, dtype=torch.int64, device="cuda").view(6, layers)
    rt.unchecked_launcher(kernel, mhc_mult=m)(r0.view(-1, m, h), ptrs, post)
    torch.cuda.synchronize()
    for name, got, want in (("layer_input", got_in, want_in), ("residual", got_res, want_res)):
        for i, (g, w) in enumerate(zip(got, want)):
            assert not w.isnan().any(), f"the shipped op left NaN in {name}[{i}]"
            assert torch.equal(g, w), f"{kernel}: {name}[{i}] differs at m{m} n1 {n1} h{h} L{layers} post{post}"
