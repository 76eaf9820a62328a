"""The gating ops' OpSpecs (CPU, launcher stubbed): schemas as registered before the OpSpecs, a
memoized configuration launches exactly what its checked first call launches (kernel, key,
arguments, outputs' dtype/shape/strides), and every fact the memo key leaves out (token counts
that must agree, strides) is refused on a replay with the message a fresh process gives, before
any launch and without storing anything."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from ops_stub import StubbedOps, describe, describe_launches
from tilebin.ops import _spec
from tilebin.ops.moe import _gating as g
from tilebin.runtime import ArgumentError

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

B, I32, I64 = torch.bool, torch.int32, torch.int64

# the TorchOp schema strings of these ops before their OpSpecs (tilebin::<op> must not change)
SCHEMAS = {
    "topk_gate": "(Tensor scores, int num_topk) -> Tensor",
    "topk_sum_and_topk_group_idx": "(Tensor scores, int num_topk_sum, int num_topk_groups) -> Tensor",
    "top2_sum_gate": "(Tensor logits, Tensor bias, int num_topk, int num_topk_groups, int num_groups, "
                     "bool use_shared_as_routed, int num_shared_experts, float routed_scaling_factor, int ep_rank, "
                     "int num_ep_ranks, int tp_rank, int num_tp_ranks, str scoring_func, Tensor? mask=None, "
                     "Tensor? fix_routing_mask=None, Tensor? to_physical_map=None, Tensor? logical_count=None, "
                     "Tensor(a!)? unmapped_topk_idx=None) -> (Tensor, Tensor)",
}


@pytest.fixture
def ops(monkeypatch):
    return StubbedOps(monkeypatch)


@pytest.fixture
def checked(monkeypatch):
    """The names of the ops whose checked path (every check, then plan) ran, in order."""
    names = []
    real = _spec.OpSpec.checked
    monkeypatch.setattr(_spec.OpSpec, "checked", lambda self, a, k: names.append(self.name) or real(self, a, k))
    return names


def test_schemas_are_unchanged():
    assert {op.name: op.schema for op in g.TORCH_OPS} == SCHEMAS
    assert {spec.name: spec.schema() for spec in g.SPECS} == SCHEMAS
    assert all(op.fake == spec.fake for op, spec in zip(g.TORCH_OPS, g.SPECS))


def test_the_public_ops_are_their_specs():
    for spec in g.SPECS:
        fn = getattr(g, spec.name)
        assert fn.__name__ == spec.name and fn.__doc__ and fn in [op.public for op in g.TORCH_OPS]


# ---------------------------------------------------------------- valid calls
def _top2(tokens=4, experts=64, **over):
    kw = dict(logits=torch.randn(tokens, experts), bias=torch.randn(experts), num_topk=6, num_topk_groups=4,
              num_groups=8, use_shared_as_routed=False, num_shared_experts=0, routed_scaling_factor=1.5, ep_rank=1,
              num_ep_ranks=4, tp_rank=0, num_tp_ranks=2, scoring_func="sigmoid")
    kw.update(over)
    return kw


def _shared(tokens=4, experts=64, **over):
    return _top2(tokens, experts, num_topk=8, use_shared_as_routed=True, num_shared_experts=1,
                 to_physical_map=torch.zeros(experts + 1, 5, dtype=I32),
                 logical_count=torch.ones(experts + 1, dtype=I32), **over)


def _calls(tokens):
    """(op, kwargs) of every form, at ``tokens`` tokens."""
    every = dict(mask=torch.ones(tokens, 1, dtype=B), unmapped_topk_idx=torch.zeros(tokens, 8, dtype=I64),
                 fix_routing_mask=torch.zeros(tokens, dtype=B))
    return [(g.top2_sum_gate, _top2(tokens)),
            (g.top2_sum_gate, _top2(tokens, scoring_func="SoftMax", routed_scaling_factor=2)),
            (g.top2_sum_gate, _shared(tokens, **every)),
            (g.top2_sum_gate, _top2(tokens, routed_scaling_factor=-0.0, num_groups=0, num_topk_groups=0)),
            (g.top2_sum_gate, _top2(tokens, experts=200, bias=torch.randn(200), num_topk=8, num_groups=8,
                                    mask=torch.ones(tokens, dtype=B))),
            (g.top2_sum_gate, _top2(tokens, unmapped_topk_idx=torch.zeros(tokens, 12, dtype=I64)[:, :6])),
            (g.topk_gate, dict(scores=torch.randn(tokens, 256), num_topk=8)),
            (g.topk_gate, dict(scores=torch.randn(tokens, 1000), num_topk=0)),
            (g.topk_sum_and_topk_group_idx, dict(scores=torch.randn(tokens, 8, 32), num_topk_sum=2,
                                                 num_topk_groups=4))]


def _run(ops, fn, kw):
    ops.launches.clear()
    return describe(fn(**kw)), describe_launches(ops.launches)


@pytest.mark.parametrize("tokens", [0, 1, 7, 128])
def test_a_replay_launches_what_the_checked_call_launches(ops, checked, tokens):
    for fn, kw in _calls(tokens):
        ops.fresh()
        checked.clear()
        cold = _run(ops, fn, kw)
        assert checked == [fn.__name__]
        assert _run(ops, fn, kw) == cold and checked == [fn.__name__], fn.__name__  # the second call: a replay
        assert bool(cold[1]) == bool(tokens and kw.get("num_topk", 1)), cold[1]  # no launch for 0 tokens


def test_the_token_count_is_not_part_of_the_configuration(ops, checked):
    g.top2_sum_gate(**_top2(4))
    ops.launches.clear()
    idx, w = g.top2_sum_gate(**_top2(9))
    assert checked == ["top2_sum_gate"] and len(g.TOP2_SUM_GATE.memo) == 1
    assert idx.shape == (9, 6) and w.shape == (9, 6) and len(ops.launches) == 1
    name, key, args = ops.launches[0]
    assert (name, key) == ("moe.top2_sum_gate", {"slots": 2})
    assert args[0].shape == (9, 64) and args[9:] == (6, 8, 4, 0, 0, 0, 1.5, 1, 4, 0, 2)
    assert all(type(a) is type(b) for a, b in zip(args[9:], (6, 8, 4, 0, 0, 0, 1.5, 1, 4, 0, 2)))


def test_the_scaling_factor_is_keyed_by_its_bits(ops, checked):
    """0.0 and -0.0 (also as numpy floats) are two configurations: the kernel gets the sign it was
    given; a NaN finds its own configuration again."""
    factors = (0.0, -0.0, np.float64(0.0), np.float64(-0.0), float("nan"), float("nan"), 2, 10**400)
    for factor in factors:
        g.top2_sum_gate(**_top2(4, routed_scaling_factor=factor))
        sent = ops.launches[-1][2][15]
        want = math.inf if type(factor) is int and factor > 2**1024 else float(factor)
        assert type(sent) is float and (sent == want or sent != sent and want != want)
        assert math.copysign(1, sent) == math.copysign(1, want)
    assert checked.count("top2_sum_gate") == len(factors) - 1 and len(g.TOP2_SUM_GATE.memo) == len(factors) - 1


def test_strict_ints_stay_strict_when_warm(ops):
    """Integer-likes (numpy ints) and bools are refused, warm or cold (strict ints, as before)."""
    g.top2_sum_gate(**_top2(4))
    g.topk_gate(torch.randn(4, 64), 6)
    for fn, kw, match in [(g.top2_sum_gate, _top2(4, num_topk=np.int64(6)), "num_topk must be an int, got int64"),
                          (g.top2_sum_gate, _top2(4, ep_rank=True), "ep_rank must be an int, got bool True"),
                          (g.topk_gate, dict(scores=torch.randn(4, 64), num_topk=np.int32(6)),
                           "num_topk must be an int, got int32")]:
        ops.launches.clear()
        with pytest.raises(ArgumentError, match=match):
            fn(**kw)
        assert not ops.launches


# ---------------------------------------------------------------- refusals
def _err(fn, kw):
    try:
        fn(**kw)
    except ArgumentError as e:
        return str(e)
    return None


def _same_error(ops, warm, fn, kw):
    """The error in a fresh process equals the error after ``warm()`` filled the memo, which the
    refused call leaves as it was, launching nothing."""
    ops.fresh()
    cold = _err(fn, kw)
    assert cold is not None and not any(spec.memo for spec in g.SPECS)
    warm()
    memos = [dict(spec.memo) for spec in g.SPECS]
    assert any(memos), "warm-up did not fill the memo"
    ops.launches.clear()
    assert _err(fn, kw) == cold
    assert not ops.launches and [spec.memo for spec in g.SPECS] == memos


def test_rejections_after_warm_up(ops):
    warm = lambda: g.top2_sum_gate(**_top2(4))  # noqa: E731
    for over in [dict(num_topk=True), dict(num_topk=6.0), dict(use_shared_as_routed=0),
                 dict(routed_scaling_factor=True), dict(ep_rank=1.0), dict(logits=torch.randn(4, 64).double()),
                 dict(fix_routing_mask=torch.ones(4, dtype=B)), dict(scoring_func="Sigmoid "),
                 dict(num_topk=65), dict(mask=torch.ones(4, dtype=I32)), dict(logits=torch.randn(64, 4).t()),
                 dict(bias=torch.randn(128)[::2]), dict(mask=torch.ones(5, dtype=B)),
                 dict(unmapped_topk_idx=torch.zeros(6, 4, dtype=I64).t())]:
        _same_error(ops, warm, g.top2_sum_gate, _top2(4, **over))
    warm = lambda: g.topk_gate(torch.randn(4, 64), 6)  # noqa: E731
    _same_error(ops, warm, g.topk_gate, dict(scores=torch.randn(4, 64), num_topk=True))
    _same_error(ops, warm, g.topk_gate, dict(scores=torch.randn(4, 64), num_topk=65))
    warm = lambda: g.topk_sum_and_topk_group_idx(torch.randn(4, 8, 8), 1, 1)  # noqa: E731
    _same_error(ops, warm, g.topk_sum_and_topk_group_idx, dict(scores=torch.randn(4, 8, 8), num_topk_sum=True,
                                                               num_topk_groups=1))


def _positional(kw):
    """top2_sum_gate's arguments in order, the defaults filled in."""
    bound = inspect.signature(g.top2_sum_gate).bind(**kw)
    bound.apply_defaults()
    return bound.args


def _every_optional(tokens=4, **over):
    kw = _shared(tokens, mask=torch.ones(tokens, dtype=B), fix_routing_mask=torch.zeros(tokens, dtype=B),
                 unmapped_topk_idx=torch.zeros(tokens, 8, dtype=I64))
    kw.update(over)
    return kw


# what each per-call check refuses: the same configuration (memo key) as the warm call, a token
# count or a stride the key leaves out
PER_CALL = [
    ("logits must be contiguous", dict(logits=torch.randn(64, 4).t())),
    ("bias must be contiguous", dict(bias=torch.randn(128)[::2])),
    ("mask has 5 elements", dict(mask=torch.ones(5, dtype=B))),
    ("mask must be contiguous", dict(mask=torch.ones(8, dtype=B)[::2])),
    ("fix_routing_mask has 3 elements", dict(fix_routing_mask=torch.zeros(3, dtype=B))),
    ("fix_routing_mask must be contiguous", dict(fix_routing_mask=torch.zeros(8, dtype=B)[::2])),
    ("unmapped_topk_idx has shape \\(5, 8\\)", dict(unmapped_topk_idx=torch.zeros(5, 8, dtype=I64))),
    ("unit stride", dict(unmapped_topk_idx=torch.zeros(8, 4, dtype=I64).t())),
    ("to_physical_map must be contiguous", dict(to_physical_map=torch.zeros(5, 65, dtype=I32).t())),
    ("logical_count must be contiguous", dict(logical_count=torch.ones(130, dtype=I32)[::2])),
]


@pytest.mark.parametrize("match,over", PER_CALL, ids=[m.split(" ")[0] + "-" + m.split(" ")[-1] for m, _ in PER_CALL])
def test_per_call_checks_refuse_on_a_replay(ops, match, over):
    kw = _every_optional(**over)
    assert g.TOP2_SUM_GATE.key(_positional(kw)) == g.TOP2_SUM_GATE.key(_positional(_every_optional()))
    _same_error(ops, lambda: g.top2_sum_gate(**_every_optional()), g.top2_sum_gate, kw)
    with pytest.raises(ArgumentError, match=match):
        g.top2_sum_gate(**kw)


def test_per_call_checks_of_the_scores(ops):
    warm = lambda: g.topk_gate(torch.randn(4, 64), 6)  # noqa: E731
    _same_error(ops, warm, g.topk_gate, dict(scores=torch.randn(64, 4).t(), num_topk=6))
    warm = lambda: g.topk_sum_and_topk_group_idx(torch.randn(4, 8, 8), 1, 1)  # noqa: E731
    _same_error(ops, warm, g.topk_sum_and_topk_group_idx, dict(scores=torch.randn(4, 8, 8).transpose(1, 2),
                                                               num_topk_sum=1, num_topk_groups=1))
    with pytest.raises(ArgumentError, match="scores must be contiguous \\(strides \\(64, 1, 8\\)\\)"):
        g.topk_sum_and_topk_group_idx(torch.randn(4, 8, 8).transpose(1, 2), 1, 1)


def test_a_per_call_refusal_reads_in_the_ops_order(ops):
    """Two faults, one the memo key holds (num_topk) and one it leaves out (a short mask): the
    message names the one the op checks first, warm or cold."""
    kw = _top2(4, num_topk=65, mask=torch.ones(3, dtype=B))
    _same_error(ops, lambda: g.top2_sum_gate(**_top2(4, num_topk=65 - 59, mask=torch.ones(4, dtype=B))),
                g.top2_sum_gate, kw)
    with pytest.raises(ArgumentError, match="num_topk=65 is out of range"):
        g.top2_sum_gate(**kw)


def test_the_key_separates_what_the_checks_distinguish():
    """top2_sum_gate's memo key: the token count is left out (of logits, mask, fix_routing_mask and
    unmapped_topk_idx), everything else is in: every scalar with its type (strict ints: 6, 6.0,
    np.int64(6) and True differ), the factor by its bits, the whole shape of bias and the maps,
    which optional tensors are given and their other sizes."""
    key = lambda kw: g.TOP2_SUM_GATE.key(_positional(kw))  # noqa: E731
    assert key(_every_optional()) == key(_every_optional(tokens=9)) and key(_top2()) == key(_top2(9))
    variants = [_every_optional(), _top2(), _top2(experts=128, bias=torch.zeros(128))]
    variants += [_top2(**over) for over in [
        dict(num_topk=True), dict(num_topk=6.0), dict(num_topk=np.int64(6)), dict(num_topk=7),
        dict(use_shared_as_routed=0), dict(routed_scaling_factor=-0.0), dict(routed_scaling_factor=0.0),
        dict(routed_scaling_factor=np.float64(1.5)), dict(routed_scaling_factor=float("nan")),
        dict(routed_scaling_factor=None), dict(scoring_func="SIGMOID"), dict(ep_rank=None),
        dict(mask=torch.ones(4, dtype=B)), dict(mask=torch.ones(4, 1, dtype=B)), dict(mask=torch.ones(4, dtype=I32)),
        dict(bias=torch.zeros(64, dtype=torch.float64)), dict(bias=torch.zeros(64, 1))]]
    variants += [_every_optional(**over) for over in [
        dict(to_physical_map=torch.zeros(65, 6, dtype=I32)), dict(to_physical_map=torch.zeros(66, 5, dtype=I32)),
        dict(logical_count=torch.ones(66, dtype=I32)), dict(logical_count=None), dict(unmapped_topk_idx=None),
        dict(unmapped_topk_idx=torch.zeros(4, 7, dtype=I64)), dict(fix_routing_mask=torch.zeros(4, 1, dtype=B))]]
    keys = [key(kw) for kw in variants]
    assert len(set(keys)) == len(keys)
    with pytest.raises(AttributeError):  # not a tensor where one belongs: the checked path
        key(_top2(mask=[True] * 4))
