"""``bench/compare_peer.py`` on CPU (no GPU, no tile_kernels): its case table is well formed and
every case's arguments pass tilebin's own checks (launches stubbed, inputs made on the CPU), the
output comparison and the per-family geometric mean are right, and without a GPU the script exits
0 with one line."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests" / "ops"))

import compare_peer as cp  # noqa: E402
import compare_peer_cases as cases  # noqa: E402


class _CpuTorch:
    """torch, with ``device=`` dropped from its factory functions: the cases' inputs on the CPU."""

    def __getattr__(self, name):
        value = getattr(torch, name)
        if name in ("rand", "randn", "zeros", "empty", "full", "randint"):
            return lambda *a, device=None, **k: value(*a, **k)
        return value


@pytest.fixture()
def cpu_cases(monkeypatch):
    from moe_ref.routing import get_fused_mapping
    from ops_stub import StubbedOps

    def mapping(idx, experts, alignment):
        m = get_fused_mapping(idx, experts, 0, alignment)
        return m[0], m[2], m[3]

    monkeypatch.setattr(cases, "_t", lambda: _CpuTorch())
    monkeypatch.setattr(cases, "_mapping", mapping)
    small = cases.local_topk_idx  # the same routing on 64 tokens per rank instead of 4001: seconds, not a minute
    monkeypatch.setattr(cases, "local_topk_idx", lambda tokens, *a, **k: small(min(tokens, 64), *a, **k))
    return StubbedOps(monkeypatch)


def test_every_case_names_an_op_of_both_apis():
    for family in cases.FAMILIES:
        ours = importlib.import_module(f"tilebin.ops.{family}")
        for quick in (True, False):
            table = cases.all_cases(family, quick)
            assert table, family
            for case in table:
                assert case.family == family
                assert case.op in ours.__all__, f"{case.op} is not in tilebin.ops.{family}"
                assert case.op in cases.PEER_API[family], f"{case.op} is not in the peer API list"
            labels = [(c.op, c.label) for c in table]
            assert len(labels) == len(set(labels)), f"{family}: two cases share op and label"


def test_the_issue_ops_and_decode_sizes_are_covered():
    table = [c for f in cases.FAMILIES for c in cases.all_cases(f, False)]
    ops = {c.op for c in table}
    assert set(cases.PEER_API["quant"]) | set(cases.PEER_API["moe"]) | {"transpose", "batched_transpose"} <= ops
    for t in cases.DECODE_TOKENS:
        assert any(f"{t} tok (decode)" in c.label for c in table), t
        assert any(f"bf16 {t}x7168" in c.label for c in table), t


@pytest.mark.parametrize("family", cases.FAMILIES)
def test_every_quick_case_passes_tilebin_checks(cpu_cases, family):
    """The arguments each case makes are accepted by tilebin's op (launch stubbed): on the H200 a
    case can then fail only for what the GPU does."""
    ours = importlib.import_module(f"tilebin.ops.{family}")
    for case in cases.all_cases(family, quick=True):
        if "8x4096x4096" in case.label or "8192x7168" in case.label:  # large: covered by its smaller twins
            continue
        args, kwargs = case.make()
        inspect.signature(getattr(ours, case.op)).bind(*args, **kwargs)
        getattr(ours, case.op)(*args, **kwargs)
        assert cpu_cases.launches, f"{case.op} {case.label} launched nothing"
        cpu_cases.launches.clear()


def test_bit_equal_reports_what_differs():
    a = torch.arange(6, dtype=torch.float32).view(2, 3)
    assert cp.bit_equal((a, [1, 2]), (a.clone(), [1, 2])) == "yes"
    b = a.clone()
    b[0, 1] = -0.0 if a[0, 1] == 0 else 0.0
    assert cp.bit_equal(a, b) == "no (1/6 elements differ)"
    assert cp.bit_equal(a, a.t().contiguous().t()) == "yes, strides differ"
    assert cp.bit_equal(a, a.double()).startswith("no (torch.float32")
    assert cp.bit_equal((a, a), (a,)) == "no (2 vs 1 outputs)"
    nan = torch.full((2,), float("nan"))
    assert cp.bit_equal(nan, nan.clone()) == "yes"  # bits, not values
    e4m3 = torch.zeros(3, dtype=torch.float8_e4m3fn)
    assert cp.bit_equal(e4m3, e4m3.clone()) == "yes"


def test_geomean_per_family():
    rows = [{"family": "moe", "ratio": 2.0}, {"family": "moe", "ratio": 0.5}, {"family": "moe"},
            {"family": "quant", "ratio": 1.2}]
    means = cp.geomeans(rows)
    assert means["moe"] == {"geomean": pytest.approx(1.0), "min": 0.5, "cases": 2}
    assert means["quant"]["geomean"] == pytest.approx(1.2)


def test_cells_show_na_and_errors():
    row = {"family": "transpose", "op": "transpose", "case": "x", "ours_us": 3.25, "ours_timer": "cupti",
           "peer_error": "refused (assert) shape\n% 64"}
    assert cp._cells(row) == ["transpose", "transpose", "x", "3.2", "refused (assert) shape % 64", "n/a", "n/a"]
    row["peer_error"] = "RuntimeError: a | b"  # one markdown cell: no pipe, no newline
    assert cp._cells(row)[4] == "error: RuntimeError: a / b"
    row = {"family": "moe", "op": "aux_fi", "case": "y", "ours_us": 2.0, "ours_timer": "events"}
    assert cp._cells(row)[3:] == ["2.0 (events)", "n/a", "n/a", "n/a"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_without_a_gpu_it_exits_0_with_one_line():
    done = subprocess.run([sys.executable, str(BENCH / "compare_peer.py"), "--quick"], cwd=BENCH,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().count("\n") == 0 and "skipped" in done.stdout


def test_cases_run_and_report_with_a_stand_in_peer(cpu_cases, tmp_path, monkeypatch, capsys):
    """run_case and report end to end on CPU: tilebin's op module stands in for the peer, the timer
    returns fixed numbers, launches are stubbed (outputs unwritten, so bit-equality is not asked)."""
    import argparse
    import json

    from tilebin.ops import moe, transpose

    class FixedTimer:
        def kernel_us(self, fn):
            fn()
            return 2.0, "cupti"

    monkeypatch.setattr(cp, "_t", lambda: torch)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    rows = []
    for family, mod in (("moe", moe), ("transpose", transpose)):
        for case in cases.all_cases(family, quick=True):
            if "(decode)" in case.label and case.label.startswith(("4 tok", "bf16 4x")):
                rows.append(cp.run_case(case, mod, mod, FixedTimer()))
    assert len(rows) == 7, [r["case"] for r in rows]
    for row in rows:
        assert row.get("ours_us") == row.get("peer_us") == 2.0 and row["ratio"] == 1.0, row
        assert "bit_equal" in row
    ns = argparse.Namespace(reps=3, json=str(tmp_path / "r.json"), md=str(tmp_path / "r.md"), flush="write",
                            peer_first=False)
    facts = {"tile_kernels": "1.0.0", "tilelang": "0.1.15"}
    cp.report(rows, facts, ns, failed=["quant: child process exited with 1"])
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["geomean"]["moe"]["geomean"] == pytest.approx(1.0) and len(saved["rows"]) == 7
    assert "| moe | topk_gate |" in saved["markdown"] and "failed: quant" in saved["markdown"]
    assert "flushed before each by a 256 MiB rewrite" in saved["markdown"]
    assert "tilebin measured first in every case" in saved["markdown"]
    assert (tmp_path / "r.md").read_text().strip() == saved["markdown"].strip()


@pytest.mark.parametrize("peer_first", (False, True))
def test_the_measuring_order_of_the_two_sides(cpu_cases, monkeypatch, peer_first):
    """Ours first by default; ``--peer-first`` measures tile_kernels first in every case."""
    from tilebin.ops import transpose

    order = []

    class Side:
        def __init__(self, name):
            self.name = name

        def __getattr__(self, op):
            return lambda *a, **k: (order.append(self.name), getattr(transpose, op)(*a, **k))[1]

    class FixedTimer:
        def kernel_us(self, fn):
            return 2.0, "cupti"

    monkeypatch.setattr(cp, "_t", lambda: torch)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    case = next(c for c in cases.all_cases("transpose", quick=True) if c.label.startswith("bf16 4x"))
    cp.run_case(case, Side("ours"), Side("peer"), FixedTimer(), peer_first)
    assert order == (["peer", "ours"] if peer_first else ["ours", "peer"])


class _Event:
    def __init__(self, name, us):
        self.name = name
        self.time_range = type("R", (), {"elapsed_us": lambda _self, us=us: us})()


def test_cupti_windows_start_at_each_flush_and_leave_it_out(monkeypatch):
    """Device events in time order: a flush (one or more kernels) opens a call's window; the call's
    kernels (any number) add up; a run with a call missing is not a measurement."""
    timer = object.__new__(cp.Timer)
    timer.reps, timer.flush_names = 3, frozenset({"flush_a", "flush_b"})
    calls = [_Event("leftover", 50.0),
             _Event("flush_a", 100.0), _Event("flush_b", 1.0), _Event("k1", 2.0), _Event("k2", 3.0),
             _Event("flush_a", 100.0), _Event("flush_b", 1.0), _Event("k1", 4.0),
             _Event("flush_a", 100.0), _Event("flush_b", 1.0), _Event("k1", 6.0), _Event("Memcpy", 1.0)]
    monkeypatch.setattr(timer, "_profile", lambda body: calls)
    assert timer._cupti(lambda: None) == 5.0  # median of 5, 4, 7
    monkeypatch.setattr(timer, "_profile", lambda body: calls[:8])
    assert timer._cupti(lambda: None) is None  # 2 windows for 3 calls
    monkeypatch.setattr(timer, "_profile", lambda body: [e for e in calls if e.name.startswith("flush")])
    assert timer._cupti(lambda: None) is None  # no op kernel seen at all
