#!/usr/bin/env python3
"""Eager host time per op call for two installed tilebin builds, side by side (A/B in one run).

    python3 bench/bench_host_ab.py --site before=/tmp/tb-old --site after=/tmp/tb-new [--md F]

Each site is a folder a tilebin wheel was installed into (``pip install --no-deps --target``).
Give the first site twice under two labels (``--site before=F --site before2=F``) for an A/A
control: its ratio is this run's noise, the yardstick for the other sites' ratios.
Every site is measured in its own child process (one tilebin per interpreter), all pinned to
one CPU core, in ABBA order over ``--rounds`` rounds (so neither site always runs first); a row
reports each site's median over rounds of ``_common.host_us`` (median over batches of 50 calls,
GPU idle between batches) and the ratio to the first site.  The calls are decode-size (4 tokens, hidden 7168, 256 experts): where the
host path, not the GPU, sets an op's cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _common import env_facts, env_markdown, markdown_table, write_reports

HERE = Path(__file__).resolve().parent
_CORE = 2


def calls():
    """(label, fn) of decode-size calls of the common ops (inputs built once)."""
    import torch
    from tilebin.ops import moe, quant

    try:  # a build before tilebin.ops.transpose existed (an A/B against an older wheel): no transpose row
        from tilebin.ops import transpose
    except ImportError:
        transpose = None

    dev = "cuda"
    x = torch.randn(4, 7168, device=dev, dtype=torch.bfloat16)
    logits, bias = torch.randn(4, 256, device=dev), torch.randn(256, device=dev)
    topk_idx, topk_w = moe.top2_sum_gate(logits, bias, 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1, "sigmoid")
    mapping = moe.get_fused_mapping(topk_idx, 256, 4 * 8 + 256 * 127, 128)
    expanded = moe.expand_to_fused(x, mapping[3], mapping[0])
    q = quant.per_token_cast(x, "e4m3", 128)
    packed = torch.randint(-128, 128, (4, 3584), dtype=torch.int8, device=dev)
    x2 = torch.randn(4, 2 * 2048, device=dev, dtype=torch.bfloat16)
    return [
        ("quant.per_token_cast(x, 'e4m3', 128)", lambda: quant.per_token_cast(x, "e4m3", 128)),
        ("quant.per_token_cast(x, 'e4m3', 128, col-major sf)",
         lambda: quant.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True)),
        ("quant.per_block_cast(x, 'e4m3', (128, 128))", lambda: quant.per_block_cast(x, "e4m3", (128, 128))),
        ("quant.cast_back(q, 'bf16', (1, 128))", lambda: quant.cast_back(q, "bf16", (1, 128))),
        ("quant.swiglu_forward_and_per_token_cast(x2, 'e4m3', 128)",
         lambda: quant.swiglu_forward_and_per_token_cast(x2, "e4m3", 128)),
        ("moe.topk_gate(logits, 8)", lambda: moe.topk_gate(logits, 8)),
        ("moe.top2_sum_gate(256 experts, 8 groups)",
         lambda: moe.top2_sum_gate(logits, bias, 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1, "sigmoid")),
        ("moe.normalize_weight(topk_w)", lambda: moe.normalize_weight(topk_w)),
        ("moe.aux_fi(topk_idx, 256, 8)", lambda: moe.aux_fi(topk_idx, 256, 8)),
        ("moe.mask_indices_by_tp(topk_idx, 256, 8, 1, 2)", lambda: moe.mask_indices_by_tp(topk_idx, 256, 8, 1, 2)),
        *([("transpose.transpose(x)", lambda: transpose.transpose(x))] if transpose else []),
        ("moe.get_fused_mapping(topk_idx, 256, n, 128)",
         lambda: moe.get_fused_mapping(topk_idx, 256, 4 * 8 + 256 * 127, 128)),
        ("moe.expand_to_fused(x, ...)", lambda: moe.expand_to_fused(x, mapping[3], mapping[0])),
        ("moe.reduce_fused(expanded, topk_w, ...)", lambda: moe.reduce_fused(expanded, topk_w, mapping[3])),
        ("quant.per_token_cast_back(q, 'bf16', 128)", lambda: quant.per_token_cast_back(q, "bf16", 128)),
        ("moe.group_count(topk_idx, 256)", lambda: moe.group_count(topk_idx, 256)),
        ("moe.expand_to_fused_with_sf(q, 128, ...)",
         lambda: moe.expand_to_fused_with_sf(q, 128, mapping[3], mapping[0])),
        ("quant.swiglu_backward_and_per_token_cast(32 rows, 4 x top-8)", _swiglu_bwd_call(x)),
        ("quant.unpack_from_e2m1fn_x2(int8 [4, 3584], bf16)",
         lambda: quant.unpack_from_e2m1fn_x2(packed, torch.bfloat16)),
    ] + _mhc_engram_calls()


def _swiglu_bwd_call(x):
    """swiglu_backward_and_per_token_cast at decode size: 4 tokens x top-8 = 32 expanded rows (every
    row routed), e4m3 input with 1 x 128 scales."""
    import torch
    from tilebin.ops import quant

    rows, hidden = 32, x.shape[1]
    fwd = (torch.randn(rows, 2 * hidden, device=x.device).clamp(-448, 448).to(torch.float8_e4m3fn),
           torch.rand(rows, 2 * hidden // 128, device=x.device) + 0.01)
    grad = torch.randn(rows, hidden, device=x.device, dtype=torch.bfloat16)
    weight = torch.rand(4, 8, device=x.device) + 0.01
    p2t = torch.arange(rows, device=x.device, dtype=torch.int32)
    return lambda: quant.swiglu_backward_and_per_token_cast(fwd, grad, weight, p2t, p2t.view(4, 8), 128)


def _mhc_engram_calls():
    """(label, fn) of decode-size mHC (mhc_mult 4, leading dims (1, 4)) and Engram (hc 4) calls."""
    import torch
    from tilebin.modeling.mhc import ops as mhc
    from tilebin.ops import engram

    dev, bf16 = "cuda", torch.bfloat16
    h = torch.randn(1, 4, 7168, device=dev, dtype=bf16)
    r = torch.randn(1, 4, 4, 7168, device=dev, dtype=bf16)
    pre, post = torch.rand(1, 4, 4, 1, device=dev), torch.rand(1, 4, 4, 1, device=dev)
    comb = torch.rand(1, 4, 4, 4, device=dev)
    mixes, scale, base = torch.randn(1, 4, 24, device=dev), torch.rand(3, device=dev), torch.rand(24, device=dev)
    x, k = (torch.randn(4, 4, 7168, device=dev, dtype=bf16) for _ in range(2))
    v = torch.randn(4, 7168, device=dev, dtype=bf16)
    wf = engram.fused_weight(*(torch.randn(4, 7168, device=dev, dtype=bf16) for _ in range(2)))
    return [
        ("mhc.expand_to_mhc(h, 4)", lambda: mhc.expand_to_mhc(h, 4)),
        ("mhc.mhc_pre_apply_mix(r, pre)", lambda: mhc.mhc_pre_apply_mix(r, pre)),
        ("mhc.mhc_post_fwd(h, r, post, comb)", lambda: mhc.mhc_post_fwd(h, r, post, comb)),
        ("mhc.mhc_pre_split_mixes(mixes, ...)", lambda: mhc.mhc_pre_split_mixes(mixes, scale, base, 4, 1.0, 1e-6)),
        ("mhc.sinkhorn_normalize(comb)", lambda: mhc.sinkhorn_normalize(comb, 10, 1e-6)),
        ("engram.engram_gate_fwd(x, k, v, wf, ...)", lambda: engram.engram_gate_fwd(x, k, v, wf, 1e-20, 1e-6)),
    ]


def child(rounds_out: str) -> None:
    """Measure every call once (in this interpreter's tilebin) and write {label: us} as JSON."""
    sys.path.insert(0, str(HERE))
    from _common import host_us

    import tilebin

    os.sched_setaffinity(0, {_CORE})  # every child on the same core: no core-to-core speed difference
    result = {"_tilebin": str(Path(tilebin.__file__).resolve().parent)}
    for label, fn in calls():
        try:
            result[label] = host_us(fn)
        except Exception as exc:  # noqa: BLE001 - an older wheel may lack or refuse a call: n/a for it, said here
            print(f"bench_host_ab: {label} failed in {result['_tilebin']}: {exc!r}"[:400], file=sys.stderr)
    result["_dynamo_imported"] = "torch._dynamo" in sys.modules
    Path(rounds_out).write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", action="append", required=True, help="label=folder with an installed tilebin")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--md")
    ap.add_argument("--json")
    ns = ap.parse_args()
    if ns.child:
        return child(ns.child)
    sites = dict(s.split("=", 1) for s in ns.site)
    runs: dict[str, list[dict]] = {label: [] for label in sites}
    for r in range(ns.rounds):
        order = list(sites.items()) if r % 2 == 0 else list(sites.items())[::-1]  # ABBA
        for label, folder in order:
            out = Path(f"/tmp/bench_host_ab_{label}_{r}.json")
            env = {**os.environ, "PYTHONPATH": folder}
            subprocess.run([sys.executable, __file__, "--site", f"{label}={folder}", "--child", str(out)],
                           env=env, check=True, cwd="/tmp")
            runs[label].append(json.loads(out.read_text()))
    labels = list(sites)
    names = list(dict.fromkeys(k for lb in labels for k in runs[lb][0] if not k.startswith("_")))
    rows = []
    for name in names:  # a call one site's tilebin lacks (an older wheel): n/a there
        med = {lb: statistics.median(run[name] for run in runs[lb]) if name in runs[lb][0] else None for lb in labels}
        us = [f"{med[lb]:.2f}" if med[lb] is not None else "n/a" for lb in labels]
        ratios = [f"{med[lb] / med[labels[0]]:.3f}" if None not in (med[lb], med[labels[0]]) else "n/a"
                  for lb in labels[1:]]
        rows.append([name, *us, *ratios])
        print(" | ".join(rows[-1]), flush=True)
    facts = env_facts()
    md = ("### eager host time per op call, A/B (4 tokens; median of "
          f"{ns.rounds} ABBA rounds on one pinned core, each the median of 30 batches of 50 calls)\n\n")
    md += env_markdown(facts) + "\n\n" + "\n".join(
        f"- {lb}: `{runs[lb][0]['_tilebin']}` (torch._dynamo imported: {runs[lb][0]['_dynamo_imported']})"
        for lb in labels) + "\n\n"
    md += markdown_table(["call", *(f"{lb} us" for lb in labels), *(f"{lb}/{labels[0]}" for lb in labels[1:])], rows)
    write_reports({"facts": facts, "rows": rows}, md, ns.json, ns.md)


if __name__ == "__main__":
    main()
