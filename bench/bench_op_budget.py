#!/usr/bin/env python3
"""Issue 10's host-time budget, checked for every public ``tilebin.ops`` op at decode size.

    PYTHONPATH=<site with the tilebin wheel> python3 bench/bench_op_budget.py [--md F] [--json F] \\
        [--families quant,moe,transpose,engram]

Issue 10's budget: the host time of an op call at 4 tokens, output allocation included, is at
most torch eager ``torch.add(x, 1, out=y)`` plus one ``torch.empty`` per allocated output, both
measured in the same run.  One row per name in the ``__all__`` of ``tilebin.ops.quant``, ``.moe``,
``.transpose`` and ``.engram`` (``missing_ops`` refuses to start when one has no builder in ``OPS``):

* host us/call: ``_common.host_us`` (median over batches of 50 calls), GPU idle (a sync before
  each batch: the budget's setting) and GPU busy (``busy_us``: each batch behind a GPU sleep);
* n, allocated outputs: the distinct storages (``untyped_storage().data_ptr()``) among the
  tensors the call returns (tuples and lists walked), storages of the op's inputs left out; a
  zero-byte tensor (no address) counts by itself; None (an in-place op) counts 0.  Workspaces
  the op allocates and does not return are not counted (a stricter budget);
* budget = add + n x empty: ``host_us`` of ``torch.add(x, 1, out=y)`` (x, y bf16 [4, 7168]) and
  of ``torch.empty((4, 7168), dtype=torch.float8_e4m3fn, device=x.device)``, measured beside each
  op: ``ROUNDS`` interleaved rounds of (add, empty, the op), each ``host_us`` of ``BATCHES``
  batches, the median of the rounds for each of the three (this host's speed drifts by 30-50 %
  over a run, so a budget measured once at the start and end judged ops by when they ran);
  ratio = host (idle) / budget; met: <= 1;
* device us/call: GPU time per call of 100 calls queued behind a GPU sleep, then run back to back
  (CUDA events around them); a row whose idle host time is below 1.1x that is marked
  "device-bound": the GPU sets the pace of its batches, so its "host" time includes launches
  into a non-empty queue (e.g. a kernel that reads more than the host time's worth of bytes);
* kernels/call: device kernels per call, from torch.profiler (CUDA activity) over a few calls
  after all the timing (memsets and memcpys named apart);
* host us minus n x empty: the op's own overhead, without its allocations.

Sizes: 4 tokens, hidden 7168, DeepSeek-V3 routing (256 experts, 8 groups, top-4 groups, top-8),
engram hc_mult 4.  An op that cannot run at 4 tokens runs at its smallest valid size and its row
says why.  In-place ops run on inputs where calling again is valid (idempotent, or accumulating).
Without a CUDA GPU: one line, exit 0.  Exit 1 when an op raised (its row holds the error); a
missed budget does not change the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

import torch

from _common import env_facts, env_markdown, host_us, markdown_table, write_reports

T, H, EXPERTS, GROUPS, TOPK_GROUPS, TOPK, HC = 4, 7168, 256, 8, 4, 8, 4
EPS, CLAMP = 1e-20, 1e-6
CHANNEL_TOKENS = 128  # swiglu per-channel cast: the token count must be a multiple of 128
SLOTS = T * TOPK + EXPERTS * 15  # get_fused_mapping at alignment 16: every entry plus the padding
KERNEL_CALLS = 5  # calls per profiler session (kernels/call = kernels seen / calls)
FAMILIES = ("quant", "moe", "transpose", "engram")
Op = tuple[str, Callable[[Any, SimpleNamespace], Any]]  # (the call in words, fn(module, inputs))


# ------------------------------------------------------------------ inputs, one namespace per family
def _e4m3(rows: int, cols: int):
    return torch.randn(rows, cols, device="cuda").clamp(-448, 448).to(torch.float8_e4m3fn)


def _quant_inputs(q) -> SimpleNamespace:
    bf16, dev = torch.bfloat16, "cuda"
    rows = T * TOPK  # the backward: 4 tokens x top-8 expanded rows, every row routed
    p2t = torch.randperm(rows, device=dev).to(torch.int32)
    ttp = torch.empty(rows, dtype=torch.int32, device=dev)
    ttp[p2t.long()] = torch.arange(rows, dtype=torch.int32, device=dev)
    return SimpleNamespace(
        x=torch.randn(T, H, device=dev, dtype=bf16), data=_e4m3(T, H),
        sf=torch.rand(T, H // 128, device=dev) + 0.01, block_sf=torch.rand(1, H // 128, device=dev) + 0.01,
        packed=torch.randint(-128, 128, (T, H // 2), dtype=torch.int8, device=dev),
        pow2=torch.exp2(torch.randint(-8, 8, (T, H // 32), device=dev).float()),
        x2=torch.randn(T, 2 * H, device=dev, dtype=bf16),
        x2_128=torch.randn(CHANNEL_TOKENS, 2 * H, device=dev, dtype=bf16),
        bwd_x=(_e4m3(rows, 2 * H), torch.rand(rows, 2 * H // 128, device=dev) + 0.01),
        grad_out=torch.randn(rows, H, device=dev, dtype=bf16), weight=torch.rand(T, TOPK, device=dev) + 0.01,
        p2t=p2t, ttp=ttp.view(T, TOPK))


def _moe_inputs(moe) -> SimpleNamespace:
    topk_idx = torch.rand((T, EXPERTS), device="cuda").topk(TOPK, dim=-1).indices.contiguous()
    mapping = moe.get_fused_mapping(topk_idx, EXPERTS, 0, 16)  # the trimmed maps (one host sync, here only)
    group_idx = topk_idx // (EXPERTS // GROUPS)
    return SimpleNamespace(
        scores=torch.randn(T, EXPERTS, device="cuda"), bias=torch.randn(EXPERTS, device="cuda"),
        topk_idx=topk_idx, group_idx=group_idx, unique_idx=group_idx.clone(),
        weights=torch.rand(T, TOPK, device="cuda") + 0.01, pte=mapping[0], ttp=mapping[3],
        x=torch.randn(T, H, device="cuda", dtype=torch.bfloat16),
        xq=(_e4m3(T, H), torch.rand(T, H // 128, device="cuda") + 0.01),
        expanded=torch.randn(mapping[0].shape[0], H, device="cuda", dtype=torch.bfloat16))


def _transpose_inputs(_) -> SimpleNamespace:
    return SimpleNamespace(x=torch.randn(T, H, device="cuda", dtype=torch.bfloat16),
                           x3=torch.randn(1, T, H, device="cuda", dtype=torch.bfloat16))


def _engram_inputs(eg) -> SimpleNamespace:
    bf = lambda *s: torch.randn(*s, device="cuda").bfloat16()  # noqa: E731
    x, k, v, go, wh, we = bf(T, HC, H), bf(T, HC, H), bf(T, H), bf(T, HC, H), bf(HC, H), bf(HC, H)
    wf = eg.fused_weight(wh, we)
    stats = tuple(eg.engram_gate_fwd(x, k, v, wf, EPS, CLAMP)[1:])
    sizes = torch.randint(100000, 1000000, (2, 2, 8), dtype=torch.int32, device="cuda")
    return SimpleNamespace(
        x=x, k=k, v=v, go=go, wh=wh, we=we, wf=wf, stats=stats,
        gwp=eg.engram_gate_bwd(go, x, k, v, wf, *stats, CLAMP)[3], gh=torch.zeros_like(wf), ge=torch.zeros_like(wf),
        ids=torch.randint(0, 100000, (T, 3), dtype=torch.int32, device="cuda"),
        mul=torch.randint(0, 100000, (2, 3), dtype=torch.int64, device="cuda"), sizes=sizes,
        offs=torch.cumsum(sizes.view(2, -1).long(), 1).sub(sizes.view(2, -1)).int())


INPUTS = {"quant": _quant_inputs, "moe": _moe_inputs, "transpose": _transpose_inputs, "engram": _engram_inputs}

# ------------------------------------------------------------------ the row builders: family -> op -> (call, fn)
_X, _PAIR = "x bf16 [4, 7168], 'e4m3'", "(e4m3 [4, 7168], sf fp32 [4, 56])"
OPS: dict[str, dict[str, Op]] = {
    "quant": {
        "per_token_cast": (f"{_X}, 128", lambda q, a: q.per_token_cast(a.x, "e4m3", 128)),
        "per_token_cast_with_precomputed_sf": (
            f"{_X}, 128, sf fp32 [4, 56]", lambda q, a: q.per_token_cast_with_precomputed_sf(a.x, "e4m3", 128, a.sf)),
        "per_token_cast_with_sf_only": (f"{_X}, 128", lambda q, a: q.per_token_cast_with_sf_only(a.x, "e4m3", 128)),
        "cast_back": (f"{_PAIR}, 'bf16', (1, 128)", lambda q, a: q.cast_back((a.data, a.sf), "bf16", (1, 128))),
        "per_token_cast_back": (f"{_PAIR}, 'bf16', 128",
                                lambda q, a: q.per_token_cast_back((a.data, a.sf), "bf16", 128)),
        "unpack_from_e2m1fn_x2": ("int8 [4, 3584], torch.bfloat16",
                                  lambda q, a: q.unpack_from_e2m1fn_x2(a.packed, torch.bfloat16)),
        "per_block_cast": (f"{_X}, (128, 128)", lambda q, a: q.per_block_cast(a.x, "e4m3", (128, 128))),
        "per_block_cast_lossless": (
            "(e2m1x2 int8 [4, 3584], pow2 sf [4, 224]), 'e4m3', (1, 32), (1, 128), round_sf=True",
            lambda q, a: q.per_block_cast_lossless((a.packed, a.pow2), "e4m3", (1, 32), (1, 128), round_sf=True)),
        "per_block_cast_with_precomputed_sf": (
            f"{_X}, (128, 128), sf fp32 [1, 56]",
            lambda q, a: q.per_block_cast_with_precomputed_sf(a.x, "e4m3", (128, 128), a.block_sf)),
        "per_block_cast_with_sf_only": (f"{_X}, (128, 128)",
                                        lambda q, a: q.per_block_cast_with_sf_only(a.x, "e4m3", (128, 128))),
        "per_channel_cast": (f"{_X}, 128", lambda q, a: q.per_channel_cast(a.x, "e4m3", 128)),
        "per_channel_cast_and_transpose": (f"{_X}, 128",
                                           lambda q, a: q.per_channel_cast_and_transpose(a.x, "e4m3", 128)),
        "per_channel_cast_fused": (f"{_X}, 128", lambda q, a: q.per_channel_cast_fused(a.x, "e4m3", 128)),
        "swiglu_forward_and_per_token_cast": ("x bf16 [4, 14336], 'e4m3', 128",
                                              lambda q, a: q.swiglu_forward_and_per_token_cast(a.x2, "e4m3", 128)),
        "swiglu_forward_and_per_channel_cast_and_transpose": (
            "x bf16 [128, 14336], 'e4m3', 128",
            lambda q, a: q.swiglu_forward_and_per_channel_cast_and_transpose(a.x2_128, "e4m3", 128)),
        "swiglu_backward_and_per_token_cast": (
            "(e4m3 [32, 14336], sf [32, 112]), grad_out bf16 [32, 7168], weight [4, 8], pos_to_token_topk, "
            "token_topk_to_pos (4 tokens x top-8), 128",
            lambda q, a: q.swiglu_backward_and_per_token_cast(a.bwd_x, a.grad_out, a.weight, a.p2t, a.ttp, 128)),
    },
    "moe": {
        "top2_sum_gate": ("logits fp32 [4, 256], bias [256], 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1, 'sigmoid'",
                          lambda m, a: m.top2_sum_gate(a.scores, a.bias, TOPK, TOPK_GROUPS, GROUPS, False, 0, 2.5,
                                                       0, 1, 0, 1, "sigmoid")),
        "topk_gate": ("scores fp32 [4, 256], 8", lambda m, a: m.topk_gate(a.scores, TOPK)),
        "topk_sum_and_topk_group_idx": ("scores fp32 [4, 8, 32], 2, 4", lambda m, a: m.topk_sum_and_topk_group_idx(
            a.scores.view(T, GROUPS, -1), 2, TOPK_GROUPS)),
        "aux_fi": ("topk_idx int64 [4, 8], 256, 8", lambda m, a: m.aux_fi(a.topk_idx, EXPERTS, TOPK)),
        "group_count": ("group_idx int64 [4, 8] (topk_idx // 32), 8", lambda m, a: m.group_count(a.group_idx, GROUPS)),
        "inplace_unique_group_indices": (
            "a copy of group_idx int64 [4, 8], 8 (in place and idempotent: every call is a valid call)",
            lambda m, a: m.inplace_unique_group_indices(a.unique_idx, GROUPS)),
        "mask_indices_by_tp": ("topk_idx, 256, 8, 0, 2",
                               lambda m, a: m.mask_indices_by_tp(a.topk_idx, EXPERTS, 8, 0, 2)),
        "normalize_weight": ("weights fp32 [4, 8]", lambda m, a: m.normalize_weight(a.weights)),
        "get_fused_mapping": (f"topk_idx, 256, {SLOTS} slots, 16 (slots given: no host sync)",
                              lambda m, a: m.get_fused_mapping(a.topk_idx, EXPERTS, SLOTS, 16)),
        "expand_to_fused": ("x bf16 [4, 7168], token_topk_to_pos, pos_to_expert (alignment 16)",
                            lambda m, a: m.expand_to_fused(a.x, a.ttp, a.pte)),
        "expand_to_fused_with_sf": (f"{_PAIR}, 128, token_topk_to_pos, pos_to_expert",
                                    lambda m, a: m.expand_to_fused_with_sf(a.xq, 128, a.ttp, a.pte)),
        "reduce_fused": ("expanded bf16 [slots, 7168], weights fp32 [4, 8], token_topk_to_pos",
                         lambda m, a: m.reduce_fused(a.expanded, a.weights, a.ttp)),
    },
    "transpose": {
        "transpose": ("x bf16 [4, 7168]", lambda tr, a: tr.transpose(a.x)),
        "batched_transpose": ("x bf16 [1, 4, 7168]", lambda tr, a: tr.batched_transpose(a.x3)),
    },
    "engram": {
        "engram_hash": ("ids int32 [4, 3], multipliers int64 [2, 3], vocab_sizes int32 [2, 2, 8], offsets [2, 16]",
                        lambda e, a: e.engram_hash(a.ids, a.mul, a.sizes, a.offs)),
        "fused_weight": ("weight_hidden, weight_embed bf16 [4, 7168]", lambda e, a: e.fused_weight(a.wh, a.we)),
        "engram_gate_fwd": ("x, k bf16 [4, 4, 7168], v [4, 7168], weight_fused fp32 [4, 7168], 1e-20, 1e-6, "
                            "save_for_backward=True",
                            lambda e, a: e.engram_gate_fwd(a.x, a.k, a.v, a.wf, EPS, CLAMP, True)),
        "engram_gate_bwd": ("grad_out bf16 [4, 4, 7168], x, k, v, weight_fused, the forward's 4 stats, 1e-6",
                            lambda e, a: e.engram_gate_bwd(a.go, a.x, a.k, a.v, a.wf, *a.stats, CLAMP)),
        "grad_w_reduce": ("grad_w_partial fp32 [SMs, 4, 7168], weights bf16 [4, 7168], grad_weight_* fp32 [4, 7168] "
                          "(accumulated in place: every call is a valid call)",
                          lambda e, a: e.grad_w_reduce(a.gwp, a.wh, a.we, a.gh, a.ge)),
    },
}
# ops measured at another size than 4 tokens, and why (the row's label says it)
NOT_AT_4 = {"quant.swiglu_forward_and_per_channel_cast_and_transpose":
            "128 tokens: the op needs a token count that is a multiple of 128"}


def missing_ops() -> list[str]:
    """The names in ``tilebin.ops.<family>.__all__`` without a row builder in ``OPS``: always empty
    when it returns.  Raises LookupError naming the missing (and the stale) names otherwise.  Needs
    ``tilebin`` importable, not a GPU."""
    missing, stale = [], []
    for family, table in OPS.items():
        names = set(importlib.import_module(f"tilebin.ops.{family}").__all__)
        missing += [f"{family}.{n}" for n in sorted(names - set(table))]
        stale += [f"{family}.{n}" for n in sorted(set(table) - names)]
    if missing or stale:
        raise LookupError(f"bench_op_budget: no row builder for {missing or 'none'}; builders for names not in "
                          f"__all__: {stale or 'none'}; add (or drop) their entries in OPS in {__file__}")
    return missing


# ------------------------------------------------------------------ measuring
@dataclass
class Row:
    op: str  # "quant.per_token_cast"
    call: str  # the arguments in words
    fn: Callable[[], Any] | None = None
    idle: float = 0.0
    busy: float = 0.0
    n: int = 0
    kernels: str = ""
    error: str = ""
    add_us: float = 0.0  # the budget's parts, measured beside this op
    empty_us: float = 0.0
    device: float = 0.0  # GPU time per call, back to back (CUDA events)


def _tensors(value: Any) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, SimpleNamespace):
        value = list(vars(value).values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def allocated_outputs(result: Any, inputs: SimpleNamespace) -> int:
    """Distinct storages among the tensors in ``result``, storages of ``inputs`` left out; a zero-byte
    tensor (address 0) counts by itself."""
    taken = {t.untyped_storage().data_ptr() for t in _tensors(inputs)}
    fresh: set[int] = set()
    empty = 0
    for t in _tensors(result):
        ptr = t.untyped_storage().data_ptr()
        if ptr == 0:
            empty += 1
        elif ptr not in taken:
            fresh.add(ptr)
    return len(fresh) + empty


ROUNDS, BATCHES = 5, 8  # interleaved rounds of (add, empty, op) per op; host_us batches of 50 calls each


def measure(row: Row, module: Any, inputs: SimpleNamespace, fn: Callable, parts: tuple) -> None:
    """Fill ``row``: one call (outputs counted, errors surfaced by a sync), then idle host us in
    ``ROUNDS`` rounds interleaved with the budget's ``parts`` (add, empty), then busy host us."""
    row.fn = lambda: fn(module, inputs)
    try:
        row.n = allocated_outputs(row.fn(), inputs)
        torch.cuda.synchronize()
        times: list[list[float]] = [[], [], []]
        for _ in range(ROUNDS):
            for k, f in enumerate((*parts, row.fn)):
                times[k].append(host_us(f, batches=BATCHES))
        row.add_us, row.empty_us, row.idle = (statistics.median(t) for t in times)
        row.busy = busy_us(row.fn)
        row.device = device_us(row.fn)
    except Exception as exc:  # one broken op must not hide the others' numbers
        row.fn, row.error = None, f"error: {exc!r}"[:300]


def device_us(fn: Callable[[], Any], calls: int = 100) -> float:
    """GPU time per call of ``calls`` calls back to back: CUDA events around them, all queued behind
    a GPU sleep (40M cycles, >= 20 ms: longer than the host takes to queue them), so the GPU runs
    them with no gap waiting on the host.  Where the host time per call (batches of 50) is not clearly above it, the
    GPU, not the host, sets the pace of a batch: the launches then land in a non-empty queue and the
    "GPU idle" host time is no longer a host-only figure (the row is marked device-bound)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(40_000_000)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def busy_us(fn: Callable[[], Any], batches: int = 15) -> float:
    """``host_us``'s busy setting, one batch of 50 calls per GPU sleep and a sync between batches
    (median of ``batches``): back to back, 30 sleeps and an op of several kernels would fill the
    launch queue, and the host would then wait on the GPU inside the timed batches."""
    return statistics.median(host_us(fn, batches=1, busy=True) for _ in range(batches))


def kernels_per_call(fn: Callable[[], Any], calls: int = KERNEL_CALLS) -> tuple[float, int]:
    """(kernels per call, memsets + memcpys per call) on the device, from one torch.profiler session."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")
             and not getattr(e, "is_user_annotation", False)]
    copies = sum(n.startswith(("Memset", "Memcpy", "memset", "memcpy")) for n in names)
    return (len(names) - copies) / calls, copies // calls


def count_kernels(rows: list[Row], add: Callable[[], Any]) -> str:
    """Fill each row's ``kernels`` (after all timing: the profiler stays out of the timed loops);
    returns what the profiler saw of ``torch.add`` (expected: 1 kernel per call).  When it sees
    fewer (a first session may miss events: tried twice), the column says "n/a"."""
    probe = kernels_per_call(add)[0]
    if probe < 1:
        probe = kernels_per_call(add)[0]
    for row in rows:
        if row.fn is None:
            continue
        try:
            k, copies = kernels_per_call(row.fn) if probe >= 1 else (-1, 0)
            row.kernels = "n/a" if k < 0 else f"{k:g}" + (f" + {copies} memset/memcpy" if copies else "")
        except Exception as exc:  # the profiler, not the op (it ran before): say so, keep the row
            row.kernels = f"profiler error: {exc!r}"[:120]
    return f"{probe:g}"


def budget_parts() -> tuple[Callable[[], Any], Callable[[], Any]]:
    """torch eager ``torch.add(x, 1, out=y)`` and one output's ``torch.empty``, x, y bf16 [4, 7168]."""
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    return (lambda: torch.add(x, 1, out=y),
            lambda: torch.empty((T, H), dtype=torch.float8_e4m3fn, device=x.device))


# ------------------------------------------------------------------ report
HEADERS = ["op", "host us/call, GPU idle", "host us/call, GPU busy", "allocated outputs n",
           "budget us (add + n x empty, measured beside the op)", "ratio host/budget", "met", "kernels/call", "host us minus n x empty",
           "device us/call (back to back)", "call"]


def table_row(row: Row) -> list:
    label = row.op + (f" ({NOT_AT_4[row.op]})" if row.op in NOT_AT_4 else "")
    if row.error:
        return [label, row.error, "", "", "", "", "", "", "", "", row.call]
    add_us, empty_us = row.add_us, row.empty_us
    budget = add_us + row.n * empty_us
    ratio = row.idle / budget
    return [label, f"{row.idle:.2f}", f"{row.busy:.2f}", row.n, f"{budget:.2f}", f"{ratio:.2f}",
            "yes" if ratio <= 1 else "**NO**", row.kernels, f"{row.idle - row.n * empty_us:.2f}",
            f"{row.device:.2f}" + (" (device-bound)" if row.idle < 1.1 * row.device else ""), row.call]


def report(rows: list[Row], parts: dict, facts: dict, probe: str) -> tuple[str, list]:
    table = [table_row(r) for r in rows]
    ok = [(r.idle / (r.add_us + r.n * r.empty_us), r.op) for r in rows if not r.error]
    met = sum(ratio <= 1 for ratio, _ in ok)
    worst = max(ok, default=(float("nan"), "none"))
    errors = sum(bool(r.error) for r in rows)
    md = ("### host time of every tilebin.ops call at 4 tokens vs issue 10's budget\n\n" + env_markdown(facts) + "\n\n"
          f"Budget parts (GPU idle), measured beside each op ({ROUNDS} interleaved rounds of add, empty, op; "
          f"medians): torch.add(x, 1, out=y) {parts['add'][0]:.2f}-{parts['add'][1]:.2f} us over the rows, "
          f"torch.empty((4, 7168), fp8) {parts['empty'][0]:.2f}-{parts['empty'][1]:.2f} us. "
          f"Profiler check: torch.add launches {probe} kernel(s) per call. Sizes: {T} tokens, hidden {H}, "
          f"{EXPERTS} experts, {GROUPS} groups, top-{TOPK}, engram hc_mult {HC}. "
          f"CPU affinity: {facts.get('cpu_affinity', 'not pinned')}.\n\n")
    md += markdown_table(HEADERS, table)
    md += (f"\n\n**{met} of {len(ok)} ops met the budget**; worst ratio {worst[0]:.2f} ({worst[1]})"
           + (f"; {errors} op(s) raised (see their rows)" if errors else "") + ".")
    return md, table


def run(families: list[str]) -> tuple[list[Row], dict, str]:
    """Every op's host time beside the budget's parts, then kernel counts."""
    add, empty = budget_parts()
    rows = []
    for family in families:
        module = importlib.import_module(f"tilebin.ops.{family}")
        try:
            torch.manual_seed(0)
            inputs, setup_error = INPUTS[family](module), ""
        except Exception as exc:  # every row of the family says why
            inputs, setup_error = None, f"error: building the {family} inputs failed: {exc!r}"[:300]
        for name, (call, fn) in OPS[family].items():
            row = Row(f"{family}.{name}", call, error=setup_error)
            if inputs is not None:
                measure(row, module, inputs, fn, (add, empty))
            rows.append(row)
            print(f"{row.op}: {row.error or f'{row.idle:.2f} us idle, {row.busy:.2f} us busy, n={row.n}'}", flush=True)
    done = [r for r in rows if not r.error] or [Row("", "", add_us=float("nan"), empty_us=float("nan"))]
    parts = {"add": (min(r.add_us for r in done), max(r.add_us for r in done)),
             "empty": (min(r.empty_us for r in done), max(r.empty_us for r in done))}
    return rows, parts, count_kernels(rows, add)


def _pin(core: int) -> str:
    """Pin this process to ``core`` (no migrations between cores of different speed mid-run);
    what was done, in words."""
    if core < 0:
        return "not pinned (--core -1)"
    allowed = os.sched_getaffinity(0)
    if core not in allowed:
        return f"not pinned (core {core} is not among this process's cores {sorted(allowed)})"
    os.sched_setaffinity(0, {core})
    return f"pinned to core {core}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--md")
    ap.add_argument("--json")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated: " + ", ".join(FAMILIES))
    ap.add_argument("--core", type=int, default=2,
                    help="the CPU core the process is pinned to (as bench_host_ab's children); -1: not pinned")
    ns = ap.parse_args()
    families = [f for f in ns.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        ap.error(f"--families {ns.families!r}: unknown {unknown}; choose from {', '.join(FAMILIES)}")
    missing_ops()
    try:
        gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken CUDA set-up is no GPU
        gpu = False
    if not gpu:
        print("bench_op_budget: skipped, no CUDA GPU visible (needs torch with CUDA and an H100/H200)")
        return 0
    facts = env_facts()
    facts["cpu_affinity"] = _pin(ns.core)
    rows, parts, probe = run(families)
    md, table = report(rows, parts, facts, probe)
    write_reports({"facts": facts, "budget_parts": parts, "profiler_torch_add_kernels": probe, "headers": HEADERS,
                   "rows": table}, md, ns.json, ns.md)
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
