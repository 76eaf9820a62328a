"""The GPU-only scripts of issue 10 (bench/bench_launch.py, bench/check_launch_paths.py): their
reporting, checked on made-up measurements so a GPU run cannot end in a formatting error."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"_tilebin_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_launch_ratios_and_table():
    bl = _load("bench_launch")
    med = {"floor C: transpose": 4.4, "floor C: gemm": 4.9, "floor cuda-py: transpose cuLaunchKernel": 4.9}
    for path, extra in (("c", 0.0), ("python", 4.0)):
        med |= {f"{path}: launch transpose": 5.5 + extra, f"{path}: prepared transpose": 4.8 + extra,
                f"{path}: launch gemm (TMA)": 6.2 + extra, f"{path}: prepared gemm (TMA)": 5.4 + extra,
                f"{path}: unchecked transpose": 4.9 + extra}
    rows = {r[0]: r for r in bl.ratios(med)}
    assert rows["c: launch / floor cuda-py"][1:] == ["1.12", "<= 1.2", "yes"]
    assert rows["c: prepared / floor cuda-py"][3] == "yes" and rows["python: prepared / floor cuda-py"][3] == "**NO**"
    assert rows["c: TMA extra, launch (gemm - transpose - floor C diff)"][1] == "0.20 µs"
    result = {"env": {}, "host_us": med, "host_us_rounds": {n: [{"median": v}] for n, v in med.items()},
              "ratios": bl.ratios(med), "hot_path": "c", "hot_module": "/x/_hot.abi3.so", "errors": {},
              "first_launch": {"median": {"import_ms": 12.0}, "errors": []}}
    text = bl.render(result)
    assert "| c: launch transpose | 5.50 |" in text and "import_ms" in text and "hot path of this process: c" in text
    assert bl.ratios({})[0][1] == "nan"  # missing rows: NaN, not a crash
    paired = {"c: TMA extra, launch, paired": {"median": 0.31, "p25": 0.1, "p75": 0.52, "blocks": 300, "batch": 100},
              "c: TMA extra, prepared, paired": {"median": 0.61, "p25": 0.4, "p75": 0.8, "blocks": 300, "batch": 100}}
    rows = {r[0]: r for r in bl.ratios(med, paired)}
    assert rows["c: TMA extra, launch, paired (median [p25, p75] of 300 blocks)"][1:] == \
        ["0.31 µs [0.10, 0.52]", "<= 0.5 µs", "yes"]
    assert rows["c: TMA extra, prepared, paired (median [p25, p75] of 300 blocks)"][3] == "**NO**"
    assert not any("python: TMA extra, launch, paired" in r for r in rows)


def test_bench_launch_paired_tma_extra_interleaves_the_four_calls(monkeypatch):
    """Each block times the two floors and the two calls once; the extra is the block's difference."""
    bl = _load("bench_launch")
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    ticks = iter(range(0, 10**12, 1000))
    monkeypatch.setattr(bl.time, "perf_counter_ns", lambda: next(ticks))
    counts = {}

    def call(name):
        return lambda *a: counts.__setitem__(name, counts.get(name, 0) + 1)

    rows = {"floor C: transpose": (lambda n: call("ft")() or 0, None), "floor C: gemm": (lambda n: call("fg")() or 0, None)}
    prow = {f"c: {k} {w}": call(f"{k} {w}") for k in ("launch", "prepared") for w in ("transpose", "gemm (TMA)")}
    args = type("A", (), {"paired_blocks": 5, "paired_batch": 3})()
    out = bl.paired_tma_extra(rows, prow, "c", args)
    assert set(out) == {"c: TMA extra, launch, paired", "c: TMA extra, prepared, paired"}
    assert out["c: TMA extra, launch, paired"]["blocks"] == 5
    assert counts == {"ft": 10, "fg": 10, "launch transpose": 15, "launch gemm (TMA)": 15,
                      "prepared transpose": 15, "prepared gemm (TMA)": 15}
    assert bl.paired_tma_extra({}, prow, "c", args) == {}  # no C floor: no paired rows


def test_check_launch_paths_compare():
    cl = _load("check_launch_paths")
    case = {"launches": [["k", [1, 1, 1], [128, 1, 1], 0, ["<ptr>", "0100000000000000"]]], "outputs": ["ab"],
            "handed_over": []}
    same = {"hot_path": "c", "cases": {"x": case}}
    assert cl.compare(same, {"hot_path": "python", "cases": {"x": case}}) == []
    other = {"hot_path": "python", "cases": {"x": {**case, "outputs": ["cd"]}}}
    problems = cl.compare({"hot_path": "python", "cases": {"x": case}}, other)
    assert any("extension did not load" in p for p in problems) and any("outputs differ" in p for p in problems)
