"""Regression tests of the bad calls the H200 fuzz of 2026-12-01 found (CPU, launch stubbed).

Each failed on the main of that day: an untyped exception, a bad value accepted, or a bad call
that changed how a later valid call ran (a poisoned memo).
"""

from __future__ import annotations

import pytest
import torch

from ops_stub import StubbedOps, describe, describe_launches
from tilebin import runtime
from tilebin.ops import moe, quant
from tilebin.runtime import ArgumentError, NoVariantError, TilebinError

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one


@pytest.fixture
def ops(monkeypatch):
    return StubbedOps(monkeypatch)


def _fresh_then(ops, valid, bad):
    """``valid()`` in a fresh process, then ``bad()`` (must be an ArgumentError), then ``valid()``
    again: the launches and results must equal the fresh ones."""
    ops.fresh()
    ops.launches.clear()
    want = describe(valid()), describe_launches(ops.launches)
    ops.fresh()
    with pytest.raises(ArgumentError):
        bad()
    for _ in range(2):  # the first valid call may memoize; the second runs from the memo
        ops.launches.clear()
        assert (describe(valid()), describe_launches(ops.launches)) == want


def test_per_block_cast_float_block_size_is_refused_and_poisons_nothing(ops):
    x = torch.randn(256, 512, dtype=torch.bfloat16)
    _fresh_then(ops, lambda: quant.per_block_cast(x, "e4m3", (128, 128)),
                lambda: quant.per_block_cast(x, "e4m3", (128.0, 128.0)))
    with pytest.raises(ArgumentError, match="block_size"):
        quant.per_block_cast(x, "e4m3", (True, 128))


@pytest.mark.parametrize("flag", ["round_sf", "use_tma_aligned_col_major_sf", "use_packed_ue8m0"])
@pytest.mark.parametrize("value", ["yes", 2, 1.0, None])
def test_per_block_cast_flags_are_bools(ops, flag, value):
    x = torch.randn(128, 128, dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match=flag):
        quant.per_block_cast(x, "e4m3", (128, 128), **{flag: value})


def _mapping(tokens=4, topk=2, slots=16):
    ttp = torch.arange(tokens * topk, dtype=torch.int32).reshape(tokens, topk)
    return ttp, torch.zeros(slots, dtype=torch.int32)


def test_expand_to_fused_without_pos_to_expert(ops):
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    ttp, pte = _mapping()
    _fresh_then(ops, lambda: moe.expand_to_fused(x, ttp, pte), lambda: moe.expand_to_fused(x, ttp, None))
    with pytest.raises(ArgumentError, match="pos_to_expert must be a torch.Tensor"):
        moe.expand_to_fused(x, ttp, None)


def test_expand_to_fused_with_sf_without_pos_to_expert(ops):
    data = torch.randn(4, 256).to(torch.float8_e4m3fn)
    sf = torch.ones(4, 2)
    ttp, pte = _mapping()
    _fresh_then(ops, lambda: moe.expand_to_fused_with_sf((data, sf), 128, ttp, pte),
                lambda: moe.expand_to_fused_with_sf((data, sf), 128, ttp, None))


@pytest.mark.parametrize("num_per_channels", [0, 128])
def test_swiglu_forward_zero_width(ops, num_per_channels):
    x = torch.empty(3, 0, dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match="and hidden > 0"):
        quant.swiglu_forward_and_per_token_cast(x, "e4m3", num_per_channels)


def test_check_int_refuses_tensors(ops):
    """A 0-d CUDA tensor as an int would be read back with a device sync: refused like any tensor."""
    topk_idx = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(ArgumentError, match="num_experts must be an int, got Tensor"):
        moe.get_fused_mapping(topk_idx, torch.tensor(8), 64, 16)
    with pytest.raises(ArgumentError, match="alignment must be an int, got Tensor"):
        moe.get_fused_mapping(topk_idx, 8, 64, torch.tensor(16))


def test_reduce_fused_pair_with_none_scale(ops):
    x = torch.randn(8, 128, dtype=torch.bfloat16)
    ttp = torch.arange(8, dtype=torch.int32).reshape(4, 2)
    w = torch.ones(4, 2)
    _fresh_then(ops, lambda: moe.reduce_fused(x, w, ttp), lambda: moe.reduce_fused((x, None), w, ttp))
    moe.reduce_fused(x, w, ttp)  # memo warm with the plain x: the pair is still refused
    with pytest.raises(ArgumentError, match="x_sf None"):
        moe.reduce_fused((x, None), w, ttp)


def _gate(num_shared_experts, use_shared_as_routed=False):
    logits = torch.randn(4, 64)
    bias = torch.zeros(64)
    return moe.top2_sum_gate(logits, bias, 6, 4, 8, use_shared_as_routed, num_shared_experts, 1.0, 0, 1, 0, 1,
                             "sigmoid")


@pytest.mark.parametrize("bad", ["1", 1.0, None, -1, True])
def test_top2_sum_gate_checks_num_shared_experts_when_not_routed(ops, bad):
    _fresh_then(ops, lambda: _gate(1), lambda: _gate(bad))


def test_no_variant_error_is_an_argument_error():
    """One rule: every refusal of a call's arguments is an ArgumentError, "no such variant" too."""
    assert issubclass(NoVariantError, ArgumentError)
    assert issubclass(NoVariantError, TilebinError) and issubclass(NoVariantError, LookupError)
    assert runtime.ArgumentError is ArgumentError



# ---- found by tests/ops/test_ops_fuzz_props.py (2026-12-01)
def test_float_scalars_beyond_float32_become_infinite(ops):
    """1e40 as a clamp used to reach the float32 kernel scalar as is (the packer overflowed)."""
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    for _ in range(2):  # checked path, then the memo
        quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128, swiglu_clamp_value=-1e40)
        args = [a for a in ops.launches[-1][2] if not isinstance(a, torch.Tensor)]
        assert float("-inf") in args and not any(type(a) is float and 3.5e38 < abs(a) < float("inf") for a in args)
    logits, bias = torch.randn(4, 64), torch.zeros(64)
    for factor in (1e40, 10**400):  # a float and an int past float32 (and past float64)
        moe.top2_sum_gate(logits, bias, 6, 4, 8, False, 0, factor, 0, 1, 0, 1, "sigmoid")
        assert float("inf") in [a for a in ops.launches[-1][2] if not isinstance(a, torch.Tensor)]


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view whose data pointer is 4 bytes past a 16-byte boundary."""
    base = torch.empty(t.numel() + 16 // t.element_size(), dtype=t.dtype)
    view = base[4 // t.element_size():][:t.numel()].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16
    return view


def test_misaligned_read_only_inputs_are_copied_not_launched(ops):
    """A chunk of token_topk_to_pos / topk_weights that starts inside a tensor used to be launched
    misaligned (the kernels' contract is 16 bytes); now it is copied to an aligned buffer."""
    x = torch.randn(8, 128, dtype=torch.bfloat16)
    ttp = torch.arange(8, dtype=torch.int32).reshape(4, 2)
    w = torch.ones(4, 2)
    for _ in range(2):  # checked path, then the memo
        moe.reduce_fused(x, _misaligned(w), _misaligned(ttp))
        args = ops.launches[-1][2]
        assert all(a.data_ptr() % 16 == 0 for a in args[:5] if isinstance(a, torch.Tensor))
        assert torch.equal(args[2], ttp) and torch.equal(args[1], w)
