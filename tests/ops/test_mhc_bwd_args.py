"""The mHC backward ops called directly (``tilebin::mhc_*_bwd``, CPU, launcher stubbed): a buffer the
kernels write must be 16-byte aligned, and ``w_grad`` comes exactly with a norm weight; found by the
GPU fuzz (a misaligned ``x_grad`` reached the kernel: a misaligned-address fault; a missing
``w_grad`` raised AttributeError)."""

from __future__ import annotations

import pytest
import torch

from ops_stub import StubbedOps
from tilebin.modeling.mhc.ops import norm_fn, pre_apply_mix
from tilebin.runtime import ArgumentError

BF, F32 = torch.bfloat16, torch.float32


@pytest.fixture
def ops(monkeypatch):
    return StubbedOps(monkeypatch)


def _norm_fn_bwd_args(weight: bool, x_grad=None, w_grad="auto"):
    t, m, h = 3, 4, 64
    k = m * (m + 2)
    r = torch.randn(1, t, m, h).to(BF)
    w = torch.rand(m * h) if weight else None
    wg = (torch.zeros(m * h) if weight else None) if w_grad == "auto" else w_grad
    return [torch.randn(1, t, k), r, torch.randn(k, m * h), torch.randn(k, m * h), w, torch.rand(t, k), torch.rand(t),
            1e-6, torch.empty_like(r) if x_grad is None else x_grad, False, torch.zeros(k, m * h), wg, False]


def _misaligned(shape, dtype):
    """A contiguous tensor of ``shape`` starting one element (2 or 4 bytes) into its buffer."""
    n = torch.Size(shape).numel()
    return torch.zeros(n + 8, dtype=dtype)[1:n + 1].view(shape)


@pytest.mark.parametrize("weight", [False, True])
def test_norm_fn_bwd_valid_calls_launch(ops, weight):
    for _ in range(2):  # the first call and a replay
        norm_fn.NORM_FN_BWD(*_norm_fn_bwd_args(weight))
    assert [name for name, _, _ in ops.launches].count("mhc.norm_fn_grad_reduce") == 2


@pytest.mark.parametrize("weight, w_grad", [(True, None), (False, torch.zeros(256))])
def test_norm_fn_bwd_w_grad_comes_with_the_norm_weight(ops, weight, w_grad):
    with pytest.raises(ArgumentError, match="pass w_grad exactly when the forward had a norm weight"):
        norm_fn.NORM_FN_BWD(*_norm_fn_bwd_args(weight, w_grad=w_grad))
    assert not ops.launches


@pytest.mark.parametrize("replay", [False, True])
def test_norm_fn_bwd_refuses_a_misaligned_x_grad(ops, replay):
    if replay:
        norm_fn.NORM_FN_BWD(*_norm_fn_bwd_args(False))
    before = len(ops.launches)
    with pytest.raises(ArgumentError, match="x_grad's data pointer .* not 16-byte aligned"):
        norm_fn.NORM_FN_BWD(*_norm_fn_bwd_args(False, x_grad=_misaligned((1, 3, 4, 64), BF)))
    assert len(ops.launches) == before


@pytest.mark.parametrize("spec, written", [(norm_fn.NORM_FN_BWD, ("x_grad", "fn_grad", "w_grad")),
                                            (pre_apply_mix.APPLY_MIX_BWD, ("grad_x",))], ids=lambda v: str(v)[:20])
def test_the_written_buffers_declare_their_alignment(spec, written):
    declared = {p.name: p.ptr_align for p in spec.params if getattr(p, "mutated", False)}
    assert declared == dict.fromkeys(written, 16)
