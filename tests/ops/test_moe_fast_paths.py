"""The MoE ops' memoized fast paths (CPU): a configuration seen before launches exactly what the
slow path launches (kernel, key, arguments, outputs' dtype/shape/strides) and never accepts what
the slow path rejects.  The launcher is a recorder and the device check a no-op."""

from __future__ import annotations

import pytest
import torch

from tilebin.ops import _spec
from tilebin.ops.moe import _gating as g, _stats as st
from tilebin.runtime import ArgumentError


@pytest.fixture
def rec(monkeypatch):
    calls = []

    def launcher(name, **key):
        return lambda *args: calls.append((name, tuple(sorted(key.items())), args))

    for m in (g, st):
        monkeypatch.setattr(m, "launcher", launcher)
    monkeypatch.setattr(g, "_LAUNCHERS", {})
    monkeypatch.setattr(g, "_on_cuda", lambda op, first, **others: None)
    monkeypatch.setattr(_spec, "check_cuda", lambda op, **t: None)  # the statistics ops' OpSpecs
    for spec in st.SPECS:
        monkeypatch.setattr(spec, "memo", {})
    return calls


def _sig(v):
    if isinstance(v, torch.Tensor):
        return ("T", v.dtype, tuple(v.shape), v.stride(), v.storage_offset())
    if isinstance(v, (tuple, list)):
        return tuple(_sig(a) for a in v)
    return (type(v), v)


def _same(rec, fn, *args, **kw):
    """Slow (memo emptied) then fast call: identical launches and outputs; the memo was used."""
    memos = [g._FAST] + [spec.memo for spec in st.SPECS]
    for memo in memos:
        memo.clear()
    rec.clear()
    a = fn(*args, **kw)
    slow = [(n, k, _sig(x)) for n, k, x in rec]
    filled = sum(len(memo) for memo in memos)
    rec.clear()
    b = fn(*args, **kw)
    fast = [(n, k, _sig(x)) for n, k, x in rec]
    assert slow == fast
    assert _sig(a) == _sig(b)
    return filled


def _err(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except ArgumentError as e:
        return str(e)
    return None


def _same_error(rec, warm, fn, *args, **kw):
    """The error with the memo empty equals the error with the memo warm (``warm`` fills it)."""
    memos = [g._FAST] + [spec.memo for spec in st.SPECS]
    for memo in memos:
        memo.clear()
    cold = _err(fn, *args, **kw)
    warm()
    assert sum(len(memo) for memo in memos), "warm-up did not fill the memo"
    rec.clear()
    hot = _err(fn, *args, **kw)
    assert cold == hot and cold is not None, (cold, hot)
    assert not rec


def _top2(tokens=4, experts=64, **over):
    kw = dict(logits=torch.randn(tokens, experts), bias=torch.randn(experts), num_topk=6, num_topk_groups=4,
              num_groups=8, use_shared_as_routed=False, num_shared_experts=0, routed_scaling_factor=1.5, ep_rank=1,
              num_ep_ranks=4, tp_rank=0, num_tp_ranks=2, scoring_func="sigmoid")
    kw.update(over)
    return kw


def _shared(tokens=4, experts=64, **over):
    m = torch.zeros(experts + 1, 5, dtype=torch.int32)
    c = torch.ones(experts + 1, dtype=torch.int32)
    return _top2(tokens, experts, num_topk=8, use_shared_as_routed=True, num_shared_experts=1, to_physical_map=m,
                 logical_count=c, **over)


@pytest.mark.parametrize("tokens", [1, 7, 128])
def test_gating_same_launches(rec, tokens):
    assert _same(rec, g.top2_sum_gate, **_top2(tokens))
    assert _same(rec, g.top2_sum_gate, **_top2(tokens, scoring_func="SoftMax", routed_scaling_factor=2))
    assert _same(rec, g.top2_sum_gate, **_shared(tokens, mask=torch.ones(tokens, 1, dtype=torch.bool),
                                                 unmapped_topk_idx=torch.zeros(tokens, 8, dtype=torch.int64),
                                                 fix_routing_mask=torch.zeros(tokens, dtype=torch.bool)))
    assert _same(rec, g.top2_sum_gate, **_top2(tokens, routed_scaling_factor=-0.0))
    assert _same(rec, g.topk_gate, torch.randn(tokens, 256), 8)
    assert _same(rec, g.topk_sum_and_topk_group_idx, torch.randn(tokens, 8, 32), 2, 4)
    assert not _same(rec, g.top2_sum_gate, **_top2(0))  # 0 tokens: no launch, no memo


def test_gating_token_count_changes(rec):
    g.top2_sum_gate(**_top2(4))
    rec.clear()
    idx, w = g.top2_sum_gate(**_top2(9))
    assert idx.shape == (9, 6) and w.shape == (9, 6) and len(rec) == 1
    assert rec[0][2][9:] == (6, 8, 4, 0, 0, 0, 1.5, 1, 4, 0, 2)


def test_gating_rejections_after_warm_up(rec):
    warm = lambda: g.top2_sum_gate(**_top2(4))  # noqa: E731
    for over in [dict(logits=torch.randn(64, 4).t()), dict(bias=torch.randn(128)[::2]), dict(num_topk=True),
                 dict(num_topk=6.0), dict(use_shared_as_routed=0), dict(routed_scaling_factor=True),
                 dict(ep_rank=1.0), dict(logits=torch.randn(4, 64, dtype=torch.float64)),
                 dict(mask=torch.ones(5, dtype=torch.bool)),
                 dict(unmapped_topk_idx=torch.zeros(6, 4, dtype=torch.int64).t()),
                 dict(fix_routing_mask=torch.ones(4, dtype=torch.bool))]:
        _same_error(rec, warm, g.top2_sum_gate, **_top2(4, **over))
    shared = lambda: g.top2_sum_gate(**_shared(4, mask=torch.ones(4, dtype=torch.bool)))  # noqa: E731
    _same_error(rec, shared, g.top2_sum_gate, **_shared(4, mask=torch.ones(8, dtype=torch.bool)[::2]))
    _same_error(rec, shared, g.top2_sum_gate, **_shared(4, mask=torch.ones(5, dtype=torch.bool)))
    bad_map = _shared(4, mask=torch.ones(4, dtype=torch.bool))
    bad_map["to_physical_map"] = torch.zeros(5, 65, dtype=torch.int32).t()
    _same_error(rec, shared, g.top2_sum_gate, **bad_map)
    warm = lambda: g.topk_gate(torch.randn(4, 64), 6)  # noqa: E731
    _same_error(rec, warm, g.topk_gate, torch.randn(64, 4).t(), 6)
    _same_error(rec, warm, g.topk_gate, torch.randn(4, 64), True)
    warm = lambda: g.topk_sum_and_topk_group_idx(torch.randn(4, 8, 8), 1, 1)  # noqa: E731
    _same_error(rec, warm, g.topk_sum_and_topk_group_idx, torch.randn(4, 8, 8), True, 1)
    _same_error(rec, warm, g.topk_sum_and_topk_group_idx, torch.randn(4, 8, 8).transpose(1, 2), 1, 1)


@pytest.mark.parametrize("tokens", [1, 7, 128])
def test_stats_same_launches(rec, tokens):
    assert _same(rec, st.normalize_weight, torch.rand(tokens, 8))


def test_stats_rejections_after_warm_up(rec):
    warm = lambda: st.normalize_weight(torch.rand(4, 8))  # noqa: E731
    _same_error(rec, warm, st.normalize_weight, torch.rand(8, 4).t())
    _same_error(rec, warm, st.normalize_weight, torch.rand(4, 8, dtype=torch.float64))
