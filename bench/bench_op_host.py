#!/usr/bin/env python3
"""Where an op call's host time goes: the parts of one ``tilebin.ops`` call, timed alone.

    PYTHONPATH=<site with the tilebin wheel> python3 bench/bench_op_host.py [--md F] [--profile]

Each row: host wall time per call (``_common.host_us``: median over batches of 50 calls) in
two settings, the GPU idle between batches (a sync before each batch; the queue stays short)
and busy (each batch queued behind a GPU sleep, so every launch lands in a non-empty queue).
Decode-size inputs (4 tokens).  The floor is cuda-python's ``cuLaunchKernel`` on a prepacked
argument buffer (bench_launch's row a).  ``--profile`` adds cProfile's top functions of the
per_token_cast and per_block_cast calls.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats

from _common import env_facts, env_markdown, host_us, markdown_table, write_reports


def parts():
    """(label, fn) rows: torch primitives, the runtime's launcher, whole ops."""
    import torch
    from tilebin import runtime

    x = torch.randn(4, 7168, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(4, 7168, device="cuda", dtype=torch.bfloat16)
    dev = x.device
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
        # the forms an op could allocate with (ops pass a torch.device kept from the first call)
        ("torch.empty((4, 7168), fp8, device=dev) (dev: a kept torch.device)",
         lambda: torch.empty((4, 7168), dtype=torch.float8_e4m3fn, device=dev)),
        ("torch.empty((4, 7168), fp8, device='cuda:0')",
         lambda: torch.empty((4, 7168), dtype=torch.float8_e4m3fn, device="cuda:0")),
        ("torch.empty((4, 7168), fp8, device=0)", lambda: torch.empty((4, 7168), dtype=torch.float8_e4m3fn, device=0)),
        ("x.new_empty((4, 7168), dtype=fp8)", lambda: x.new_empty((4, 7168), dtype=torch.float8_e4m3fn)),
        ("torch.empty((4, 7168), fp8, device=dev) again (drift check)",
         lambda: torch.empty((4, 7168), dtype=torch.float8_e4m3fn, device=dev)),
        ("x.view(torch.uint8)", lambda: x.view(torch.uint8)),
        ("x.T", lambda: x.T),
        ("x[:2, :]", lambda: x[:2, :]),
        ("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream),
        ("torch eager: x.to(torch.float8_e4m3fn)", lambda: x.to(torch.float8_e4m3fn)),
        ("torch eager: torch.add(x, 1)", lambda: torch.add(x, 1)),
    ]
    fn = runtime.unchecked_launcher("transpose.batched_transpose", dtype="bfloat16", small=False)
    x3, o3 = x.view(1, 4, 7168), out.view(1, 7168, 4)
    rows.insert(0, ("floor: raw cuLaunchKernel (transpose, prepacked)", _raw_launch(runtime, x3, o3)))
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


def _raw_launch(runtime, x, out):
    """cuda-python's cuLaunchKernel on the handle and void** buffer runtime.launch prepared (private
    attributes, read once): the same kernel with no lookup, validation or pointer refresh."""
    import torch
    from cuda.bindings import driver as cu

    runtime.launch("transpose.batched_transpose", x, out)
    torch.cuda.synchronize()
    entry = runtime._registry.default_registry()._entries["transpose.batched_transpose"]
    plan = [*entry.fast_plans.values(), *entry.plans.values()][-1]
    ((fn, grid, block, smem, address),) = plan.twin().packed((x, out))  # the Python twin's own buffer
    return functools.partial(cu.cuLaunchKernel, fn, *grid, *block, smem, torch.cuda.current_stream().cuda_stream,
                             address, 0)


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
            rows.append([label, f"{host_us(fn):.2f}", f"{host_us(fn, busy=True):.2f}"])
        except Exception as exc:
            rows.append([label, f"error: {exc!r}"[:200], ""])
        print(" | ".join(rows[-1]), flush=True)
    md = "### host cost of an op call, by part (4 tokens)\n\n" + env_markdown(facts) + "\n\n"
    md += markdown_table(["part", "host us/call, GPU idle", "host us/call, GPU busy"], rows)
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
