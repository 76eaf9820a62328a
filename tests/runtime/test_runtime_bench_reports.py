"""The GPU-only scripts of issue 10 (bench/bench_launch.py, bench/check_launch_paths.py): their
reporting, checked on made-up measurements so a GPU run cannot end in a formatting error."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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


def test_check_launch_paths_compare():
    cl = _load("check_launch_paths")
    case = {"launches": [["k", [1, 1, 1], [128, 1, 1], 0, ["<ptr>", "0100000000000000"]]], "outputs": ["ab"],
            "handed_over": []}
    same = {"hot_path": "c", "cases": {"x": case}}
    assert cl.compare(same, {"hot_path": "python", "cases": {"x": case}}) == []
    other = {"hot_path": "python", "cases": {"x": {**case, "outputs": ["cd"]}}}
    problems = cl.compare({"hot_path": "python", "cases": {"x": case}}, other)
    assert any("extension did not load" in p for p in problems) and any("outputs differ" in p for p in problems)
