#!/usr/bin/env python3
"""Device time and bandwidth of transpose.batched_transpose against torch, same run, same bytes.

    PYTHONPATH=<site with the tilebin wheel> python3 bench/bench_transpose.py [--tiled] [--direct] [--small] [--cand KERNEL] [--only bfloat16,...] [--json F] [--md F]

Per config: median device time (CUDA events around each call; each round queued behind a GPU
sleep so no launch gap lands inside a timed region) of

  tilebin   runtime.launch(KERNEL, x, out), KERNEL the one tilebin.ops.transpose launches at these
            sizes: "transpose.batched_transpose_warps" where rows and cols are multiples of 16
            bytes' worth of elements, else "transpose.batched_transpose" (no key pinned: its 8-warp
            tiles; the 2-warp ``small`` ones and the direct kernel serve decode-sized grids)
  copy      out.view(x.shape).copy_(x)  (the same bytes, no transpose: the bandwidth ceiling)
  torch_T   x.transpose(1, 2).contiguous()

rotating over enough (x, out) pairs that the working set is >= --working-set-mb (default
1024, ~17x the H200's L2).  GB/s counts bytes read + bytes written (2 x tensor bytes).
``% of copy`` = tilebin GB/s / copy GB/s (target >= 90 % at bf16 1 x 8192 x 7168).  Every
config is checked bit-exact once after timing.
"""

from __future__ import annotations

import argparse
import math
import sys

from _common import env_facts, env_markdown, markdown_table, time_device_ms, write_reports

TRANSPOSE = "transpose.batched_transpose"  # --tiled: timed beside the op's kernel at every config
WARPS = "transpose.batched_transpose_warps"  # the op's kernel where rows and cols are 16-byte multiples
DIRECT = "transpose.batched_transpose_direct"  # --direct: timed beside it at every config
CONFIGS = [  # (dtype, batch, rows, cols)
    ("bfloat16", 1, 8192, 7168),
    ("float32", 1, 8192, 7168),
    ("float8_e4m3fn", 1, 8192, 7168),
    ("bfloat16", 8, 4096, 4096),
    ("float32", 8, 4096, 4096),
    ("float8_e4m3fn", 8, 4096, 4096),
    ("bfloat16", 4, 1000, 1001),
]
HEADLINE = ("bfloat16", 1, 8192, 7168)


def _int_view(t):
    import torch

    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _pairs(dtype, b, r, c, working_set_mb: int):
    import torch

    pair_bytes = 2 * b * r * c * torch.empty((), dtype=dtype).element_size()
    count = min(16, max(2, math.ceil(working_set_mb * 2**20 / pair_bytes)))
    pairs = []
    for _ in range(count):
        x = torch.randn(b, r, c, device="cuda").to(dtype)
        pairs.append((x, torch.empty(b, c, r, device="cuda", dtype=dtype)))
    return pairs, pair_bytes


def _torch_fns(pairs):
    """torch copy_ and transpose().contiguous(); fp8 through uint8 views where torch lacks a kernel."""
    import torch

    def views(x, out):
        try:
            out.view(x.shape).copy_(x)
            x.transpose(1, 2).contiguous()
            return x, out
        except (RuntimeError, NotImplementedError):
            return x.view(torch.uint8), out.view(torch.uint8)

    vs = [views(x, out) for x, out in pairs]
    copy = [lambda x=x, out=out: out.view(x.shape).copy_(x) for x, out in vs]
    trans = [lambda x=x: x.transpose(1, 2).contiguous() for x, _ in vs]
    return copy, trans


def _trials(rt, args, name: str) -> dict:
    """The speed-trial launches asked for (``--direct``, ``--small``, every ``--cand`` variant of
    dtype ``name``), by column label."""
    trials = {}
    if args.tiled:
        trials["tiled"] = lambda x, out: rt.launch(TRANSPOSE, x, out)
    if args.direct:
        trials["direct"] = lambda x, out: rt.launch(DIRECT, x, out)
    if args.small:
        trials["small"] = rt.unchecked_launcher(TRANSPOSE, dtype=name, small=True)
    for v in rt.spec(args.cand).variants if args.cand else ():
        if v.key.get("dtype") == name:
            label = "cand " + ",".join(f"{k}={val}" for k, val in sorted(v.key.items()) if k != "dtype")
            trials[label] = rt.unchecked_launcher(args.cand, **v.key)
    return trials


def bench_config(rt, cfg, args) -> dict:
    import torch

    name, b, r, c = cfg
    dtype = getattr(torch, name)
    pairs, pair_bytes = _pairs(dtype, b, r, c, args.working_set_mb)
    vec = 16 // pairs[0][0].element_size()
    kernel = WARPS if r % vec == 0 and c % vec == 0 else TRANSPOSE
    tb = [lambda x=x, out=out: rt.launch(kernel, x, out) for x, out in pairs]
    copy, trans = _torch_fns(pairs)
    row = {"dtype": name, "shape": [b, r, c], "bytes_moved": pair_bytes, "buffers": len(pairs), "kernel": kernel}
    timed = [("tilebin", tb), ("copy", copy), ("torch_T", trans)]
    trials = _trials(rt, args, name)  # label -> fn(x, out): the speed-trial columns, each timed and checked
    timed += [(label, [lambda x=x, out=out, fn=fn: fn(x, out) for x, out in pairs]) for label, fn in trials.items()]
    for label, fns in timed:
        for f in fns[: min(len(fns), 4)] * 3:  # warm-up
            f()
        torch.cuda.synchronize()
        t = time_device_ms(fns, args.rounds, args.per_round)
        row[label] = {**t, "GBps": pair_bytes / (t["median"] * 1e-3) / 1e9}
    row["pct_of_copy"] = 100.0 * row["tilebin"]["GBps"] / row["copy"]["GBps"]
    row["speedup_vs_torch_T"] = row["torch_T"]["median"] / row["tilebin"]["median"]
    x, out = pairs[0]
    out.view(torch.uint8).fill_(255)
    rt.launch(kernel, x, out)
    want = _int_view(x).transpose(1, 2).contiguous()
    row["bit_exact"] = bool(torch.equal(_int_view(out), want))
    for label, fn in trials.items():
        out.view(torch.uint8).fill_(255)
        fn(x, out)
        row["bit_exact"] = row["bit_exact"] and bool(torch.equal(_int_view(out), want))
        row[f"{label}_speedup"] = row["tilebin"]["median"] / row[label]["median"]
    del pairs, tb, copy, trans
    torch.cuda.empty_cache()
    return row


_COLUMNS = ("tiled", "direct", "small")  # the optional trial columns, in table order


def render(result: dict) -> str:
    rows = []
    for r in result["rows"]:
        if "error" in r:
            rows.append([r["dtype"], "x".join(map(str, r["shape"])), "", "error", r["error"][:120], "", "", "", "", ""])
            continue
        rows.append([r["dtype"], "x".join(map(str, r["shape"])), r["kernel"].split(".")[1], f"{r['bytes_moved'] / 1e6:.0f}",
                     f"{r['tilebin']['median'] * 1e3:.1f}", f"{r['tilebin']['GBps']:.0f}",
                     f"{r['copy']['GBps']:.0f}", f"{r['pct_of_copy']:.1f}",
                     f"{r['torch_T']['GBps']:.0f} ({r['speedup_vs_torch_T']:.2f}x)",
                     "yes" if r["bit_exact"] else "**NO**"]
                    + [f"{r[k]['median'] * 1e3:.1f} ({r[k + '_speedup']:.2f}x)" for k in _COLUMNS if k in r])
    extra = sorted({k for r in result["rows"] for k in r if k.startswith("cand ") and not k.endswith("_speedup")})
    cand_rows = [[r["dtype"], "x".join(map(str, r["shape"])), f"{r['tilebin']['median'] * 1e3:.1f}", k,
                  f"{r[k]['median'] * 1e3:.1f}", f"{r[k + '_speedup']:.3f}"]
                 for r in result["rows"] for k in extra if k in r]
    head = result.get("headline_pct_of_copy")
    verdict = "n/a" if head is None else f"{head:.1f} % (target >= 90 %: {'met' if head >= 90 else '**NOT met**'})"
    return "\n".join([
        "### Transpose bandwidth (device time, CUDA events, median)", "", env_markdown(result["env"]), "",
        markdown_table(["dtype", "b x rows x cols", "tilebin kernel", "MB moved", "tilebin µs", "tilebin GB/s", "copy_ GB/s",
                        "% of copy", "torch T.contiguous GB/s (tilebin speedup)", "bit-exact"]
                       + [f"{k} µs (speedup)" for k in _COLUMNS if any(k in r for r in result["rows"])], rows),
        "", f"Headline bf16 1x8192x7168: {verdict}",
    ] + (["", markdown_table(["dtype", "b x rows x cols", "shipped µs", "candidate", "µs", "speedup"], cand_rows)]
         if cand_rows else []))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=20)
    ap.add_argument("--working-set-mb", type=int, default=1024)
    ap.add_argument("--only", help="comma-separated dtypes to keep, e.g. bfloat16")
    ap.add_argument("--tiled", action="store_true",
                    help=f"also time {TRANSPOSE} (8-warp tiles) at every config (a column; its output is checked too)")
    ap.add_argument("--direct", action="store_true",
                    help=f"also time {DIRECT} at every config (a column; its output is checked too)")
    ap.add_argument("--cand", metavar="KERNEL",
                    help="a trial kernel with transpose.batched_transpose's parameters and a 'dtype' key: time each of "
                         "its variants of the config's dtype beside it (a row each, checked bit-exact)")
    ap.add_argument("--small", action="store_true",
                    help=f"also time {TRANSPOSE}'s 2-warp small=True variant at every config (a column, checked too)")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()

    from tilebin import runtime as rt

    facts = env_facts()
    rows, failed = [], False
    for cfg in CONFIGS:
        if args.only and cfg[0] not in args.only.split(","):
            continue
        try:
            rows.append(bench_config(rt, cfg, args))
        except Exception as exc:  # one broken config must not hide the others
            rows.append({"dtype": cfg[0], "shape": list(cfg[1:]), "error": repr(exc)})
            failed = True
            print(f"[bench_transpose] {cfg}: {exc!r}", file=sys.stderr)
        print(f"[bench_transpose] done {cfg}", file=sys.stderr, flush=True)
    head = next((r for r in rows if (r["dtype"], *r["shape"]) == HEADLINE and "error" not in r), None)
    result = {"env": facts, "rows": rows, "params": vars(args),
              "headline_pct_of_copy": head["pct_of_copy"] if head else None}
    write_reports(result, render(result), args.json, args.md)
    return 1 if failed or any(not r.get("bit_exact", False) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
