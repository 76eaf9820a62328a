#!/usr/bin/env python3
"""tilebin against tile_kernels 1.0.0, side by side: the same call on the same inputs, one process.

    PYTHONPATH=<site with the tilebin wheel>[:<folder with tile_kernels + tilelang>] \\
        python3 bench/compare_peer.py [--families quant,moe,transpose] [--quick] [--candidates] [--events] [--ops a,b] [--flush write|read] [--peer-first] [--json F] [--md F]

Per case (``compare_peer_cases.py``: the shapes of the speed-parity issue, decode sizes of 1-128
tokens, the transpose ops): device time of tilebin's op and of tile_kernels' op of the same name
on the same inputs, the ratio peer / ours (above 1: tilebin is faster), and whether their outputs
are bit-equal (every returned tensor's dtype, shape and bytes; "no" says how many elements
differ: an op whose layout tilebin defines differently, e.g. get_fused_mapping's slot order, or
padding tile_kernels leaves unwritten, differs there by design).  Per family: the geometric mean
of the ratios and the lowest one.

Device time: the median over ``--reps`` calls of the kernel time CUPTI records (torch.profiler),
each call after an L2 flush (a 256 MiB ``bitwise_not_``; its kernels are recognised by name and
left out).  When the profiler records nothing usable, CUDA events around each call (flush outside
them) are used and the row says so.  Each op is called once before timing (tile_kernels compiles
a variant at its first call).

``--candidates`` runs every family a second time with all the installed tilebin's
``TILEBIN_CANDIDATE_<OP>`` switches on (its rows' family reads "<family> (candidates)", with its own
geometric mean): shipped kernels, speed candidates and the peer timed in one run.

Without tile_kernels importable the peer columns read "n/a" and tilebin's times are still
reported; without a GPU the script prints one line and exits 0.  Several families run each in
its own child process, so a fault in one (tile_kernels has some on TileLang 0.1.15) spares the
others.  Exit status 1 when a tilebin case could not be measured or a child process failed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Callable

from _common import _pkg_version, env_facts, env_markdown, markdown_table, write_reports
from bench_engram import load_peer
from compare_peer_cases import FAMILIES, Case, all_cases

FLUSH_BYTES = 256 << 20


def _t():
    import torch

    return torch


# ------------------------------------------------------------------ timing
class Timer:
    """Kernel time per call with a cold L2: CUPTI through torch.profiler, else CUDA events."""

    def __init__(self, reps: int, events: bool = False, flush: str = "write") -> None:
        torch = _t()
        self.reps = reps
        self.read_flush = flush == "read"
        self.buf = torch.zeros(FLUSH_BYTES // 8, dtype=torch.int64, device="cuda")
        # what the flush launches, to leave it out; none with --events (CUDA events time every case)
        self.flush_names = frozenset() if events else self._flush_names()

    def flush(self) -> None:
        """Evict the L2: rewrite the buffer (default: the L2 is left full of dirty lines, whose
        write-back the next kernel's misses pay) or, ``--flush read``, read it (clean lines)."""
        if self.read_flush:
            self.buf.max()
        else:
            self.buf.bitwise_not_()

    def _profile(self, body: Callable[[], None]) -> list:
        torch = _t()
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            body()
            torch.cuda.synchronize()
        device = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")
                  and not getattr(e, "is_user_annotation", False)]
        return sorted(device, key=lambda e: e.time_range.start)

    def _flush_names(self) -> frozenset:
        """The names of the flush's device kernels (a second try: a first profiler session may miss
        early events); empty when the profiler records nothing, and then CUDA events time."""
        for _ in range(2):
            try:
                names = frozenset(e.name for e in self._profile(lambda: [self.flush() for _ in range(3)]))
            except Exception as exc:  # noqa: BLE001 - no usable profiler
                print(f"torch.profiler unusable ({exc!r}): timing with CUDA events", flush=True)
                return frozenset()
            if names:
                return names
        print("torch.profiler recorded no kernels: timing with CUDA events", flush=True)
        return frozenset()

    def kernel_us(self, fn: Callable[[], Any]) -> tuple[float, str]:
        """(median us per call, "cupti" or "events")."""
        per_call = self._cupti(fn) if self.flush_names else None
        return (per_call, "cupti") if per_call is not None else (self._events(fn), "events")

    def _cupti(self, fn: Callable[[], Any]) -> float | None:
        def body() -> None:
            for _ in range(self.reps):
                self.flush()
                fn()

        sums: list[float] = []
        in_flush = False
        for e in self._profile(body):
            if e.name in self.flush_names:  # a flush (one or more kernels) opens the next call's window
                if not in_flush:
                    sums.append(0.0)
                in_flush = True
            elif sums:
                sums[-1] += e.time_range.elapsed_us()
                in_flush = False
        if len(sums) != self.reps or not any(sums):  # the profiler missed calls: not a measurement
            return None
        return statistics.median(sums)

    def _events(self, fn: Callable[[], Any]) -> float:
        torch = _t()
        pairs = []
        for _ in range(self.reps):
            self.flush()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            pairs.append((e0, e1))
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) * 1e3 for a, b in pairs)


# ------------------------------------------------------------------ one case
def _tensors(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return [value]


def bit_equal(ours: Any, peer: Any) -> str:
    """"yes", or "no (...)" saying what differs: structure, dtype/shape, values (count), strides."""
    torch = _t()
    a, b = _tensors(ours), _tensors(peer)
    if len(a) != len(b):
        return f"no ({len(a)} vs {len(b)} outputs)"
    bad = total = 0
    strides = False
    for x, y in zip(a, b, strict=True):
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            bad += x != y
            continue
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"no ({x.dtype} {tuple(x.shape)} vs {y.dtype} {tuple(y.shape)})"
        strides |= x.numel() > 1 and x.stride() != y.stride()
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        bad += int((x.contiguous().view(ints) != y.contiguous().view(ints)).sum())
        total += x.numel()
    if bad:
        return f"no ({bad}/{total} elements differ{', strides differ' if strides else ''})"
    return "yes, strides differ" if strides else "yes"


def run_case(case: Case, ours_mod: Any, peer_mod: Any, timer: Timer, peer_first: bool = False) -> dict:
    """Time both sides on the same inputs and compare their outputs; errors are recorded per side.
    Ours is measured first unless ``peer_first``."""
    torch = _t()
    row: dict[str, Any] = {"family": case.family, "op": case.op, "case": case.label}
    try:
        args, kwargs = case.make()
    except Exception as exc:  # noqa: BLE001 - the inputs (made with tilebin ops) failed: a tilebin failure
        row["ours_error"] = f"inputs: {exc!r}"[:200]
        return row
    sides = (("ours", ours_mod), ("peer", peer_mod))
    results = {side: _measure(row, side, mod, case.op, args, kwargs, timer)
               for side, mod in (sides[::-1] if peer_first else sides) if mod is not None}
    if "ours_us" in row and "peer_us" in row:  # both ran (and returned the outputs compared here)
        row["ratio"] = row["peer_us"] / row["ours_us"] if row["ours_us"] > 0 else math.nan
        row["bit_equal"] = bit_equal(results["ours"], results["peer"])
    del args, kwargs, results
    torch.cuda.empty_cache()
    return row


def _measure(row: dict, side: str, mod: Any, op: str, args: tuple, kwargs: dict, timer: Timer) -> Any:
    """One side's output (its first call: the peer compiles there) and its device time, into ``row``;
    an exception is recorded as ``<side>_error`` (the peer's asserts as a refusal)."""
    try:
        fn = getattr(mod, op)
        result = fn(*args, **kwargs)
        _t().cuda.synchronize()
        row[f"{side}_us"], row[f"{side}_timer"] = timer.kernel_us(lambda: fn(*args, **kwargs))
        return result
    except Exception as exc:  # noqa: BLE001 - e.g. the peer asserts on a shape it does not serve
        refused = side == "peer" and isinstance(exc, AssertionError)
        row[f"{side}_error"] = ("refused (assert) " if refused else f"{type(exc).__name__}: ") + str(exc)[:160]
        return None


def run_family(family: str, quick: bool, reps: int, events: bool = False, ops: frozenset = frozenset(),
               flush: str = "write", peer_first: bool = False) -> list[dict]:
    ours = importlib.import_module(f"tilebin.ops.{family}")
    peer = None
    if load_peer() is not None:  # sets up tile_kernels' import on TileLang 0.1.15
        try:
            peer = importlib.import_module(f"tile_kernels.{family}")
        except Exception as exc:  # noqa: BLE001
            print(f"tile_kernels.{family} not importable ({exc!r}): peer column n/a", flush=True)
    timer = Timer(reps, events, flush)
    rows = []
    for case in all_cases(family, quick):
        if ops and case.op not in ops:
            continue
        rows.append(run_case(case, ours, peer, timer, peer_first))
        print(" | ".join(_cells(rows[-1])), flush=True)
        if any(lost in rows[-1].get(f"{side}_error", "") for side in ("ours", "peer") for lost in _CONTEXT_LOST):
            rows.append({"family": family, "op": "(the rest)", "case": "not run",
                         "ours_error": "the CUDA context was lost in the case above"})
            break
    return rows


_CONTEXT_LOST = ("illegal memory access", "device-side assert", "unspecified launch failure", "CUDA error")


# ------------------------------------------------------------------ report
def _us(row: dict, side: str) -> str:
    if f"{side}_error" in row:
        error = row[f"{side}_error"]
        return error if error.startswith("refused") else "error: " + error
    if f"{side}_us" not in row:
        return "n/a"
    return f"{row[f'{side}_us']:.1f}" + ("" if row.get(f"{side}_timer") == "cupti" else " (events)")


def _cells(row: dict) -> list[str]:
    ratio = f"{row['ratio']:.2f}" if "ratio" in row else "n/a"
    cells = [row["family"], row["op"], row["case"], _us(row, "ours"), _us(row, "peer"), ratio,
             row.get("bit_equal", "n/a")]
    return [" ".join(c.replace("|", "/").split()) for c in cells]  # one markdown table cell each


def geomeans(rows: list[dict]) -> dict[str, dict]:
    """Per family: the geometric mean of peer/ours over the cases both measured, and the slowest case."""
    out = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        ratios = [r["ratio"] for r in rows if r["family"] == family and r.get("ratio", 0) > 0]
        if ratios:
            out[family] = {"geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)), "min": min(ratios),
                           "cases": len(ratios)}
    return out


def report(rows: list[dict], facts: dict, ns: argparse.Namespace, failed: list[str]) -> None:
    headers = ["family", "op", "case", "tilebin us", "tile_kernels us", "peer/ours", "bit-equal"]
    means = geomeans(rows)
    md = "### tilebin vs tile_kernels 1.0.0 (bench/compare_peer.py)\n\n" + env_markdown(facts) + "\n\n"
    md += (f"tile_kernels {facts['tile_kernels']}, tilelang {facts['tilelang']}; device time = median CUPTI "
           f"kernel time of {ns.reps} calls, L2 flushed before each by a 256 MiB "
           f"{'read' if ns.flush == 'read' else 'rewrite'} (\"(events)\": CUDA events); "
           f"{'tile_kernels' if ns.peer_first else 'tilebin'} measured first in every case.\n\n")
    md += markdown_table(headers, [_cells(r) for r in rows]) + "\n\n"
    md += markdown_table(["family", "geomean peer/ours", "lowest case", "cases"],
                         [[f, f"{m['geomean']:.3f}", f"{m['min']:.2f}", m["cases"]] for f, m in means.items()])
    if failed:
        md += "\n\nfailed: " + "; ".join(failed)
    write_reports({"facts": facts, "rows": rows, "geomean": means, "failed": failed,
                   "command": " ".join([os.path.basename(sys.executable), *sys.argv])}, md, ns.json, ns.md)


def candidate_switches() -> list[str]:
    """The ``TILEBIN_CANDIDATE_<OP>`` switches the installed tilebin's op modules read."""
    import re

    import tilebin

    root = os.path.dirname(tilebin.__file__)
    names = set()
    for sub in ("ops", "modeling"):
        for folder, _, files in os.walk(os.path.join(root, sub)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(folder, name)) as fh:
                        names.update(re.findall(r"TILEBIN_CANDIDATE_[A-Z0-9_]+", fh.read()))
    return sorted(names)


def _children(ns: argparse.Namespace, families: list[str]) -> tuple[list[dict], list[str]]:
    """Each family in its own process (a peer fault loses one family, not the run); with
    ``--candidates`` each family once more with every candidate switch on, its rows' family
    marked " (candidates)"."""
    rows, failed = [], []
    runs = [("", {})]
    if ns.candidates:
        runs.append((" (candidates)", {name: "1" for name in candidate_switches()}))
    for mark, switches in runs:
        for family in families:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "rows.json")
                cmd = [sys.executable, os.path.abspath(__file__), "--families", family, "--reps", str(ns.reps),
                       "--rows-only", path] + (["--quick"] if ns.quick else []) \
                    + (["--events"] if ns.events else []) + (["--ops", ns.ops] if ns.ops else []) \
                    + ["--flush", ns.flush] + (["--peer-first"] if ns.peer_first else [])
                rc = subprocess.run(cmd, env={**os.environ, **switches}).returncode
                if os.path.exists(path):
                    with open(path) as fh:
                        rows += [{**r, "family": r["family"] + mark} for r in json.load(fh)]
                if rc or not os.path.exists(path):
                    failed.append(f"{family}{mark}: child process exited with {rc}")
    return rows, failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, of " + ", ".join(FAMILIES))
    ap.add_argument("--quick", action="store_true", help="fewer shapes per op")
    ap.add_argument("--reps", type=int, default=30, help="timed calls per case and side")
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--candidates", action="store_true",
                    help="also run every family with all TILEBIN_CANDIDATE_* switches on (rows marked)")
    ap.add_argument("--events", action="store_true",
                    help="time with CUDA events around each call (end to end, launch gaps included) "
                         "instead of summed CUPTI kernel durations, which count a PDL overlap twice")
    ap.add_argument("--ops", default="", help="comma-separated op names: only their cases")
    ap.add_argument("--peer-first", action="store_true",
                    help="measure tile_kernels before tilebin in every case (default: tilebin first)")
    ap.add_argument("--flush", choices=("write", "read"), default="write",
                    help="how the L2 is flushed before each call: rewrite 256 MiB (dirty lines left, the default) "
                         "or read it (clean lines, as ncu's --cache-control all)")
    ap.add_argument("--rows-only", help=argparse.SUPPRESS)  # a child: write its rows here, no report
    ns = ap.parse_args()
    families = [f for f in ns.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        ap.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")
    try:
        import torch

        gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        gpu = False
    if not gpu:
        print("compare_peer: skipped, no CUDA GPU visible (needs torch with CUDA and an H100/H200)")
        return 0
    ops = frozenset(o for o in ns.ops.split(",") if o)
    if ns.rows_only:
        rows = [r for f in families for r in run_family(f, ns.quick, ns.reps, ns.events, ops, ns.flush, ns.peer_first)]
        with open(ns.rows_only, "w") as fh:
            json.dump(rows, fh)
        return 0
    facts = {**env_facts(), "tile_kernels": _pkg_version("tile-kernels"), "tilelang": _pkg_version("tilelang")}
    if len(families) == 1 and not ns.candidates:
        rows, failed = run_family(families[0], ns.quick, ns.reps, ns.events, ops, ns.flush, ns.peer_first), []
    else:
        rows, failed = _children(ns, families)
    report(rows, facts, ns, failed)
    broken = [r for r in rows if "ours_us" not in r]
    return 1 if failed or broken else 0


if __name__ == "__main__":
    sys.exit(main())
