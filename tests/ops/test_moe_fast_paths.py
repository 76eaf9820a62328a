"""The MoE ops' memoized fast paths (CPU): a configuration seen before launches exactly what the
slow path launches (kernel, key, arguments, outputs' dtype/shape/strides) and never accepts what
the slow path rejects.  The launcher is a recorder and the device check a no-op."""

from __future__ import annotations

import pytest
import torch

from ops_stub import declared_variants
from tilebin.ops import _spec
from tilebin.ops._common import specialised_key
from tilebin.ops.moe import _stats as st
from tilebin.runtime import ArgumentError

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one


@pytest.fixture
def rec(monkeypatch):
    calls = []

    def launcher(name, **key):
        return lambda *args: calls.append((name, tuple(sorted(key.items())), args))

    monkeypatch.setattr(st, "launcher", launcher)
    monkeypatch.setattr(st, "specialised_launcher", lambda name, sizes, **key: launcher(
        name, **specialised_key(declared_variants(name), sizes, key)))
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
    memos = [spec.memo for spec in st.SPECS]
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
    memos = [spec.memo for spec in st.SPECS]
    for memo in memos:
        memo.clear()
    cold = _err(fn, *args, **kw)
    warm()
    assert sum(len(memo) for memo in memos), "warm-up did not fill the memo"
    rec.clear()
    hot = _err(fn, *args, **kw)
    assert cold == hot and cold is not None, (cold, hot)
    assert not rec


@pytest.mark.parametrize("tokens", [1, 7, 128])
def test_stats_same_launches(rec, tokens):
    assert _same(rec, st.normalize_weight, torch.rand(tokens, 8))


_NW, _LANES = "moe.normalize_weight", "moe.normalize_weight_lanes"


@pytest.mark.parametrize("topk, kernel, key", [(2, _NW, (("num_topk", 2),)), (6, _NW, (("num_topk", 6),)),
                                               (8, _LANES, (("topk", 8),)), (9, _NW, (("num_topk", 9),)),
                                               (1, _NW, ()), (7, _NW, ()), (17, _NW, ())])
def test_normalize_weight_launches_the_variant_built_for_its_topk(rec, topk, kernel, key):
    """Top-k 2, 6 and 9 have variants with num_topk fixed (KernelDecl.specialise), top-k 8 the lanes kernel,
    others the run-time one."""
    st.normalize_weight(torch.rand(5, 7))  # another configuration first: the choice is per memo key
    rec.clear()
    for _ in range(2):  # the first call (plan built) and a memoized one launch the same variant
        st.normalize_weight(torch.rand(5, topk))
    assert [(name, k) for name, k, _ in rec] == [(kernel, key)] * 2


def test_stats_rejections_after_warm_up(rec):
    warm = lambda: st.normalize_weight(torch.rand(4, 8))  # noqa: E731
    _same_error(rec, warm, st.normalize_weight, torch.rand(8, 4).t())
    _same_error(rec, warm, st.normalize_weight, torch.rand(4, 8, dtype=torch.float64))
