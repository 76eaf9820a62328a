"""A steady-state call of every ``tilebin.ops`` op stays on the compiled hot path.

The compiled launcher (``csrc/_hot.c``) hands a call to its Python twin (``Launcher._slow_call`` /
``_slow_run``) when it cannot finish it itself: an argument it does not pack (e.g. an infinite
float scalar, before the fix of 2026-12-02), a size it cannot evaluate.  The twin is correct but
costs ~20 µs more per call, which is most of a decode-size op's host time.  Each op is called as
``bench/bench_op_budget.py`` calls it (4 tokens, DeepSeek-V3 shapes; that table is this test's case
list), twice to build its plan, then once more with the twin's entries recording: none may be used.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys

import pytest
from conftest import REPO


@functools.lru_cache(maxsize=None)
def _budget():
    """bench/bench_op_budget.py (its op table and input builders), imported by path."""
    bench = REPO / "bench"
    if str(bench) not in sys.path:
        sys.path.append(str(bench))  # it imports bench/_common.py by name
    spec = importlib.util.spec_from_file_location("tilebin_bench_op_budget", bench / "bench_op_budget.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def _inputs(family: str):
    return _budget().INPUTS[family](importlib.import_module(f"tilebin.ops.{family}"))


CASES = [(family, op) for family, ops in _budget().OPS.items() for op in ops]


@pytest.mark.parametrize("family, op", CASES, ids=[f"{f}.{o}" for f, o in CASES])
def test_steady_call_stays_compiled(family, op, monkeypatch):
    import torch

    from tilebin import runtime
    from tilebin.runtime import _launcher

    if runtime.hot_path() != "c":
        pytest.skip(f"the compiled hot path is not in use here (runtime.hot_path() = {runtime.hot_path()!r})")
    module = importlib.import_module(f"tilebin.ops.{family}")
    _, call = _budget().OPS[family][op]
    args = _inputs(family)
    call(module, args)
    call(module, args)
    slow: list = []
    call_twin, run_twin = _launcher.Launcher._slow_call, _launcher.Launcher._slow_run
    monkeypatch.setattr(_launcher.Launcher, "_slow_call",
                        lambda self, a: slow.append(("_slow_call", self.where)) or call_twin(self, a))
    monkeypatch.setattr(_launcher.Launcher, "_slow_run",
                        lambda self, v, s: slow.append(("_slow_run", self.where)) or run_twin(self, v, s))
    call(module, args)
    torch.cuda.synchronize()
    assert slow == [], f"{family}.{op}: the compiled launcher handed these launches to the Python twin: {slow}"
