#!/usr/bin/env python3
"""One case of ``compare_peer_cases.py``, one side, for Nsight Compute: the profiled calls are the
only ones inside a ``cudaProfilerStart`` / ``Stop`` range.

    ncu --profile-from-start off --section SpeedOfLight ... \\
        python3 bench/profile_case.py --family moe --op get_fused_mapping --case "topk 2" --side peer

``--case`` is a substring of the case label (the first match is used).  Each side is called once
outside the range first (tile_kernels compiles there), then ``--calls`` times inside it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from bench_engram import load_peer
from compare_peer_cases import all_cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True)
    ap.add_argument("--op", required=True)
    ap.add_argument("--case", default="", help="a substring of the case label")
    ap.add_argument("--side", choices=("ours", "peer"), default="ours")
    ap.add_argument("--calls", type=int, default=1)
    ns = ap.parse_args()
    import torch

    matches = [c for c in all_cases(ns.family, False) if c.op == ns.op and ns.case in c.label]
    if not matches:
        print(f"no case of {ns.family}.{ns.op} has {ns.case!r} in its label", file=sys.stderr)
        return 2
    case = matches[0]
    if ns.side == "peer" and load_peer() is None:
        return 2
    mod = importlib.import_module(f"{'tilebin.ops' if ns.side == 'ours' else 'tile_kernels'}.{ns.family}")
    args, kwargs = case.make()
    fn = getattr(mod, ns.op)
    fn(*args, **kwargs)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(ns.calls):
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled {ns.side} {case.family}.{case.op} [{case.label}] x{ns.calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
