#!/usr/bin/env python3
"""``moe.aux_fi``'s two grid modes side by side: where "arrivals" (per-bin last arrival, blocks x
bins atomics) stops beating "ticket" (one ticket, non-zero bins only), to place the op's switch
(the kernel's ``arrivals_max_experts`` meta).

    PYTHONPATH=<site with the tilebin wheel> python3 bench/bench_aux_fi_modes.py [--reps 30] [--md F] [--json F]

Per expert count and input size: the op's device time with each mode forced (CUPTI kernel time,
L2 flushed before each call: compare_peer's Timer), and whether both gave the same bits.
"""

from __future__ import annotations

import argparse
import sys

from _common import env_facts, env_markdown, markdown_table, write_reports
from compare_peer import Timer

EXPERTS = (32, 64, 128, 256, 512, 1024, 4096)
SHAPES = ((4001 * 8, 2), (4001, 8), (32768, 8))  # rows x topk: ~64k / 32k / 262k entries


def _forced(stats, mode: str):
    """A ``kernel_meta`` whose ``arrivals_max_experts`` forces ``mode`` for every expert count."""
    real = stats.kernel_meta

    def meta(kernel: str, key: str):
        if key == "arrivals_max_experts":
            return 1 << 30 if mode == "arrivals" else 0
        return real(kernel, key)

    return meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--md")
    ns = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no GPU: nothing to time")
        return 0
    from tilebin.ops import moe
    from tilebin.ops.moe import _stats

    timer, rows, real = Timer(ns.reps), [], _stats.kernel_meta
    for experts in EXPERTS:
        for tokens, topk in SHAPES:
            idx = torch.randint(-1, experts, (tokens, topk), dtype=torch.int64, device="cuda")
            times, outs = {}, {}
            for mode in ("arrivals", "ticket"):
                _stats.kernel_meta = _forced(_stats, mode)
                _stats.AUX_FI.memo.clear()
                try:
                    outs[mode] = moe.aux_fi(idx, experts, topk)
                    times[mode], _ = timer.kernel_us(lambda: moe.aux_fi(idx, experts, topk))
                finally:
                    _stats.kernel_meta = real
                    _stats.AUX_FI.memo.clear()
            same = bool(torch.equal(outs["arrivals"].view(torch.int32), outs["ticket"].view(torch.int32)))
            rows.append([experts, f"{tokens}x{topk}", f"{times['arrivals']:.2f}", f"{times['ticket']:.2f}",
                         f"{times['ticket'] / times['arrivals']:.2f}", "yes" if same else "NO"])
            print(rows[-1], flush=True)
    facts = env_facts()
    md = (f"### aux_fi grid modes (bench/bench_aux_fi_modes.py)\n\n{env_markdown(facts)}\n\n"
          + markdown_table(["experts", "topk_idx", "arrivals us", "ticket us", "ticket/arrivals", "bit-equal"], rows))
    write_reports({"env": facts, "rows": rows}, md, ns.json, ns.md)
    return 0 if all(r[-1] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
