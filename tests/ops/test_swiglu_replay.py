"""The replay of validated configurations of the SwiGLU ops (``swiglu_forward_and_per_token_cast``,
``swiglu_backward_and_per_token_cast``, ``swiglu_forward_and_per_channel_cast_and_transpose``),
declared by their OpSpecs (CPU, no GPU: the launcher records, the device check passes).

A configuration is stored in its spec's memo only after the checked path accepted it; a later
call with the same configuration runs only the per-call checks and the launch.  Every replayed
call here is compared with the checked path on the same arguments (memo emptied): the same
kernel, key and scalar arguments, tensor arguments of the same dtype/shape/strides (the same
objects where the checked path passes an input or a stand-in through), outputs of the same
dtype/shape/strides; and everything the checked path refuses is still refused once the memo is
warm, with the same message, launching and storing nothing.
"""

from __future__ import annotations

import math

import pytest
import torch

from _swiglu_replay_util import Recorder, assert_same, misaligned, odd_address, raises
from tilebin.ops.quant import _swiglu as sw

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

BF16, FP32, E4M3, I32, I64 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int32, torch.int64
FWD, BWD, CH = sw.SWIGLU_FWD, sw.SWIGLU_BWD, sw.SWIGLU_CHANNEL


@pytest.fixture
def rec(monkeypatch):
    return Recorder(monkeypatch)


def test_registered_schemas_are_unchanged():
    """The tilebin::<op> schemas, exactly as the ops registered them before they were declared by OpSpecs."""
    assert FWD.schema() == (
        "(Tensor x, str fmt, int num_per_channels, Tensor? pos_to_token_topk=None, Tensor? topk_weights=None, "
        "Tensor? pos_to_expert=None, bool use_tma_aligned_col_major_sf=False, bool round_sf=False, "
        "bool use_packed_ue8m0=False, float? swiglu_clamp_value=None, Tensor(a!)? clamped_count=None, "
        "float? sf_clamp_min=None) -> (Tensor, Tensor)")
    assert BWD.schema() == (
        "(Tensor x, Tensor x_sf, Tensor grad_out, Tensor weight, Tensor pos_to_token_topk, Tensor token_topk_to_pos, "
        "int num_per_channels, bool round_sf=False, float? swiglu_clamp_value=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")
    assert CH.schema() == ("(Tensor x, str fmt, int num_per_tokens, bool round_sf=False, bool without_transpose=False, "
                           "float? swiglu_clamp_value=None) -> (Tensor, Tensor)")
    ops = {op.name: op for op in sw.TORCH_OPS}
    assert [ops[s.name].schema for s in sw.SPECS] == [s.schema() for s in sw.SPECS]
    assert all(ops[s.name].fake == s.fake for s in sw.SPECS)


# -------------------------------------------------------------------- swiglu per-token forward
def _sw(x, npc=128, *flags, **kw):
    return lambda: sw.swiglu_forward_and_per_token_cast(x, "e4m3", npc, None, None, None, *flags, **kw)


SW_FLAGS = [(), (False, False, False), (True, False, False), (False, True, False), (True, True, True), (1, 1, 1)]


@pytest.mark.parametrize("dtype", [BF16, FP32])
@pytest.mark.parametrize("hidden, npc, flags", [
    (hidden, npc, flags) for hidden, npc in [(576, 128), (7168, 128), (576, 576), (7168, 7168), (64, 64)]
    for flags in SW_FLAGS if npc == 128 or not (flags and flags[0])])  # column-major needs 128
def test_swiglu_replay_matches_checked(rec, dtype, hidden, npc, flags):
    rec.run(_sw(torch.zeros(4, 2 * hidden, dtype=dtype), npc, *flags), fast=False)
    assert len(FWD.memo) == 1
    for tokens in (4, 0, 1, 7, 300, 5000):  # (x is passed as is: its values do not matter)
        x = torch.zeros(tokens, 2 * hidden, dtype=dtype)
        rec.both(FWD, _sw(x, npc, *flags), [x])
        for kw in ({"swiglu_clamp_value": 10.0}, {"sf_clamp_min": 1e-3}, {"swiglu_clamp_value": math.inf},
                   {"swiglu_clamp_value": -0.5, "sf_clamp_min": 0.0}):  # a configuration each
            rec.both(FWD, _sw(x, npc, *flags, **kw), [x])


def test_swiglu_clamp_values_are_configurations(rec):
    """A clamp value is part of the configuration with its type (10 and 10.0 are two; 0.0 and -0.0
    too): an int is checked once, then replayed, and reaches the kernel as a float."""
    x = torch.randn(4, 1152).to(BF16)
    for kw in ({"swiglu_clamp_value": 10}, {"sf_clamp_min": 1}, {"swiglu_clamp_value": 10.0},
               {"swiglu_clamp_value": 0.0}, {"swiglu_clamp_value": -0.0}):
        first = rec.run(_sw(x, **kw), fast=False)
        again = rec.run(_sw(x, **kw), fast=True)
        assert_same(first, again, [x])
        assert type(again[1][0][2][7]) is float and type(again[1][0][2][8]) is float
    assert math.copysign(1.0, again[1][0][2][7]) == -1.0  # -0.0 is not served 0.0's launch
    assert len(FWD.memo) == 5


def _routing(rows=4):
    """pos_to_token_topk, topk_weights, pos_to_expert and clamped_count for ``rows`` rows, by name."""
    return dict(pos_to_token_topk=torch.arange(rows, dtype=I32), topk_weights=torch.ones(max(rows, 1), 1),
                pos_to_expert=torch.zeros(rows, dtype=I32), clamped_count=torch.zeros(3, dtype=I64))


def test_swiglu_optional_tensors_replay(rec):
    """Calls with optional tensors are configurations of their own (which ones are given, their
    dtypes and devices): checked once, then replayed with the checked path's launch."""
    forms = (("pos_to_token_topk", "topk_weights"), ("topk_weights",), ("pos_to_expert",), ("clamped_count",),
             ("pos_to_token_topk", "topk_weights", "pos_to_expert", "clamped_count"))
    for names in forms:
        for rows in (4, 7, 0):
            x = torch.randn(rows, 1152).to(BF16)
            tensors = {name: t for name, t in _routing(rows).items() if name in names}
            clamp = {"swiglu_clamp_value": 1.0} if "clamped_count" in names else {}
            call = lambda: sw.swiglu_forward_and_per_token_cast(x, "e4m3", 128, **tensors, **clamp)  # noqa: E731
            rec.both(FWD, call, [x, *tensors.values()])
    assert len(FWD.memo) == len(forms)
    rec.run(_sw(torch.randn(4, 1152).to(BF16)), fast=False)  # no optional tensor: another configuration


def test_swiglu_misaligned_index_tensors_are_copied(rec):
    """A 4-byte aligned view that is not 16-byte aligned (a later chunk of rows) is copied for the
    kernel, replayed or not; clamped_count, written in place, never is."""
    x = torch.randn(4, 1152).to(BF16)
    p2t, p2e = torch.arange(5, dtype=I32)[1:], torch.zeros(5, dtype=I32)[1:]
    w = torch.ones(5, 1)[1:]
    call = lambda: sw.swiglu_forward_and_per_token_cast(x, "e4m3", 128, p2t, w, p2e)  # noqa: E731
    first = rec.run(call, fast=False)
    rec.both(FWD, call, [x, p2t, w, p2e])
    args = first[1][0][2]
    assert args[3] is not p2t and torch.equal(args[3], p2t) and args[3].data_ptr() % 16 == 0
    assert args[4] is not w and torch.equal(args[4], w) and args[5] is not p2e


def test_swiglu_refusals_after_warm(rec):
    x = torch.randn(4, 1152).to(BF16)
    rec.run(_sw(x), fast=False)
    rec.run(_sw(x), fast=True)
    op, fn = "swiglu_forward_and_per_token_cast", sw.swiglu_forward_and_per_token_cast
    wide = torch.randn(4, 1280).to(BF16)
    raises(rec, FWD, rf"{op}: x must be contiguous", fn, wide[:, :1152], "e4m3", 128)
    raises(rec, FWD, rf"{op}: x must be contiguous", fn, x[::2], "e4m3", 128)
    raises(rec, FWD, rf"{op}: x's data pointer .* is not 16-byte aligned", fn, misaligned((4, 1152), BF16), "e4m3",
            128)
    # no rows but a last-dim stride of 2: torch calls it contiguous, the op's alignment rule does not
    raises(rec, FWD, rf"{op}: x must be contiguous in its last dim", fn, torch.zeros(0, 2304, dtype=BF16)[:, ::2],
           "e4m3", 128)
    raises(rec, FWD, rf"{op}: swiglu_clamp_value must be a float or None, got float nan", fn, x, "e4m3", 128,
            swiglu_clamp_value=math.nan)
    raises(rec, FWD, rf"{op}: sf_clamp_min must be a float or None, got bool True", fn, x, "e4m3", 128,
            sf_clamp_min=True)
    raises(rec, FWD, rf"{op}: swiglu_clamp_value must be a float or None, got str", fn, x, "e4m3", 128,
            swiglu_clamp_value="1")
    raises(rec, FWD, rf"{op}: num_per_channels=128.0 is not supported", fn, x, "e4m3", 128.0)
    raises(rec, FWD, rf"{op}: round_sf must be a bool, got float", fn, x, "e4m3", 128, round_sf=1.0)
    raises(rec, FWD, rf"{op}: fmt='e2m1' is not supported", fn, x, "e2m1", 128)
    raises(rec, FWD, rf"{op}: x has dtype float16", fn, x.half(), "e4m3", 128)
    raises(rec, FWD, rf"{op}: x has 1088 columns", fn, torch.randn(4, 1088).to(BF16), "e4m3", 128)
    raises(rec, FWD, rf"{op}: clamped_count needs swiglu_clamp_value", fn, x, "e4m3", 128,
            clamped_count=torch.zeros(3, dtype=I64))
    for count in (torch.zeros(3, dtype=I32), torch.zeros(1, 3, dtype=I64), "counts"):  # the clamp is asked for first
        raises(rec, FWD, rf"{op}: clamped_count needs swiglu_clamp_value", fn, x, "e4m3", 128, clamped_count=count)
    assert len(FWD.memo) == 1


def test_swiglu_per_call_refusals_with_optional_tensors(rec):
    """A configuration with every optional tensor, warm; then each per-call check fails in turn
    (row counts, contiguity, alignment): refused as cold, nothing launched or stored."""
    x = torch.randn(4, 1152).to(BF16)
    good = dict(_routing(), swiglu_clamp_value=1.0)
    fn = sw.swiglu_forward_and_per_token_cast
    rec.run(lambda: fn(x, "e4m3", 128, **good), fast=False)
    rec.run(lambda: fn(x, "e4m3", 128, **good), fast=True)
    op = "swiglu_forward_and_per_token_cast"
    for bad, match in [
        (dict(pos_to_token_topk=torch.arange(5, dtype=I32)), r"pos_to_token_topk has 5 entries; it needs one per row"),
        (dict(pos_to_token_topk=torch.arange(8, dtype=I32)[::2]), r"pos_to_token_topk must be contiguous"),
        (dict(pos_to_token_topk=odd_address((4,), I32)), r"pos_to_token_topk's data pointer .* is not 4-byte aligned"),
        (dict(topk_weights=torch.ones(2, 4).T), r"topk_weights must be contiguous"),
        (dict(pos_to_expert=torch.zeros(3, dtype=I32)), r"pos_to_expert has 3 entries; it needs one per row"),
        (dict(pos_to_expert=torch.zeros(8, dtype=I32)[::2]), r"pos_to_expert must be contiguous"),
        (dict(clamped_count=torch.zeros(6, dtype=I64)[::2]), r"clamped_count must be contiguous"),
        (dict(clamped_count=torch.zeros(4, dtype=I64)[1:]), r"clamped_count's data pointer .* is not 16-byte aligned"),
    ]:
        raises(rec, FWD, rf"{op}: {match}", fn, x, "e4m3", 128, **{**good, **bad})
    raises(rec, FWD, rf"{op}: pos_to_token_topk has 4 entries; it needs one per row of x \(5\)", fn,
            torch.randn(5, 1152).to(BF16), "e4m3", 128, **good)
    assert len(FWD.memo) == 1


def test_swiglu_other_device_misses(rec):
    rec.run(_sw(torch.randn(4, 1152).to(BF16)), fast=False)
    rec.run(_sw(torch.empty(4, 1152, dtype=BF16, device="meta")), fast=False)
    rec.run(_sw(torch.empty(4, 1152, dtype=BF16, device="meta")), fast=True)
    assert len(FWD.memo) == 2


def test_hot_launch_explicit(rec):
    """The launches both paths make for the decode-size hot call, written out (independent of the
    op's own arithmetic)."""
    x2 = torch.zeros(4, 2 * 7168, dtype=BF16)
    for fast in (False, True):
        (out, sf), [(name, key, args)] = rec.run(_sw(x2), fast=fast)
        assert name == "quant.swiglu_forward_and_per_token_cast"
        assert key == dict(in_dtype="bfloat16", sf_kind="row", count_clamp=False)
        assert args[0] is x2 and args[1] is out and args[2] is sf
        assert [(a.dtype, tuple(a.shape)) for a in args[3:7]] == [(torch.int32, (1,)), (FP32, (1, 1)),
                                                                  (torch.int32, (1,)), (torch.int64, (3,))]
        assert args[7:] == (math.inf, 1e-4, 0, 0, 0, 7)
        assert (out.dtype, out.shape, out.stride()) == (E4M3, (4, 7168), (7168, 1))
        assert (sf.dtype, sf.shape, sf.stride()) == (FP32, (4, 56), (56, 1))
    for fast in (False, True):
        (_, _), [(_, _, args)] = rec.run(_sw(torch.zeros(5000, 2 * 7168, dtype=BF16), 7168, False, True,
                                             swiglu_clamp_value=7.5), fast=fast)
        assert args[7:] == (7.5, 1e-4, 1, 0, 0, 264)


# ----------------------------------------------------------------------------------- backward
def _bwd_args(rows=4, hidden=256, npc=128, tokens=2, topk=3, three_d=False):
    """(x, grad_out, weight, pos_to_token_topk, token_topk_to_pos) of the backward: ``rows`` rows
    of ``2 * hidden`` e4m3 channels (as [2, rows / 2, 2 * hidden] with ``three_d``)."""
    data = torch.zeros(rows, 2 * hidden, dtype=E4M3)
    data = data.view(2, rows // 2, 2 * hidden) if three_d else data
    return ((data, torch.ones(rows, 2 * hidden // npc)), torch.zeros(rows, hidden, dtype=BF16),
            torch.zeros(tokens, topk), torch.zeros(rows, dtype=I32), torch.zeros(tokens, topk, dtype=I32))


def _bwd(args, npc=128, **kw):
    return lambda: sw.swiglu_backward_and_per_token_cast(*args, npc, **kw)


def _known(args):
    (data, sf), *rest = args
    return [data, sf, *rest]


@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("kw", [{}, {"round_sf": True, "swiglu_clamp_value": 7.0}])
@pytest.mark.parametrize("npc", [32, 128])
def test_bwd_replay_matches_checked(rec, npc, kw, three_d):
    """2-D data: one configuration for every row and token count; 3-D data's middle size is in
    its configuration (its first size only varies)."""
    rec.run(_bwd(_bwd_args(npc=npc, three_d=three_d), npc, **kw), fast=False)
    for rows, tokens in ((4, 2), (0, 0), (2, 5), (300, 7), (0, 3)):
        args = _bwd_args(rows, npc=npc, tokens=tokens, three_d=three_d)
        rec.both(BWD, _bwd(args, npc, **kw), _known(args))
    if not three_d:
        assert len(BWD.memo) == 1


def test_bwd_misaligned_inputs_are_copied(rec):
    """sf, weight and the index maps that start inside a tensor (4-byte but not 16-byte aligned)
    are copied for the kernel, replayed or not."""
    (data, _), grad_out, *_ = _bwd_args()
    sf, weight = misaligned((4, 4), FP32), misaligned((2, 3), FP32)
    ptt, ttp = torch.zeros(5, dtype=I32)[1:], torch.zeros(7, dtype=I32)[1:].view(2, 3)
    call = _bwd(((data, sf), grad_out, weight, ptt, ttp))
    (_, [(_, _, args)]) = rec.run(call, fast=False)
    rec.both(BWD, call, [data, sf, grad_out, weight, ptt, ttp])
    for given, passed in zip((sf, weight, ptt, ttp), (args[1], args[3], args[4], args[5])):
        assert passed is not given and torch.equal(passed, given) and passed.data_ptr() % 16 == 0


def test_bwd_per_call_refusals_after_warm(rec):
    args = _bwd_args()
    rec.run(_bwd(args), fast=False)
    rec.run(_bwd(args), fast=True)
    (data, sf), grad_out, weight, ptt, ttp = args
    op, fn = "swiglu_backward_and_per_token_cast", sw.swiglu_backward_and_per_token_cast
    wide = torch.zeros(4, 1024, dtype=E4M3)
    for i, bad, match in [
        (0, (wide[:, :512], sf), r"x\[0\] \(data\) must be contiguous"),
        (0, (misaligned((4, 512), E4M3), sf), r"x\[0\] \(data\)'s data pointer .* is not 16-byte aligned"),
        (0, (torch.zeros(0, 1024, dtype=E4M3)[:, ::2], torch.ones(0, 4)), r"x\[0\] \(data\) must be contiguous in its"),
        (0, (data, torch.ones(5, 4)), r"x\[1\] \(sf\) has shape \(5, 4\); it must be \(4, 4\)"),
        (0, (data, torch.ones(4, 8)[:, ::2]), r"x\[1\] \(sf\) must be row-major contiguous"),
        (1, torch.zeros(5, 256, dtype=BF16), r"grad_out has shape \(5, 256\); it must hold \[4, 256\] values"),
        (1, torch.zeros(4, 512, dtype=BF16)[:, :256], r"grad_out must be contiguous"),
        (4, torch.zeros(2, 6, dtype=I32)[:, ::2], r"token_topk_to_pos must be contiguous"),
        (2, torch.zeros(3, 3), r"weight has shape \(3, 3\); it must match token_topk_to_pos \(2, 3\)"),
        (2, torch.zeros(2, 6)[:, ::2], r"weight must be contiguous"),
        (2, odd_address((2, 3), FP32), r"weight's data pointer .* is not 4-byte aligned"),
        (3, torch.zeros(5, dtype=I32), r"pos_to_token_topk has 5 entries; it needs one per row of x \(4\)"),
        (3, torch.zeros(8, dtype=I32)[::2], r"pos_to_token_topk must be contiguous"),
    ]:
        call = list(args)
        call[i] = bad
        raises(rec, BWD, rf"{op}: {match}", fn, *call, 128)
    raises(rec, BWD, rf"{op}: weight must be 2-D, got shape \(6,\)", fn, *args[:2], torch.zeros(6), *args[3:], 128)
    raises(rec, BWD, rf"{op}: num_per_channels=64 is not supported", fn, *args, 64)
    assert len(BWD.memo) == 1


# ------------------------------------------------------------------------- per-channel forward
def _ch(x, npt=128, *flags, **kw):
    return lambda: sw.swiglu_forward_and_per_channel_cast_and_transpose(x, "e4m3", npt, *flags, **kw)


@pytest.mark.parametrize("flags, kw", [((), {}), ((True, True), {"swiglu_clamp_value": 0.5}), ((False, 1), {})])
@pytest.mark.parametrize("npt", [32, 128])
def test_channel_replay_matches_checked(rec, npt, flags, kw):
    rec.run(_ch(torch.zeros(128, 2 * 576, dtype=BF16), npt, *flags, **kw), fast=False)
    for tokens in (128, 0, 256, 4096):
        x = torch.zeros(tokens, 2 * 576, dtype=BF16)
        rec.both(CH, _ch(x, npt, *flags, **kw), [x])
    assert len(CH.memo) == 1


def test_channel_per_call_refusals_after_warm(rec):
    x = torch.zeros(128, 1152, dtype=BF16)
    rec.run(_ch(x), fast=False)
    rec.run(_ch(x), fast=True)
    op, fn = "swiglu_forward_and_per_channel_cast_and_transpose", sw.swiglu_forward_and_per_channel_cast_and_transpose
    raises(rec, CH, rf"{op}: x has shape \(100, 1152\); both the token count", fn, torch.zeros(100, 1152, dtype=BF16),
           "e4m3", 128)
    raises(rec, CH, rf"{op}: x must be contiguous", fn, torch.zeros(128, 2304, dtype=BF16)[:, :1152], "e4m3", 128)
    raises(rec, CH, rf"{op}: x's data pointer .* is not 16-byte aligned", fn, misaligned((128, 1152), BF16), "e4m3",
           128)
    raises(rec, CH, rf"{op}: num_per_tokens=64 is not supported", fn, x, "e4m3", 64)
    raises(rec, CH, rf"{op}: x must be contiguous in its last dim", fn, torch.zeros(0, 2304, dtype=BF16)[:, ::2],
           "e4m3", 128)
    assert len(CH.memo) == 1


@pytest.mark.parametrize("flags", [(False, False, False), (True, False, False), (True, True, True)])
@pytest.mark.parametrize("hidden", [64, 576, 7168])
def test_forward_scales_are_the_layouts(hidden, flags):
    """The forward's scale allocation (sizes but the row count computed per configuration) is
    SfLayout.alloc / finish's, for every layout and row count."""
    from tilebin.ops.quant._sf import output_layout

    layout = output_layout("t", (1, 128), *flags[:2], flags[2])
    make = sw._scales(layout, hidden)
    for rows in (0, 1, 3, 4, 7, 300):
        raw, out = make(rows, torch.device("cpu"))
        want_raw = layout.alloc(rows, hidden, "cpu")
        want = layout.finish(want_raw, rows)
        for got, ref in ((raw, want_raw), (out, want)):
            assert (got.dtype, got.shape, got.stride()) == (ref.dtype, ref.shape, ref.stride())
            assert got.untyped_storage().nbytes() == ref.untyped_storage().nbytes()
