"""The memoized fast path of swiglu_forward_and_per_token_cast (CPU, no GPU: the launcher
records, the device check passes; cast_back's replay: test_cast_back_replay.py; per_token_cast's:
test_per_token_replay.py).

A configuration is memoized only after the checked path accepted it; a later call with the same
configuration skips the checks.  Here every fast call is compared with the checked path on the
same arguments (memo emptied): the same kernel, key and scalar arguments, tensor arguments of the
same dtype/shape/strides (the same objects where the checked path passes an input or a stand-in
through), outputs of the same dtype/shape/strides; and everything the checked path refuses is
still refused, with the same message, once the memo is warm.
"""

from __future__ import annotations

import math

import pytest
import torch

from tilebin.ops.quant import _swiglu as sw
from tilebin.runtime import ArgumentError

BF16, FP32, E4M3 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
CHECKED = {sw: "_forward_checked"}


class Recorder:
    """Launches (name, key, args) and how often each module's checked path ran."""

    def __init__(self, monkeypatch):
        self.calls: list = []
        self.checked = {mod: 0 for mod in CHECKED}
        for mod, name in CHECKED.items():
            monkeypatch.setattr(mod, "launcher", self._launcher)
            monkeypatch.setattr(mod, "check_cuda", lambda op, **tensors: None)
            monkeypatch.setattr(mod, "_FAST", {})
            monkeypatch.setattr(mod, name, self._counting(mod, getattr(mod, name)))
        monkeypatch.setattr(sw, "get_num_sms", lambda device=None: 132)
        monkeypatch.setattr(sw, "_DUMMIES", {})

    def _launcher(self, name, **key):
        return lambda *args: self.calls.append((name, key, args))

    def _counting(self, mod, fn):
        def counted(*args, **kwargs):
            self.checked[mod] += 1
            return fn(*args, **kwargs)

        return counted

    def run(self, mod, call, *, fast: bool):
        """``(result, launches)`` of ``call()``; asserts whether the checked path ran."""
        before, start = self.checked[mod], len(self.calls)
        result = call()
        ran_checked = self.checked[mod] != before
        assert ran_checked != fast, f"expected the {'fast' if fast else 'checked'} path"
        return result, self.calls[start:]

    def checked_run(self, mod, call):
        """``call()`` through the checked path (memo emptied for it, then restored; what the call
        memoized stays)."""
        saved = dict(mod._FAST)
        mod._FAST.clear()
        try:
            return self.run(mod, call, fast=False)
        finally:
            mod._FAST.update(saved)


@pytest.fixture
def rec(monkeypatch):
    return Recorder(monkeypatch)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)


def _sig(value, known: list, args: tuple = ()):
    """Comparable description: tensors by dtype/shape/strides/offset, which known tensor they are
    (inputs, stand-ins) and which launch argument they share memory with (outputs)."""
    if isinstance(value, (tuple, list)):
        return tuple(_sig(v, known, args) for v in value)
    if isinstance(value, torch.Tensor):
        same = next((i for i, k in enumerate(known) if value is k), None)
        shares = next((i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel() and value.numel()
                       and _storage(a) == _storage(value)), None)
        return ("tensor", value.dtype, tuple(value.shape), value.stride(), value.storage_offset(), value.device,
                same, shares)
    return (type(value), value)


def assert_same(mod, slow, fast, known: list):
    """Two ``(result, launches)`` describe the same work."""
    known = known + list(sw._DUMMIES.values())
    (r_slow, l_slow), (r_fast, l_fast) = slow, fast
    assert len(l_slow) == len(l_fast) <= 1
    args_slow = l_slow[0][2] if l_slow else ()
    args_fast = l_fast[0][2] if l_fast else ()
    if l_slow:
        (n1, k1, a1), (n2, k2, a2) = l_slow[0], l_fast[0]
        assert n1 == n2 and k1 == k2
        assert _sig(a1, known) == _sig(a2, known)
        for x1, x2 in zip(a1, a2):  # inputs (or their copies) hold the same values
            if isinstance(x1, torch.Tensor) and any(x1 is k or _shares(x1, k) for k in known):
                assert torch.equal(x1.view(torch.uint8) if x1.dtype == E4M3 else x1,
                                   x2.view(torch.uint8) if x2.dtype == E4M3 else x2)
    assert _sig(r_slow, known, args_slow) == _sig(r_fast, known, args_fast)


def _shares(t: torch.Tensor, k: torch.Tensor) -> bool:
    return t.numel() > 0 and k.numel() > 0 and _storage(t) == _storage(k)


def _raises(match: str, fn, *args, **kwargs):
    """``fn`` raises ArgumentError matching ``match``, with a warm memo and with an empty one
    (the same message), and memoizes nothing."""
    mod = {sw.swiglu_forward_and_per_token_cast: sw}.get(fn)
    saved = dict(mod._FAST) if mod else {}
    with pytest.raises(ArgumentError, match=match) as warm:
        fn(*args, **kwargs)
    if mod:
        assert mod._FAST == saved
        mod._FAST.clear()
        try:
            with pytest.raises(ArgumentError) as cold:
                fn(*args, **kwargs)
        finally:
            mod._FAST.update(saved)
        assert str(cold.value) == str(warm.value)
        assert mod._FAST == saved


def _misaligned(shape, dtype):
    """A contiguous tensor whose data pointer is one element past a 16-byte boundary."""
    flat = torch.randn(math.prod(shape) + 1).to(dtype)
    return flat[1:].view(shape)


# -------------------------------------------------------------------- swiglu per-token forward
def _sw(x, npc=128, *flags, **kw):
    return lambda: sw.swiglu_forward_and_per_token_cast(x, "e4m3", npc, None, None, None, *flags, **kw)


def _sw_both(rec, x, npc, *flags, **kw):
    slow = rec.checked_run(sw, _sw(x, npc, *flags, **kw))
    fast = rec.run(sw, _sw(x, npc, *flags, **kw), fast=True)
    assert_same(sw, slow, fast, [x])


SW_FLAGS = [(), (False, False, False), (True, False, False), (False, True, False), (True, True, True), (1, 1, 1)]


@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.parametrize("hidden, npc, flags", [
    (hidden, npc, flags) for hidden, npc in [(576, 128), (7168, 128), (576, 576), (7168, 7168), (64, 64)]
    for flags in SW_FLAGS if npc == 128 or not (flags and flags[0])])  # column-major needs 128
def test_swiglu_fast_matches_checked(rec, dtype, hidden, npc, flags):
    rec.run(sw, _sw(torch.zeros(4, 2 * hidden, dtype=dtype), npc, *flags), fast=False)
    assert len(sw._FAST) == 1
    for tokens in (4, 0, 1, 7, 300, 5000):  # (x is passed as is: its values do not matter)
        x = torch.zeros(tokens, 2 * hidden, dtype=dtype)
        _sw_both(rec, x, npc, *flags)
        for kw in ({"swiglu_clamp_value": 10.0}, {"sf_clamp_min": 1e-3}, {"swiglu_clamp_value": math.inf},
                   {"swiglu_clamp_value": -0.5, "sf_clamp_min": 0.0}):
            _sw_both(rec, x, npc, *flags, **kw)


def test_swiglu_clamp_values_not_plain_floats(rec):
    """Clamp values that are not plain floats go through the checks (same launch)."""
    x = torch.randn(4, 1152).to(BF16)
    rec.run(sw, _sw(x), fast=False)
    for kw in ({"swiglu_clamp_value": 10}, {"sf_clamp_min": 1}):
        slow = rec.checked_run(sw, _sw(x, **kw))
        again = rec.run(sw, _sw(x, **kw), fast=False)
        assert_same(sw, slow, again, [x])
        assert type(again[1][0][2][7]) is float and type(again[1][0][2][8]) is float


def test_swiglu_optional_tensors_checked(rec):
    x = torch.randn(4, 1152).to(BF16)
    rec.run(sw, _sw(x), fast=False)
    p2t, w, p2e = torch.arange(4, dtype=torch.int32), torch.ones(4, 1), torch.zeros(4, dtype=torch.int32)
    cc = torch.zeros(3, dtype=torch.int64)
    for kw in ({"pos_to_token_topk": p2t, "topk_weights": w}, {"topk_weights": w}, {"pos_to_expert": p2e},
               {"clamped_count": cc, "swiglu_clamp_value": 1.0}):
        for _ in range(2):
            rec.run(sw, lambda: sw.swiglu_forward_and_per_token_cast(x, "e4m3", 128, **kw), fast=False)
    assert len(sw._FAST) == 1
    rec.run(sw, _sw(x), fast=True)


def test_swiglu_refusals_after_warm(rec):
    x = torch.randn(4, 1152).to(BF16)
    rec.run(sw, _sw(x), fast=False)
    rec.run(sw, _sw(x), fast=True)
    op = "swiglu_forward_and_per_token_cast"
    wide = torch.randn(4, 1280).to(BF16)
    _raises(rf"{op}: x must be contiguous", sw.swiglu_forward_and_per_token_cast, wide[:, :1152], "e4m3", 128)
    _raises(rf"{op}: x must be contiguous", sw.swiglu_forward_and_per_token_cast, x[::2], "e4m3", 128)
    _raises(rf"{op}: x's data pointer .* is not 16-byte aligned", sw.swiglu_forward_and_per_token_cast,
            _misaligned((4, 1152), BF16), "e4m3", 128)
    _raises(rf"{op}: swiglu_clamp_value must be a float or None, got float nan", sw.swiglu_forward_and_per_token_cast,
            x, "e4m3", 128, swiglu_clamp_value=math.nan)
    _raises(rf"{op}: sf_clamp_min must be a float or None, got bool True", sw.swiglu_forward_and_per_token_cast,
            x, "e4m3", 128, sf_clamp_min=True)
    _raises(rf"{op}: swiglu_clamp_value must be a float or None, got str", sw.swiglu_forward_and_per_token_cast,
            x, "e4m3", 128, swiglu_clamp_value="1")
    _raises(rf"{op}: num_per_channels=128.0 is not supported", sw.swiglu_forward_and_per_token_cast, x, "e4m3", 128.0)
    _raises(rf"{op}: round_sf must be a bool, got float", sw.swiglu_forward_and_per_token_cast, x, "e4m3", 128,
            round_sf=1.0)
    _raises(rf"{op}: fmt='e2m1' is not supported", sw.swiglu_forward_and_per_token_cast, x, "e2m1", 128)
    _raises(rf"{op}: x has dtype float16", sw.swiglu_forward_and_per_token_cast, x.half(), "e4m3", 128)
    _raises(rf"{op}: x has 1088 columns", sw.swiglu_forward_and_per_token_cast, torch.randn(4, 1088).to(BF16),
            "e4m3", 128)
    _raises(rf"{op}: clamped_count needs swiglu_clamp_value", sw.swiglu_forward_and_per_token_cast, x, "e4m3", 128,
            clamped_count=torch.zeros(3, dtype=torch.int64))
    assert len(sw._FAST) == 1


def test_swiglu_other_device_misses(rec):
    rec.run(sw, _sw(torch.randn(4, 1152).to(BF16)), fast=False)
    rec.run(sw, _sw(torch.empty(4, 1152, dtype=BF16, device="meta")), fast=False)
    rec.run(sw, _sw(torch.empty(4, 1152, dtype=BF16, device="meta")), fast=True)
    assert len(sw._FAST) == 2


# ------------------------------------------------------------- the hot calls, spelled out in full
def test_hot_launches_explicit(rec):
    """The launches both paths make for the decode-size hot calls, written out (independent of
    the ops' own arithmetic)."""
    x2 = torch.zeros(4, 2 * 7168, dtype=BF16)
    for fast in (False, True):
        (out, sf), [(name, key, args)] = rec.run(sw, _sw(x2), fast=fast)
        assert name == "quant.swiglu_forward_and_per_token_cast"
        assert key == dict(in_dtype="bfloat16", sf_kind="row", count_clamp=False)
        assert args[0] is x2 and args[1] is out and args[2] is sf
        assert [(a.dtype, tuple(a.shape)) for a in args[3:7]] == [(torch.int32, (1,)), (FP32, (1, 1)),
                                                                  (torch.int32, (1,)), (torch.int64, (3,))]
        assert args[7:] == (math.inf, 1e-4, 0, 0, 0, 7)
        assert (out.dtype, out.shape, out.stride()) == (E4M3, (4, 7168), (7168, 1))
        assert (sf.dtype, sf.shape, sf.stride()) == (FP32, (4, 56), (56, 1))
        (_, _), [(_, _, args)] = rec.run(sw, _sw(torch.zeros(5000, 2 * 7168, dtype=BF16), 7168, False, True,
                                                 swiglu_clamp_value=7.5), fast=fast)
        assert args[7:] == (7.5, 1e-4, 1, 0, 0, 264)
