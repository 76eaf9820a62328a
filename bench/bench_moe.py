#!/usr/bin/env python3
"""Host cost at decode sizes and device time at prefill sizes of the ``tilebin.ops.moe`` ops.

    PYTHONPATH=<site with the tilebin wheel> python3 bench/bench_moe.py [--json F] [--md F] [--candidate]

Two tables:

* host us per call (output allocation included) at 1, 4, 32 and 128 tokens (batches of 50
  calls, a sync before each batch: bench/_common.host_us), next to the device time of one
  call at that size (CUDA events, median);
* device time, GB/s of the bytes the op must move (inputs read + outputs written) and % of
  torch ``copy_``'s GB/s on a buffer of the same size, at 4096 / 8192 tokens (DeepSeek-V3-like
  routing: 256 experts, 8 groups, top-8, hidden 7168).

An op missing from the wheel, or one that raises, is reported in its row.  ``--candidate`` adds
a row "<op> (candidate)" after each op that has an internal candidate kernel (issue 12): the
same inputs, the op's own output allocation, the candidate kernel launched in place of the
current one.
"""

from __future__ import annotations

import argparse

from _common import env_facts, env_markdown, host_us, markdown_table, time_device_ms, write_reports

EXPERTS, TOPK, GROUPS, TOPK_GROUPS, HIDDEN = 256, 8, 8, 4, 7168


def _nbytes(obj) -> int:
    if isinstance(obj, (tuple, list)):
        return sum(_nbytes(o) for o in obj)
    return obj.numel() * obj.element_size() if hasattr(obj, "numel") else 0


def _candidate_rows(t: int, scores, weights) -> list:
    """(label, fn, inputs) of the internal candidate kernels at ``t`` tokens, called the way the
    op's fast path calls the current kernel (allocate the outputs, launch).  None at present: the
    issue-12 gating candidates were swapped in or dropped after the H200 run of 2026-12-02."""
    return []


def calls(moe, t: int, candidate: bool = False):
    """(label, fn, inputs) per op at ``t`` tokens; inputs are what the op reads."""
    import torch

    scores = torch.randn(t, EXPERTS, device="cuda", dtype=torch.float32)
    topk_idx = torch.stack([torch.randperm(EXPERTS, device="cuda")[:TOPK] for _ in range(t)]) if t else \
        torch.empty(0, TOPK, dtype=torch.int64, device="cuda")
    weights = torch.rand(t, TOPK, device="cuda", dtype=torch.float32)
    group_idx = topk_idx // (EXPERTS // GROUPS)
    bias = torch.randn(EXPERTS, device="cuda", dtype=torch.float32)
    rows = [
        ("topk_gate", lambda: moe.topk_gate(scores, TOPK), scores),
        ("top2_sum_gate sigmoid", lambda: moe.top2_sum_gate(scores, bias, TOPK, TOPK_GROUPS, GROUPS, False, 0, 2.5, 0, 1,
                                                           0, 1, "sigmoid"), scores),
        ("topk_sum_and_topk_group_idx", lambda: moe.topk_sum_and_topk_group_idx(scores.view(t, GROUPS, -1), 2,
                                                                                TOPK_GROUPS), scores),
        ("normalize_weight", lambda: moe.normalize_weight(weights), weights),
    ] + (_candidate_rows(t, scores, weights) if candidate else []) + [
        ("group_count", lambda: moe.group_count(group_idx, GROUPS), group_idx),
        ("aux_fi", lambda: moe.aux_fi(topk_idx, EXPERTS, TOPK), topk_idx),
        ("mask_indices_by_tp", lambda: moe.mask_indices_by_tp(topk_idx, EXPERTS, 8, 0, 2), topk_idx),
        ("get_fused_mapping", lambda: moe.get_fused_mapping(topk_idx, EXPERTS, t * TOPK + EXPERTS * 16, 16, True),
         topk_idx),
    ]
    if t:
        x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
        try:
            mapping = moe.get_fused_mapping(topk_idx, EXPERTS, 0, 16)
        except Exception as exc:  # the rows below need its outputs: report them as failed
            def broken(exc=exc):
                raise RuntimeError(f"get_fused_mapping failed: {exc!r}")
            return rows + [("expand_to_fused bf16", broken, x), ("reduce_fused bf16", broken, x)]
        pos_to_expert, token_topk_to_pos = mapping[0], mapping[3]
        expanded = torch.randn(pos_to_expert.shape[0], HIDDEN, device="cuda", dtype=torch.bfloat16)
        xq = (x.to(torch.float8_e4m3fn), torch.rand(t, HIDDEN // 128, device="cuda") + 0.5)
        rows += [
            ("expand_to_fused bf16", lambda: moe.expand_to_fused(x, token_topk_to_pos, pos_to_expert), x),
            ("expand_to_fused_with_sf e4m3 1x128",
             lambda: moe.expand_to_fused_with_sf(xq, 128, token_topk_to_pos, pos_to_expert), xq),
            ("reduce_fused bf16", lambda: moe.reduce_fused(expanded, weights, token_topk_to_pos), expanded),
        ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--candidate", action="store_true", help="add the internal candidate kernels' rows (issue 12)")
    ns = ap.parse_args()
    import torch
    from tilebin.ops import moe

    facts = env_facts()
    host_rows, dev_rows = [], []
    for t in (1, 4, 32, 128):
        for label, fn, _ in calls(moe, t, ns.candidate):
            try:
                ms = time_device_ms([fn], rounds=5, per_round=20)["median"]
                host_rows.append([label, t, f"{host_us(fn):.1f}", f"{ms * 1e3:.1f}"])
            except Exception as exc:
                host_rows.append([label, t, f"error: {exc!r}"[:160], ""])
            print(" | ".join(map(str, host_rows[-1])), flush=True)
    copies: dict = {}
    for t in (4096, 8192):
        for label, fn, inp in calls(moe, t, ns.candidate):
            try:
                moved = _nbytes(inp) + _nbytes(fn())
                ms = time_device_ms([fn], rounds=5, per_round=20)["median"]
                gbps = moved / (ms * 1e-3) / 1e9
                n = max(_nbytes(inp), 1 << 20)
                if n not in copies:
                    a, b = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
                    cms = time_device_ms([lambda: b.copy_(a)], rounds=5, per_round=20)["median"]
                    copies[n] = 2 * n / (cms * 1e-3) / 1e9
                dev_rows.append([label, t, f"{ms * 1e3:.1f}", f"{gbps:.0f}", f"{100 * gbps / copies[n]:.1f}"])
            except Exception as exc:
                dev_rows.append([label, t, f"error: {exc!r}"[:160], "", ""])
            print(" | ".join(map(str, dev_rows[-1])), flush=True)
    md = "### tilebin.ops.moe\n\n" + env_markdown(facts) + "\n\n"
    md += f"256 experts, {GROUPS} groups, top-{TOPK}, hidden {HIDDEN}.\n\n"
    md += markdown_table(["op", "tokens", "host us/call", "device us"], host_rows) + "\n\n"
    md += markdown_table(["op", "tokens", "device us", "GB/s", "% copy (same bytes)"], dev_rows)
    write_reports({"facts": facts, "host": host_rows, "device": dev_rows}, md, ns.json, ns.md)


if __name__ == "__main__":
    main()
