"""The replay of validated configurations of the per-token casts (``per_token_cast`` with a plain or
a quantized input, ``per_token_cast_with_sf_only``, ``per_token_cast_with_precomputed_sf``,
``per_token_cast_to_e5m6`` and ``per_token_cast(fmt='e5m6')``: ``test_e5m6_replay.py``), declared
by their OpSpecs (CPU, no GPU: the launcher records, the device check passes).

A configuration is stored in its spec's memo only after the checked path accepted it; a later
call with the same configuration runs only the per-call checks and the launch.  Here every
replayed call is compared with the checked path on the same arguments (memo emptied): the same
kernel, key and scalar arguments, tensor arguments of the same dtype/shape/strides (the same
objects where the checked path passes an input through), outputs of the same dtype/shape/strides;
and everything the checked path refuses is still refused, with the same message, launching and
storing nothing, once the memo is warm.
"""

from __future__ import annotations

import pytest
import torch

from replay_util import Recorder, assert_same, misaligned, raises
from tilebin.ops import _spec
from tilebin.ops.quant import _e5m6 as e5
from tilebin.ops.quant import _per_token as pt

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

BF16, FP32, E4M3, I8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int8


@pytest.fixture
def rec(monkeypatch):
    return Recorder(monkeypatch)


# ------------------------------------------------------------------------------- per_token_cast
def _pt(x, fmt="e4m3", npc=128, *flags):
    return lambda: pt.per_token_cast(x, fmt, npc, None, *flags)


def _pt_both(rec, x, fmt, npc, *flags):
    """The replayed call and the checked call on the same arguments agree."""
    slow = rec.checked_run(pt.CAST, _pt(x, fmt, npc, *flags))
    fast = rec.run(_pt(x, fmt, npc, *flags), fast=True)
    assert_same(slow, fast, [x])


PT_FLAGS = [(), (False, False, False), (True, False, False), (False, True, False), (True, True, True), (1, 1, 1),
            (True, 0, False)]


@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("hidden, npc", [(576, 16), (576, 32), (576, 64), (7168, 128), (576, 576), (7168, 7168),
                                         (576, 128)])
@pytest.mark.parametrize("flags", PT_FLAGS)
def test_per_token_replay_matches_checked(rec, dtype, fmt, hidden, npc, flags):
    x = torch.randn(4, hidden).to(dtype)
    rec.run(_pt(x, fmt, npc, *flags), fast=False)  # warms the memo
    assert len(pt.CAST.memo) == 1
    for tokens in (4, 0, 1, 7, 300):
        _pt_both(rec, torch.randn(tokens, hidden).to(dtype), fmt, npc, *flags)


@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_per_token_replay_row_layouts(rec, dtype):
    """Strided rows (passed as is), misaligned pointers and a transposed x (copied) replay too,
    with the checked path's kernel input."""
    rec.run(_pt(torch.randn(4, 576).to(dtype)), fast=False)
    wide = torch.randn(5, 640).to(dtype)
    for x in (wide[:, :576], wide[1:, 32:608], misaligned((4, 576), dtype), misaligned((1, 576), dtype),
              torch.randn(576, 6).to(dtype).T, wide[:, :576][::2]):
        _pt_both(rec, x, "e4m3", 128)


def test_per_token_miss_other_configs(rec):
    rec.run(_pt(torch.randn(4, 576).to(BF16)), fast=False)
    for call in (_pt(torch.randn(4, 576)), _pt(torch.randn(4, 640).to(BF16)), _pt(torch.randn(4, 576).to(BF16), "e2m1"),
                 _pt(torch.randn(4, 576).to(BF16), "e4m3", 64), _pt(torch.randn(4, 576).to(BF16), "e4m3", 128, True),
                 _pt(torch.randn(4, 576).to(BF16), "e4m3", 128, 0),  # False and 0: a key each (same launch)
                 _pt(torch.empty(4, 576, dtype=BF16, device="meta"))):  # another device
        rec.run(call, fast=False)
    assert len(pt.CAST.memo) == 8


def test_per_token_true_and_one_launch_alike(rec):
    x = torch.randn(4, 576).to(BF16)
    a = rec.run(_pt(x, "e4m3", 128, True, True, True), fast=False)
    b = rec.run(_pt(x, "e4m3", 128, 1, 1, 1), fast=False)
    assert_same(a, b, [x])


def test_per_token_refusals_after_warm(rec):
    x = torch.randn(4, 576).to(BF16)
    for flags in [(), (True, True, True)]:
        rec.run(_pt(x, "e4m3", 128, *flags), fast=False)
        rec.run(_pt(x, "e4m3", 128, *flags), fast=True)
    op, cast = "per_token_cast", pt.per_token_cast
    for match, args in [
        (rf"{op}: num_per_channels=128.0 is not supported", (x, "e4m3", 128.0)),
        (rf"{op}: num_per_channels=True is not supported", (x, "e4m3", True)),
        (rf"{op}: round_sf must be a bool, got float 1.0", (x, "e4m3", 128, None, True, 1.0, True)),
        (rf"{op}: use_tma_aligned_col_major_sf must be a bool, got float 0.0", (x, "e4m3", 128, None, 0.0)),
        (rf"{op}: use_packed_ue8m0=True needs use_tma_aligned_col_major_sf=True", (x, "e4m3", 128, None, False, True,
                                                                                 True)),
        (rf"{op}: x has dtype float16", (x.half(), "e4m3", 128)),
        (rf"{op}: x must be 2-D, got shape \(1, 4, 576\)", (x[None], "e4m3", 128)),
        (rf"{op}: x has hidden size 584", (torch.randn(4, 584).to(BF16), "e4m3", 128)),
        (rf"{op}: x_block_size=\(1, 128\) is only for a quantized", (x, "e4m3", 128, (1, 128))),
        (rf"{op}: fmt='e3m2' is not supported", (x, "e3m2", 128)),
        (rf"{op}: fmt=\['e4m3'\] is not supported", (x, ["e4m3"], 128)),
        (rf"{op}: num_per_channels=\[128\] is not supported", (x, "e4m3", [128])),
        (rf"{op}: x must be a torch.Tensor, got list", ([[1.0]], "e4m3", 128)),
    ]:
        raises(rec, pt.CAST, match, cast, *args)
    assert len(pt.CAST.memo) == 2


def test_per_token_memo_bounded(rec, monkeypatch):
    monkeypatch.setattr(_spec, "_MEMO_MAX", 3)
    for hidden in (64, 128, 192, 256, 320):
        rec.run(_pt(torch.randn(2, hidden).to(BF16)), fast=False)
    assert len(pt.CAST.memo) == 3
    rec.run(_pt(torch.randn(2, 320).to(BF16)), fast=False)  # not stored: checked every time
    rec.run(_pt(torch.randn(2, 64).to(BF16)), fast=True)


def test_per_token_hot_launches_explicit(rec):
    """The launches both paths make for the decode-size hot calls, written out (independent of
    the ops' own arithmetic)."""
    x = torch.randn(4, 7168).to(BF16)
    for fast in (False, True):
        (out, sf), [(name, key, args)] = rec.run(_pt(x), fast=fast)
        assert name == "quant.per_token_cast_decode"  # up to 256 tokens
        assert key == dict(in_dtype="bfloat16", fmt="e4m3", sf="f32", mode="cast", in_sf="none")
        assert args[0] is x and args[1] is out and args[2] is sf and args[3:] == (7, 0, 0, 0, 7)
        assert (out.dtype, out.shape, out.stride()) == (E4M3, (4, 7168), (7168, 1))
        assert (sf.dtype, sf.shape, sf.stride()) == (FP32, (4, 56), (56, 1))

        (out, sf), [(name, key, args)] = rec.run(_pt(x, "e4m3", 128, True, True, True), fast=fast)
        assert name == "quant.per_token_cast"  # packed UE8M0: never the decode kernel
        assert key["sf"] == "ue8m0" and args[3:] == (7, 0, 1, 1, 7)
        assert (args[2].dtype, args[2].shape, args[2].stride()) == (torch.uint8, (14, 16), (16, 1))
        assert (sf.dtype, sf.shape, sf.stride()) == (torch.int32, (4, 14), (1, 4))


# ------------------------------------------------------------------ per_token_cast of a (data, sf) pair
def _data(tokens, hidden, dtype):
    if dtype == I8:
        return torch.randint(-128, 128, (tokens, hidden // 2), dtype=I8)
    return torch.randn(tokens, hidden).clamp(-400, 400).to(E4M3)


def _sf(tokens, hidden, block, kind):
    m, k = -(-tokens // block[0]), -(-hidden // block[1])
    if kind == "row":
        return torch.rand(m, k) + 0.5
    if kind == "col":
        return (torch.rand(k, m) + 0.5).T
    return torch.randint(100, 140, (-(-k // 4), m), dtype=torch.int32).T  # packed UE8M0, column-major


def _pair_call(data, sf, block, fmt="e4m3", npc=128, *flags):
    return lambda: pt.per_token_cast((data, sf), fmt, npc, block, *flags)


@pytest.mark.parametrize("dtype", [E4M3, I8])
@pytest.mark.parametrize("block, kind", [((1, 128), "row"), ((1, 128), "col"), ((1, 128), "ue8m0"),
                                         ((128, 128), "row"), ((32, 32), "col"), ((1, 32), "ue8m0")])
@pytest.mark.parametrize("fmt, npc, flags", [("e4m3", 128, ()), ("e2m1", 32, (True, True, True)), ("e4m3", 576, ())])
def test_pair_replay_matches_checked(rec, dtype, block, kind, fmt, npc, flags):
    rec.run(_pair_call(_data(4, 576, dtype), _sf(4, 576, block, kind), block, fmt, npc, *flags), fast=False)
    assert len(pt.CAST_PAIR.memo) == 1 and not pt.CAST.memo
    for tokens in (4, 0, 1, 7, 300):  # (a one-column or one-row sf may read as column-major: another key)
        data, sf = _data(tokens, 576, dtype), _sf(tokens, 576, block, kind)
        call = _pair_call(data, sf, block, fmt, npc, *flags)
        slow = rec.checked_run(pt.CAST_PAIR, call)
        fast = rec.run(call, fast=True)
        assert_same(slow, fast, [data, sf])


def test_pair_per_call_checks_after_warm(rec):
    """A quantized pair's token count, strides and pointers are checked on every call."""
    block = (1, 128)
    data, sf = _data(4, 576, E4M3), _sf(4, 576, block, "row")
    rec.run(_pair_call(data, sf, block), fast=False)
    rec.run(_pair_call(data, sf, block), fast=True)
    op, wide = "per_token_cast", _data(4, 640, E4M3)
    flat = torch.zeros(4 * 576 + 1, dtype=torch.uint8)
    for match, pair in [
        (rf"{op}: x\[1\] \(sf\) has shape \(5, 5\); for data \(4, 576\)", (data, _sf(5, 576, block, "row"))),
        (rf"{op}: x\[1\] \(sf\) has shape \(4, 5\); for data \(3, 576\)", (data[:3], sf)),
        (rf"{op}: x\[0\] \(data\) must have unit column stride, a row stride that is a multiple of 16",
         (wide[:, 8:584], sf)),
        (rf"{op}: x\[0\] \(data\) must have unit column stride", (flat[1:].view(E4M3).view(4, 576), sf)),
        (rf"{op}: x\[1\] \(sf\) strides \(0, 1\) or its pointer are not usable",
         (data, torch.ones(1, 5).expand(4, 5))),  # a row stride of 0: the same key as a fresh sf
    ]:
        raises(rec, pt.CAST_PAIR, match, pt.per_token_cast, pair, "e4m3", 128, block)
    assert len(pt.CAST_PAIR.memo) == 1


def test_pair_key_variants(rec):
    """What a pair's key holds: its length, the sf orientation and row rule (another
    configuration each, never a replay of the first)."""
    block = (1, 128)
    data, sf = _data(4, 576, E4M3), _sf(4, 576, block, "row")
    rec.run(_pair_call(data, sf, block), fast=False)
    raises(rec, pt.CAST_PAIR, r"per_token_cast: a quantized input must be a \(data, sf\) tuple", pt.per_token_cast,
            (data, sf, sf), "e4m3", 128, block)
    raises(rec, pt.CAST_PAIR, r"per_token_cast: row-major input sf must be float32 with stride\(1\) == 1",
            pt.per_token_cast, (data, torch.ones(4, 10)[:, ::2]), "e4m3", 128, block)
    raises(rec, pt.CAST_PAIR, r"per_token_cast: column-major input sf has dtype torch.float64", pt.per_token_cast,
            (data, _sf(4, 576, block, "col").double()), "e4m3", 128, block)
    rec.run(_pair_call(data, _sf(4, 576, block, "col"), block), fast=False)  # another orientation: checked
    rec.run(_pair_call(data, _sf(4, 576, block, "col"), block), fast=True)
    rec.run(_pair_call(data, sf, [1, 128]), fast=False)  # a list block (accepted): another configuration
    rec.run(_pair_call(data, sf, [1, 128]), fast=True)
    raises(rec, pt.CAST_PAIR, r"per_token_cast: x_block_size=\(1.0, 128\) is not supported", pt.per_token_cast,
            (data, sf), "e4m3", 128, (1.0, 128))
    raises(rec, pt.CAST_PAIR, r"per_token_cast: x_block_size=\(True, 128\) is not supported", pt.per_token_cast,
            (data, sf), "e4m3", 128, (True, 128))
    raises(rec, pt.CAST_PAIR, r"per_token_cast: num_per_channels=128.0 is not supported", pt.per_token_cast,
            (data, sf), "e4m3", 128.0, block)
    assert len(pt.CAST_PAIR.memo) == 3


def test_plain_inputs_key_without_the_token_count():
    """per_token_cast (the hot path), sf_only and E5M6: the token count is not in the key, the
    hidden size and every scalar (with its type) are."""
    x, y = torch.zeros(4, 7168, dtype=BF16), torch.zeros(9, 7168, dtype=BF16)
    for spec in (pt.CAST, pt.SF_ONLY):
        args = ("e4m3", 128, None, False, False, False)
        assert spec.key((x, *args)) == spec.key((y, *args)) != spec.key((x[:, :4096], *args))
        assert spec.key((x, *args)) != spec.key((x, "e4m3", 128, None, 0, False, False))
    assert e5.E5M6.key((x, 128, False, False, False)) == e5.E5M6.key((y, 128, False, False, False))


# ----------------------------------------------------------------- sf only and precomputed scales
@pytest.mark.parametrize("npc, flags", [(128, ()), (32, (True, True, True)), (576, (False, True, False)),
                                        (64, (True, False, False))])
@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_sf_only_replay_matches_checked(rec, npc, flags, dtype):
    def call(x):
        return lambda: pt.per_token_cast_with_sf_only(x, "e4m3", npc, None, *flags)

    rec.run(call(torch.randn(4, 576).to(dtype)), fast=False)
    for x in (torch.randn(4, 576).to(dtype), torch.randn(0, 576).to(dtype), torch.randn(300, 576).to(dtype),
              torch.randn(5, 640).to(dtype)[:, :576], misaligned((3, 576), dtype)):
        slow = rec.checked_run(pt.SF_ONLY, call(x))
        assert_same(slow, rec.run(call(x), fast=True), [x])
    assert len(pt.SF_ONLY.memo) == 1


def _scales(tokens, groups, col):
    return torch.rand(groups, tokens) + 0.5 if col else torch.rand(tokens, groups) + 0.5


@pytest.mark.parametrize("col", [False, True])
@pytest.mark.parametrize("fmt, npc, groups", [("e4m3", 128, 5), ("e2m1", 16, 36), ("e4m3", 576, 1)])
def test_precomputed_replay_matches_checked(rec, col, fmt, npc, groups):
    def call(x, sf):
        return lambda: pt.per_token_cast_with_precomputed_sf(x, fmt, npc, sf, None, col)

    rec.run(call(torch.randn(4, 576).to(BF16), _scales(4, groups, col)), fast=False)
    for tokens in (4, 0, 1, 7, 300):  # one configuration whatever the token count (sf's sizes checked per call)
        x, sf = torch.randn(tokens, 576).to(BF16), _scales(tokens, groups, col)
        slow = rec.checked_run(pt.PRECOMPUTED, call(x, sf))
        assert_same(slow, rec.run(call(x, sf), fast=True), [x, sf])
    assert len(pt.PRECOMPUTED.memo) == 1


@pytest.mark.parametrize("col", [False, True])
def test_precomputed_per_call_checks_after_warm(rec, col):
    """Precomputed scales' sizes against the token count, and their strides, on every call."""
    op, x = "per_token_cast_with_precomputed_sf", torch.randn(4, 576).to(BF16)
    rec.run(lambda: pt.per_token_cast_with_precomputed_sf(x, "e4m3", 128, _scales(4, 5, col), None, col), fast=False)
    how = r"\[groups, tokens\]" if col else r"\[tokens, groups\]"
    want3 = r"\(5, 3\)" if col else r"\(3, 5\)"
    strided = torch.rand(5, 8)[:, ::2] if col else torch.rand(4, 10)[:, ::2]  # the right shape, a column stride of 2
    for match, x_, sf in [
        (rf"{op}: sf has shape .*; it must be {how} .*= {want3} for x of 3 x 576 values", x[:3], _scales(4, 5, col)),
        (rf"{op}: sf has shape .*; it must be {how}", x, _scales(4, 6, col)),
        (rf"{op}: sf must have unit stride along its last dim \(got strides \(\d+, 2\)\)", x, strided),
    ]:
        raises(rec, pt.PRECOMPUTED, match, pt.per_token_cast_with_precomputed_sf, x_, "e4m3", 128, sf, None, col)
    assert len(pt.PRECOMPUTED.memo) == 1
