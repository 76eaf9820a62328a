#!/usr/bin/env python3
"""Where an op call's host time goes: the parts of one ``tilebin.ops`` call, timed alone.

    PYTHONPATH=<site with the tilebin wheel> python3 bench/bench_op_host.py [--md F] [--profile]

Each row is the median over 7 rounds of 2000 calls (wall time per call) while a queued GPU
sleep keeps the device busy, so launches never wait for the GPU.  Decode-size inputs (4
tokens).  ``--profile`` adds cProfile's top functions of the per_token_cast and topk_gate
calls when the wheel has them.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

from _common import env_facts, env_markdown, markdown_table, write_reports


def per_call_us(fn, calls: int = 2000, rounds: int = 7) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        torch.cuda._sleep(100_000_000)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def parts():
    """(label, fn) rows: torch primitives, the runtime's launcher, whole ops."""
    import torch
    from tilebin import runtime

    x = torch.randn(4, 7168, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(4, 7168, device="cuda", dtype=torch.bfloat16)
    rows = [
        ("x.shape[0]", lambda: x.shape[0]),
        ("x.stride(0)", lambda: x.stride(0)),
        ("x.data_ptr()", lambda: x.data_ptr()),
        ("x.dtype is torch.bfloat16", lambda: x.dtype is torch.bfloat16),
        ("x.device", lambda: x.device),
        ("x.is_contiguous()", lambda: x.is_contiguous()),
        ("torch.empty((4, 7168), fp8, device=x.device)",
         lambda: torch.empty((4, 7168), dtype=torch.float8_e4m3fn, device=x.device)),
        ("torch.empty((4, 7168), fp8, device='cuda')",
         lambda: torch.empty((4, 7168), dtype=torch.float8_e4m3fn, device="cuda")),
        ("x.view(torch.uint8)", lambda: x.view(torch.uint8)),
        ("x.T", lambda: x.T),
        ("x[:2, :]", lambda: x[:2, :]),
        ("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream),
    ]
    fn = runtime.unchecked_launcher("transpose.batched_transpose", dtype="bfloat16")
    x3, o3 = x.view(1, 4, 7168), out.view(1, 7168, 4)
    rows.append(("unchecked_launcher(transpose)(x, out)", lambda: fn(x3, o3)))
    rows.append(("runtime.launch(transpose, x, out)",
                 lambda: runtime.launch("transpose.batched_transpose", x3, o3)))
    from tilebin.ops import quant

    for name, call in [
        ("quant.per_token_cast(x, 'e4m3', 128)", lambda: quant.per_token_cast(x, "e4m3", 128)),
        ("quant.per_block_cast(x, 'e4m3', (128, 128))", lambda: quant.per_block_cast(x, "e4m3", (128, 128))),
        ("quant.per_channel_cast(x, 'e4m3', 128)", lambda: quant.per_channel_cast(x, "e4m3", 128)),
    ]:
        if hasattr(quant, name.split("(")[0].split(".")[1]):
            rows.append((name, call))
    return rows


def profile(label: str, fn, n: int = 3000) -> str:
    fn()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
    return f"#### cProfile: {label} ({n} calls)\n\n```\n{buf.getvalue()[-4000:]}\n```\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md")
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true")
    ns = ap.parse_args()
    facts = env_facts()
    rows = []
    for label, fn in parts():
        try:
            rows.append([label, f"{per_call_us(fn):.2f}"])
        except Exception as exc:
            rows.append([label, f"error: {exc!r}"[:200]])
        print(" | ".join(rows[-1]), flush=True)
    md = "### host cost of an op call, by part (4 tokens)\n\n" + env_markdown(facts) + "\n\n"
    md += markdown_table(["part", "host us/call"], rows)
    if ns.profile:
        from tilebin.ops import quant
        import torch

        x = torch.randn(4, 7168, device="cuda", dtype=torch.bfloat16)
        for op, call in [("per_token_cast", lambda: quant.per_token_cast(x, "e4m3", 128)),
                         ("per_block_cast", lambda: quant.per_block_cast(x, "e4m3", (128, 128)))]:
            if hasattr(quant, op):
                md += "\n\n" + profile(op, call)
    write_reports({"facts": facts, "rows": rows}, md, ns.json, ns.md)


if __name__ == "__main__":
    main()
