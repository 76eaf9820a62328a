#!/usr/bin/env python3
"""Where an op call's host time goes: cProfile over repeated decode-size calls of bench_host_ab's table.

    PYTHONPATH=<site with a tilebin wheel> python3 bench/profile_host.py [--calls N] [--top K] [SUBSTRING ...]

For each call of ``bench_host_ab.calls()`` whose label contains one of the substrings (all when
none is given): a warm-up, then ``--calls`` calls under cProfile (GPU idle: a sync every 50 calls,
outside the profile), printed as the ``--top`` functions by own time.  cProfile's overhead inflates
every Python call, so compare two wheels' profiles with each other, never with bench timings.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_host_ab import calls  # noqa: E402 - after the path set-up


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("only", nargs="*", help="label substrings")
    ns = ap.parse_args()
    import torch

    import tilebin

    if not torch.cuda.is_available():
        print("profile_host: skipped, no CUDA GPU visible")
        return 0
    print(f"tilebin from {Path(tilebin.__file__).resolve().parent}")
    for label, fn in calls():
        if ns.only and not any(s in label for s in ns.only):
            continue
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        for start in range(0, ns.calls, 50):
            prof.enable()
            for _ in range(min(50, ns.calls - start)):
                fn()
            prof.disable()
            torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(ns.top)
        body = "\n".join(line for line in text.getvalue().splitlines() if line.strip())
        print(f"\n=== {label} ({ns.calls} calls)\n{body}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
