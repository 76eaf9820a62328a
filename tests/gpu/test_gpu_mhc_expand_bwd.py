"""GPU tests of ``expand_to_mhc``'s backward kernel ``mhc.expand_bwd`` (a block per token segment,
4 streams' loads in flight per thread) over many shapes and on special values.

Every output is compared bit for bit with the emulated fp32 expression of ``mhc_ref`` (the same
the other mHC stream tests use), after filling the allocator's free memory with 0xFF (an element
the kernel forgot to write shows up as NaN).  Sizes: 0 tokens, decode sizes 1-128, odd token
counts, the benchmark shapes (4096 and 8192 tokens x hidden 4096 / 7168), hidden from 8 up to
8192 (multiples of 64 and a few of only 8), mhc_mult 4 and other stream counts from 1 to 33.
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import seed
from mhc_ref import expand as eref
from mhc_ref.close import assert_bitwise
from test_gpu_mhc_elementwise import _poison

BF16 = torch.bfloat16
# (leading dims, hidden) at mhc_mult 4: decode sizes, odd counts, every hidden up to 8192, the bench
SHAPES = ([((0,), 4096), ((2, 0), 7168)]
          + [((n,), 4096) for n in (1, 2, 3, 7, 16, 31, 64, 100, 128)]
          + [((1, 13), h) for h in (64, 128, 192, 512, 960, 1024, 1088, 2048, 2560, 3072, 5120, 6144, 7168, 8128, 8192)]
          + [((5,), h) for h in (8, 16, 72, 136, 1000, 1032, 4104, 8184)]
          + [((2, 513), 4096), ((1, 1023), 7168), ((4096,), 4096), ((4096,), 7168), ((1, 8192), 4096),
             ((1, 8192), 7168)])
# (mhc_mult, leading dims, hidden) for the other stream counts
OTHER = [(m, lead, h) for m in (2, 8) for lead, h in (((1,), 4096), ((3, 17), 7168), ((129,), 64), ((33,), 8192),
                                                      ((7,), 136), ((2048,), 4096))]
EXPAND_OTHER = OTHER + [(m, lead, h) for m in (1, 3, 5, 6, 7, 9, 16, 33) for lead, h in (((1,), 4096), ((37,), 7168),
                                                                                        ((5,), 72))]
CASES = [(4, lead, h) for lead, h in SHAPES] + EXPAND_OTHER
IDS = [f"m{m}-{'x'.join(map(str, lead))}-h{h}" for m, lead, h in CASES]


@pytest.fixture(autouse=True)
def _kernel(require):
    require("mhc.expand_bwd")


def _bf16(*shape):
    return torch.randn(*shape, device="cuda").to(BF16)


@pytest.mark.parametrize("m, lead, h", CASES, ids=IDS)
def test_expand_bwd(m, lead, h):
    from tilebin.modeling.mhc import ops

    seed("cand_expand_bwd", m, lead, h)
    x = _bf16(*lead, h).requires_grad_()
    out = ops.expand_to_mhc(x, m)
    g = _bf16(*lead, m, h)
    _poison(g, x)
    (gx,) = torch.autograd.grad(out, x, g)
    assert_bitwise(gx, eref.expand_bwd_emulated(g), f"expand bwd {lead} h{h} m{m}")


def _sum_from_zero(g: torch.Tensor) -> torch.Tensor:
    """The kernel's expression: IEEE fp32 adds from +0 in stream order, rounded to bf16 once."""
    acc = torch.zeros(g[..., 0, :].shape, dtype=torch.float32, device=g.device)
    for m in range(g.shape[-2]):
        acc = acc + g[..., m, :].to(torch.float32)
    return acc.to(BF16)


@pytest.mark.parametrize("m, h", [(1, 7168), (4, 7168), (4, 4096), (3, 72)])
def test_expand_bwd_special_values(m, h):
    """Signed zeros, infinities and NaNs: the sum from +0 (an all -0 column gives +0, where the
    emulation starting from stream 0 gives -0); NaN where the sum is NaN (its bits not compared:
    the device's bf16 conversion and torch's write different NaN patterns)."""
    from tilebin.modeling.mhc import ops

    seed("cand_expand_bwd_special", m, h)
    g = _bf16(37, m, h)
    flat = g.view(-1)
    flat[::7] = -0.0
    flat[3::101] = float("inf")
    flat[5::103] = -float("inf")
    flat[11::499] = float("nan")
    x = _bf16(37, h).requires_grad_()
    _poison(g, x)
    (gx,) = torch.autograd.grad(ops.expand_to_mhc(x, m), x, g)
    want = _sum_from_zero(g)
    nan = want.isnan()
    assert torch.equal(gx.isnan(), nan), f"expand bwd special values h{h} m{m}: NaN positions differ"
    assert_bitwise(gx.masked_fill(nan, 0.0), want.masked_fill(nan, 0.0), f"expand bwd special values h{h} m{m}")
