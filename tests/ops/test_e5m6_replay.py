"""The replay of validated configurations of ``per_token_cast_to_e5m6`` and of
``per_token_cast(fmt='e5m6')`` (which runs its checks and launch), declared by their OpSpecs (CPU,
no GPU: the launcher records, the device check passes): a replayed call launches what the
checked call launches, and a refusal after warm-up reads as a cold one, launching and storing
nothing (the helpers: ``_per_token_replay_util.py``)."""

from __future__ import annotations

import pytest
import torch

from replay_util import Recorder, assert_same, misaligned, raises
from tilebin.ops.quant import _e5m6 as e5
from tilebin.ops.quant import _per_token as pt

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

BF16, FP32 = torch.bfloat16, torch.float32


@pytest.fixture
def rec(monkeypatch):
    return Recorder(monkeypatch)


@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.parametrize("hidden", [576, 7168])
@pytest.mark.parametrize("flags", [(False, False, False), (True, False, False), (True, True, True), (0, 1, 0)])
def test_e5m6_replay_matches_checked(rec, dtype, hidden, flags):
    """per_token_cast_to_e5m6 and per_token_cast(fmt='e5m6'): a configuration each, replayed."""
    def direct(x):
        return lambda: e5.per_token_cast_to_e5m6(x, hidden, *flags)

    def via_cast(x):
        return lambda: pt.per_token_cast(x, "e5m6", hidden, None, *flags)

    for spec, call in ((e5.E5M6, direct), (pt.CAST, via_cast)):
        rec.run(call(torch.randn(4, hidden).to(dtype)), fast=False)
        for x in (torch.randn(4, hidden).to(dtype), torch.randn(0, hidden).to(dtype), torch.randn(9, hidden).to(dtype),
                  torch.randn(3, hidden + 64).to(dtype)[:, :hidden], misaligned((2, hidden), dtype)):
            slow = rec.checked_run(spec, call(x))
            fast = rec.run(call(x), fast=True)
            assert_same(slow, fast, [x])
            assert_same(slow, rec.checked_run(e5.E5M6, direct(x)), [x])  # fmt='e5m6' launches what the op does
        assert len(spec.memo) == 1


def test_e5m6_element_limit_per_call(rec):
    """The 32-bit element limit depends on the token count: checked on every call (meta tensors)."""
    small, big = (torch.empty(n, 4096, dtype=BF16, device="meta") for n in (4, 2**19))
    for spec, fn, args in ((e5.E5M6, e5.per_token_cast_to_e5m6, (4096,)),
                           (pt.CAST, pt.per_token_cast, ("e5m6", 4096))):
        rec.run(lambda: fn(small, *args), fast=False)
        rec.run(lambda: fn(small, *args), fast=True)
        raises(rec, spec, r"per_token_cast\(fmt='e5m6'\): x has 2147483648 elements; at most 2147483647", fn, big,
                *args)
        rec.run(lambda: fn(big[:-1], *args), fast=True)


def test_e5m6_refusals_after_warm(rec):
    x = torch.randn(4, 576).to(BF16)
    for flags in [(), (True, True, True)]:
        rec.run(lambda: e5.per_token_cast_to_e5m6(x, 576, *flags), fast=False)
        rec.run(lambda: pt.per_token_cast(x, "e5m6", 576, None, *flags), fast=False)
    op = r"per_token_cast\(fmt='e5m6'\)"
    for match, args in [
        (rf"{op}: num_per_channels=576.0 is not supported with fmt='e5m6'", (x, 576.0)),
        (rf"{op}: num_per_channels=True is not supported", (x[:, :1], True)),
        (rf"{op}: num_per_channels=128 is not supported with fmt='e5m6'", (x, 128)),
        (rf"{op}: round_sf must be a bool, got float 1.0", (x, 576, True, 1.0, True)),
        (rf"{op}: use_packed_ue8m0=True needs round_sf=True", (x, 576, True, False, True)),
        (rf"{op}: x has dtype float16", (x.half(), 576)),
        (rf"{op}: hidden=12 is not supported with fmt='e5m6'", (torch.zeros(4, 12), 12)),
    ]:
        raises(rec, e5.E5M6, match, e5.per_token_cast_to_e5m6, *args)
        raises(rec, pt.CAST, match, pt.per_token_cast, args[0], "e5m6", *args[1:2], None, *args[2:])
    raises(rec, pt.CAST, r"per_token_cast: x_block_size=\(1, 576\) is not supported with fmt='e5m6'",
            pt.per_token_cast, x, "e5m6", 576, (1, 576))
    assert len(e5.E5M6.memo) == 2 and len(pt.CAST.memo) == 2
