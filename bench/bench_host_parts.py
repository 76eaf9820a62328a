#!/usr/bin/env python3
"""Host cost of the pieces a launch is made of, on CUDA tensors (where runtime.launch's time goes).

    PYTHONPATH=<site with the tilebin wheel> python3 bench/bench_host_parts.py [--md F] [--json F]

Each row: ``timeit`` of one expression over two bf16 CUDA tensors (min of 7 repeats of 100k
calls, in ns per evaluation), so rows can be added up to explain ``runtime.launch`` minus the
raw driver call in bench_launch.py.  Nothing here launches a kernel except the last rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit

from _common import env_facts, env_markdown, markdown_table


def rows(rt) -> list[tuple[str, float]]:
    import torch

    x = torch.empty(1, 32, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(1, 64, 32, device="cuda", dtype=torch.bfloat16)
    rt.launch("transpose.batched_transpose", x, out)
    torch.cuda.synchronize()
    entry = rt._registry.default_registry()._entries["transpose.batched_transpose"]
    (plan,) = [*entry.fast_plans.values(), *entry.plans.values()]  # the bound Launcher (compiled or Python)
    sig = entry._fast_sig
    raw_stream = torch._C._cuda_getCurrentRawStream
    unchecked = rt.unchecked_launcher("transpose.batched_transpose", dtype="bfloat16", small=False)
    g = {"x": x, "out": out, "T": torch.Tensor, "rt": rt, "plan": plan, "sig": sig, "args": (x, out),
         "fast": entry.fast_plans, "raw_stream": raw_stream, "torch": torch, "twin": plan.twin(),
         "prepared": rt.prepare("transpose.batched_transpose", x, out), "unchecked": unchecked}
    exprs = [
        "x.dtype", "x.size()", "x.shape", "x.stride()", "x.device", "x.get_device()", "x.is_cuda",
        "x.data_ptr()", "x.__class__ is T", "raw_stream(0)", "torch.cuda.current_stream().cuda_stream",
        "sig(args)", "fast.get(sig(args))", "twin.check_values(args)", "twin.packed(args)",
        "plan.run(args)", "twin.run(args)", "prepared()", "unchecked(x, out)",
        "rt.launch('transpose.batched_transpose', x, out)",
    ]
    # the torch calls an op's run makes around its launch (a decode-size bf16 [4, 7168] y): allocation forms, views
    g.update(y=torch.empty(4, 7168, device="cuda", dtype=torch.bfloat16), d8=torch.float8_e4m3fn, dev=x.device,
             E=torch.empty, s=(4, 7168))
    exprs += ["torch.empty((4, 7168), dtype=d8, device=y.device)", "torch.empty(s, dtype=d8, device=dev)",
              "torch.empty(4, 7168, dtype=d8, device=dev)", "E(4, 7168, dtype=d8, device=dev)",
              "y.new_empty((4, 7168), dtype=d8)", "torch.empty_like(y)", "y.unbind(0)", "y[0]", "y.unsqueeze(0)",
              "y.view(1, 4, 7168)", "y.view(torch.int16)", "y.T", "y.is_contiguous()", "y.shape[0]", "y.numel()",
              "torch.cuda.is_current_stream_capturing()", "torch.cuda.current_device()"]
    if rt.launch is not getattr(rt, "_launch_python", rt.launch):  # the compiled front, and the function it fronts
        exprs.append("rt._launch_python('transpose.batched_transpose', x, out)")
    result = []
    for e in exprs:
        heavy = any(w in e for w in ("run", "launch", "prepared", "unchecked", "packed"))
        n = 20_000 if heavy else 100_000
        best = min(timeit.repeat(e, globals=g, number=n, repeat=7)) / n * 1e9
        if heavy:
            torch.cuda.synchronize()
        result.append((e, best))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    from tilebin import runtime as rt

    facts = env_facts()
    measured = rows(rt)
    md = "\n".join(["### Host cost of launch parts (ns, min of 7 x timeit)", "", env_markdown(facts), "",
                    f"hot path: {rt.hot_path()} (plan, prepared and unchecked rows use it; twin.* is the "
                    "pure-Python Launcher)", "",
                    markdown_table(["expression", "ns"], [[f"`{e}`", f"{ns:.0f}"] for e, ns in measured])])
    print(md)
    if args.md:
        with open(args.md, "a") as f:
            f.write(md + "\n\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": facts, "ns": dict(measured)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
