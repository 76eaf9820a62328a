#!/usr/bin/env python3
"""Device time, bandwidth and host cost of the ``tilebin.ops.quant`` ops on the installed wheel.

    PYTHONPATH=<site with the tilebin wheel> python3 bench/bench_quant.py [--json F] [--md F] [--quick]

Per config (tokens x hidden, op and flags):

* device time: median of CUDA events around each call (each round queued behind a GPU sleep,
  so no launch gap lands inside a timed region), rotating over enough inputs that the working
  set exceeds the L2 several times;
* GB/s: the bytes the op must move (input read + every output written, scales included) over
  the device time; ``% copy``: that over torch ``copy_``'s GB/s on a buffer of the op's input
  size, measured in the same run (read + write);
* host us/call: wall time per call of the op (output allocation included) at decode size
  (4 tokens), in batches of 50 calls with a sync before each batch (bench/_common.host_us).

An op missing from the wheel is reported as such, not skipped silently.
"""

from __future__ import annotations

import argparse
import math

from _common import env_facts, env_markdown, host_us, markdown_table, time_device_ms, write_reports

WORKING_SET_MB = 1024
# token counts at host-cost size where 4 does not fit: per-channel needs a multiple of 128, the
# backward's rows a multiple of its topk (8)
HOST_TOKENS = {"swiglu_forward_and_per_channel_cast_and_transpose": 128, "swiglu_backward_and_per_token_cast": 8}


def _nbytes(obj) -> int:
    if obj is None:
        return 0
    if isinstance(obj, (tuple, list)):
        return sum(_nbytes(o) for o in obj)
    if hasattr(obj, "numel"):
        return obj.numel() * obj.element_size()
    return 0


def configs(quick: bool):
    """(label, op name, make_inputs(tokens, hidden) -> args, kwargs, shapes) entries."""
    import torch

    UE8M0 = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)

    def bf16(t, h):
        return torch.randn(t, h, device="cuda", dtype=torch.bfloat16)

    def f32(t, h):
        return torch.randn(t, h, device="cuda", dtype=torch.float32)

    def quantized(fmt, block, **flags):
        def make(t, h):
            from tilebin.ops import quant
            return quant.per_token_cast(bf16(t, h), fmt, block[1], **flags) if block[0] == 1 else \
                quant.per_block_cast(bf16(t, h), fmt, block, **flags)
        return make

    def swiglu_bwd(t, h, npc=32, topk=8):
        """The backward's arguments for ``t`` expanded rows of ``t / topk`` tokens (every row routed)."""
        x = torch.randn(t, 2 * h, device="cuda").clamp(-448, 448).to(torch.float8_e4m3fn)
        sf = torch.rand(t, 2 * h // npc, device="cuda") + 0.01
        p2t = torch.randperm(t, device="cuda").to(torch.int32)
        ttp = torch.empty(t, dtype=torch.int32, device="cuda")
        ttp[p2t.long()] = torch.arange(t, dtype=torch.int32, device="cuda")
        weight = torch.rand(t // topk, topk, device="cuda") + 0.01
        return ((x, sf), bf16(t, h), weight, p2t, ttp.view(t // topk, topk), npc), {}

    tokens = (8192,) if quick else (4096, 8192, 16384)
    rows = []
    for t in tokens:
        rows += [
            ("bf16->e4m3 1x128", "per_token_cast", lambda t, h: ((bf16(t, h), "e4m3", 128), {}), t, 7168),
            ("bf16->e4m3 1x128 ue8m0", "per_token_cast",
             lambda t, h: ((bf16(t, h), "e4m3", 128), UE8M0), t, 7168),
            ("bf16->e2m1 1x32", "per_token_cast", lambda t, h: ((bf16(t, h), "e2m1", 32), {}), t, 7168),
            ("fp32->e4m3 1x128", "per_token_cast", lambda t, h: ((f32(t, h), "e4m3", 128), {}), t, 7168),
            ("bf16->e5m6 (1 scale/token)", "per_token_cast", lambda t, h: ((bf16(t, h), "e5m6", h), {}), t, 7168),
            ("bf16->e4m3 128x128", "per_block_cast", lambda t, h: ((bf16(t, h), "e4m3", (128, 128)), {}), t, 7168),
            ("bf16->e4m3 32x32 ue8m0", "per_block_cast",
             lambda t, h: ((bf16(t, h), "e4m3", (32, 32)), UE8M0), t, 7168),
            ("bf16->e4m3 128x128, given sf", "per_block_cast_with_precomputed_sf",
             lambda t, h: ((bf16(t, h), "e4m3", (128, 128), torch.rand(-(-t // 128), h // 128, device="cuda") + 0.01),
                           {}), t, 7168),
            ("e2m1 1x32 -> e4m3 1x128 (lossless)", "per_block_cast_lossless",
             lambda t, h: ((quantized("e2m1", (1, 32), round_sf=True)(t, h), "e4m3", (1, 32), (1, 128)),
                           dict(round_sf=True)), t, 7168),
            ("e2m1 1x32 ue8m0 -> e4m3 128x128 ue8m0 (lossless)", "per_block_cast_lossless",
             lambda t, h: ((quantized("e2m1", (1, 32), **UE8M0)(t, h), "e4m3", (1, 32), (128, 128)), UE8M0), t, 7168),
            ("bf16->e4m3 per-channel 128", "per_channel_cast", lambda t, h: ((bf16(t, h), "e4m3", 128), {}), t, 7168),
            ("bf16->e4m3 per-channel+T 128", "per_channel_cast_and_transpose",
             lambda t, h: ((bf16(t, h), "e4m3", 128), {}), t, 7168),
            ("e4m3 1x128 -> bf16", "per_token_cast_back",
             lambda t, h: ((quantized("e4m3", (1, 128))(t, h), "bf16", 128), {}), t, 7168),
            ("e2m1 1x32 -> bf16", "per_token_cast_back",
             lambda t, h: ((quantized("e2m1", (1, 32))(t, h), "bf16", 32), {}), t, 7168),
            ("swiglu fwd bf16->e4m3 1x128", "swiglu_forward_and_per_token_cast",
             lambda t, h: ((bf16(t, 2 * h), "e4m3", 128), {}), t, 2048),
            ("swiglu fwd per-channel+T 128", "swiglu_forward_and_per_channel_cast_and_transpose",
             lambda t, h: ((bf16(t, 2 * h), "e4m3", 128), {}), t, 2048),
            (SWIGLU_BWD_LABEL, "swiglu_backward_and_per_token_cast", swiglu_bwd, t, 4096),
        ]
    return rows


SWIGLU_BWD_LABEL = "swiglu bwd e4m3 1x32, topk 8"


def copy_gbps(nbytes: int) -> float:
    """torch copy_ GB/s (read + write) on buffers of ``nbytes``, rotating over the working set."""
    import torch

    n = max(nbytes // 2, 1)
    count = min(16, max(2, math.ceil(WORKING_SET_MB * 2**20 / (4 * n))))
    pairs = [(torch.empty(n, device="cuda", dtype=torch.bfloat16), torch.empty(n, device="cuda", dtype=torch.bfloat16))
             for _ in range(count)]
    fns = [lambda a=a, b=b: b.copy_(a) for a, b in pairs]
    ms = time_device_ms(fns, rounds=10, per_round=20)["median"]
    return 2 * n * 2 / (ms * 1e-3) / 1e9


def run_config(quant, label, op, make, t, h, copies: dict) -> list[str]:
    """One table row: device us, GB/s, % of copy_ at ``t x h``; host us per call at decode size."""
    import torch

    fn = getattr(quant, op, None)
    if fn is None:
        return [label, f"{t}x{h}", "op missing", "", "", ""]
    args, kwargs = make(t, h)
    in_bytes = _nbytes(args[0])
    result = fn(*args, **kwargs)
    moved = in_bytes + _nbytes(result)
    count = min(8, max(2, math.ceil(WORKING_SET_MB * 2**20 / max(moved, 1))))
    inputs = [make(t, h) for _ in range(count - 1)] + [(args, kwargs)]
    fns = [lambda a=a, k=k: fn(*a, **k) for a, k in inputs]
    ms = time_device_ms(fns, rounds=8, per_round=16)["median"]
    gbps = moved / (ms * 1e-3) / 1e9
    if in_bytes not in copies:
        copies[in_bytes] = copy_gbps(in_bytes)
    small = HOST_TOKENS.get(op, 4)
    small_args, small_kwargs = make(small, h)
    host = host_us(lambda: fn(*small_args, **small_kwargs))
    del inputs, fns
    torch.cuda.empty_cache()
    return [label, f"{t}x{h}", f"{ms * 1e3:.1f}", f"{gbps:.0f}", f"{100 * gbps / copies[in_bytes]:.1f}",
            f"{host:.1f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--quick", action="store_true", help="8192 tokens only")
    ap.add_argument("--ops", help="comma-separated op names to run (default: every op)")
    ns = ap.parse_args()
    import torch
    from tilebin.ops import quant

    facts = env_facts()
    copies: dict = {}
    rows = []
    runs = []
    only = set(ns.ops.split(",")) if ns.ops else None
    for label, op, make, t, h in configs(ns.quick):
        if only is None or op in only:
            runs.append((quant, label, op, make, t, h))
    for mod, label, op, make, t, h in runs:
        torch.manual_seed(0)
        try:
            rows.append(run_config(mod, label, op, make, t, h, copies))
        except Exception as exc:  # one broken op must not hide the others' numbers
            rows.append([label, f"{t}x{h}", f"error: {exc!r}"[:160], "", "", ""])
        print(" | ".join(rows[-1]), flush=True)
    headers = ["op", "tokens x hidden", "device us", "GB/s", "% copy", "host us/call (4 tokens*)"]
    md = "### tilebin.ops.quant\n\n" + env_markdown(facts) + "\n\n" + markdown_table(headers, rows)
    md += ("\n\n*host us/call: median per-call wall time of batches of 50 calls at 4 tokens (128 for "
           "swiglu per-channel), a sync before each batch (bench/_common.host_us), output allocation included.")
    md += "\n\ncopy_ GB/s by input size: " + ", ".join(f"{b / 2**20:.0f} MiB: {g:.0f}" for b, g in copies.items())
    write_reports({"facts": facts, "rows": rows, "copy_gbps": copies}, md, ns.json, ns.md)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
