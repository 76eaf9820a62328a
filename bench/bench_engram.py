#!/usr/bin/env python3
"""Device time, bandwidth and host cost of the ``tilebin.ops.engram`` ops (and tile_kernels' side by side).

    PYTHONPATH=<site with the tilebin wheel>[:<folder with tile_kernels + tilelang>] \\
        python3 bench/bench_engram.py [--json F] [--md F] [--no-peer] [--candidate]

Two tables:

* device time (CUDA events, median of 5 rounds x 20 calls, each round queued behind a GPU
  sleep), GB/s of the bytes the op must move (inputs read + outputs written; in-place tensors
  twice) and % of torch ``copy_``'s GB/s when it moves the same bytes (``_common.pct_of_copy``;
  next to it the earlier tables' figure, a copy of twice the traffic), at 4001 / 8001 tokens x
  hidden 4096 / 7168, hc_mult 4 (engram_hash: 2 layers, 3-grams, 8 tables; grad_w_reduce: one
  partial row per SM).  Buffers rotate so the working set exceeds the L2 where the op's is small.
  With tile_kernels importable (see ../shared/NOTES.md for carrying it to the device), its
  kernel's time on the same inputs is in the next column (warmed up first: it JIT-compiles).
* host us per call at 4 tokens (``_common.host_us``), next to the torch eager reference of the
  same op (fp32 math, ``tests/engram_ref``) and tile_kernels' call when importable.

``--candidate`` adds a row "<op> (<candidate>)" after each op that has speed candidate kernels
(``CANDIDATES``): the candidate launched directly (``runtime.unchecked_launcher``) with the
arguments the op passes its shipped kernel, its outputs allocated as the op allocates them, on
the same inputs, timed the same way, with the same bytes; its tile_kernels column repeats the
op's.  ``--only-candidates`` keeps just those ops' rows (shipped and candidates), no host table.

Exit status 1 when a tilebin row could not be measured (the other rows are still reported).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import (REPO, env_facts, env_markdown, host_us, markdown_table, pct_of_copy, time_device_ms,
                     write_reports)

HC, EPS, CLAMP = 4, 1e-20, 1e-6
SHAPES = [(t, h) for t in (4001, 8001) for h in (4096, 7168)]
# op (row label up to " (") -> its speed candidates: (row label suffix, internal kernel name)
# (the round-3 candidates halfbar / halfbar_split / halfbar_split_early were dropped after the 12:05 UTC
# 2026-12-02 H200 run: kernels/README.md)
CANDIDATES: dict = {}


def _nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def load_peer():
    """tile_kernels' engram module, or None (with the reason printed)."""
    try:
        import tilelang.backend.target as target  # tile_kernels 1.0.0 imports the old module path

        sys.modules.setdefault("tilelang.utils.target", target)
        from tile_kernels import engram as peer
        return peer
    except Exception as exc:  # no peer on this machine: tilebin's rows only
        print(f"tile_kernels not importable ({exc!r}): no side-by-side column", flush=True)
        return None


def _inputs(tokens: int, hidden: int, sets: int = 1):
    import torch

    def one():
        x = torch.randn(tokens, HC, hidden, device="cuda").bfloat16()
        k = torch.randn(tokens, HC, hidden, device="cuda").bfloat16()
        v = torch.randn(tokens, hidden, device="cuda").bfloat16()
        go = torch.randn(tokens, HC, hidden, device="cuda").bfloat16()
        return x, k, v, go
    wh, we = (torch.randn(HC, hidden, device="cuda").bfloat16() for _ in range(2))
    return [one() for _ in range(sets)], wh, we


def _gate_bwd_launch(kernel: str, go, x, k, v, wf, stats):
    """A call of ``kernel`` as ``ops/engram/_gate.py``'s ``_plan_bwd`` launches engram.engram_gate_bwd
    (fresh outputs each call, ``grad_w_partial`` with ``get_num_sms()`` rows, scalars clamp and
    hidden**-0.5)."""
    import torch
    from tilebin import runtime
    from tilebin.ops.config import get_num_sms

    fn = runtime.unchecked_launcher(kernel)
    tokens, hc, hidden = x.shape
    scalars = (CLAMP, hidden ** -0.5)

    def call():
        grad_x = torch.empty((tokens, hc, hidden), dtype=torch.bfloat16, device=x.device)
        grad_k = torch.empty((tokens, hc, hidden), dtype=torch.bfloat16, device=x.device)
        grad_v = torch.empty((tokens, hidden), dtype=torch.bfloat16, device=x.device)
        grad_w_partial = torch.empty((get_num_sms(x.device), hc, hidden), dtype=torch.float32, device=x.device)
        fn(go, x, k, v, wf, *stats, grad_x, grad_k, grad_v, grad_w_partial, *scalars)
        return grad_x, grad_k, grad_v, grad_w_partial

    return call


def with_candidates(rows: list, launches: dict) -> list:
    """``rows`` with a "<label> (<candidate>)" row after each op in ``CANDIDATES`` (same inputs and
    bytes, ``launches[op](kernel)`` the candidate's call, the peer calls repeated)."""
    out = []
    for label, fns, peer_fns, moved in rows:
        out.append((label, fns, peer_fns, moved))
        op = label.split(" (")[0]
        for suffix, kernel in CANDIDATES.get(op, ()):
            out.append((f"{label} ({suffix})", [launches[op](kernel)], peer_fns, moved))
    return out


def rows_for(eg, peer, tokens: int, hidden: int, candidate: bool = False):
    """(label, tilebin fn list, peer fn list or None, bytes moved per call) at one shape; with
    ``candidate``, each op's candidate rows after its own (:func:`with_candidates`)."""
    import torch
    from tilebin.ops.config import get_num_sms

    sets, wh, we = _inputs(tokens, hidden)
    x, k, v, go = sets[0]
    wf = eg.fused_weight(wh, we)
    out, *stats = eg.engram_gate_fwd(x, k, v, wf, EPS, CLAMP)
    gwp = eg.engram_gate_bwd(go, x, k, v, wf, *stats, CLAMP)[3]
    parts = [torch.randn_like(gwp) for _ in range(max(1, (64 << 20) // _nbytes(gwp)))]  # > L2
    gh, ge = torch.zeros_like(wf), torch.zeros_like(wf)
    ids = torch.randint(0, 100000, (tokens, 3), dtype=torch.int32, device="cuda")
    mul = torch.randint(0, 100000, (2, 3), dtype=torch.int64, device="cuda")
    sizes = torch.randint(100000, 1000000, (2, 2, 8), dtype=torch.int32, device="cuda")
    offs = torch.cumsum(sizes.view(2, -1).long(), 1).sub(sizes.view(2, -1)).int()
    hashed = eg.engram_hash(ids, mul, sizes, offs)
    rows = [
        ("engram_hash (2 layers, 3-gram, 8 tables)", [lambda: eg.engram_hash(ids, mul, sizes, offs)],
         peer and [lambda: peer.engram_hash(ids, mul, sizes, offs)], _nbytes(ids, mul, sizes, offs, hashed)),
        ("fused_weight", [lambda: eg.fused_weight(wh, we)], peer and [lambda: peer.fused_weight(wh, we)],
         _nbytes(wh, we, wf)),
        ("engram_gate_fwd save", [lambda: eg.engram_gate_fwd(x, k, v, wf, EPS, CLAMP, True)],
         peer and [lambda: peer.engram_gate_fwd(x, k, v, wf, EPS, CLAMP, True)], _nbytes(x, k, v, wf, out, *stats)),
        ("engram_gate_fwd no save", [lambda: eg.engram_gate_fwd(x, k, v, wf, EPS, CLAMP, False)],
         peer and [lambda: peer.engram_gate_fwd(x, k, v, wf, EPS, CLAMP, False)], _nbytes(x, k, v, wf, out)),
        ("engram_gate_bwd", [lambda: eg.engram_gate_bwd(go, x, k, v, wf, *stats, CLAMP)],
         peer and [lambda: peer.engram_gate_bwd(go, x, k, v, wf, *stats, CLAMP)],
         _nbytes(go, x, k, v, wf, *stats) + _nbytes(x, k, v, gwp)),
        (f"grad_w_reduce ({get_num_sms()} rows)", [lambda p=p: eg.grad_w_reduce(p, wh, we, gh, ge) for p in parts],
         peer and _peer_reduce(peer, parts, wh, we, gh, ge), _nbytes(gwp, wh, we) + 2 * _nbytes(gh, ge)),
    ]
    if candidate:
        launches = {"engram_gate_bwd": lambda kernel: _gate_bwd_launch(kernel, go, x, k, v, wf, stats)}
        rows = with_candidates(rows, launches)
    return rows


def _peer_reduce(peer, parts, wh, we, gh, ge):
    if parts[0].shape[0] % 4:  # tile_kernels asserts a multiple of 4 partial rows
        return None
    return [lambda p=p: peer.grad_w_reduce(p, wh, we, gh, ge) for p in parts]


def device_table(eg, peer, candidate: bool = False, only_candidates: bool = False) -> tuple[list, bool]:
    out, ok = [], True
    for tokens, hidden in SHAPES:
        for label, fns, peer_fns, moved in rows_for(eg, peer, tokens, hidden, candidate):
            if only_candidates and label.split(" (")[0] not in CANDIDATES:
                continue
            try:
                fns[0]()  # a first call loads the kernel outside the timed rounds
                ms = time_device_ms(fns, rounds=5, per_round=20)["median"]
                gbps = moved / (ms * 1e-3) / 1e9
                row = [label, tokens, hidden, f"{ms * 1e3:.1f}", f"{gbps:.0f}",
                       *(f"{p:.1f}" for p in pct_of_copy(moved, ms))]
            except Exception as exc:
                ok = False
                row = [label, tokens, hidden, f"error: {exc!r}"[:160], "", "", ""]
            row.append(_peer_us(peer_fns))
            out.append(row)
            print(" | ".join(map(str, row)), flush=True)
    return out, ok


def _peer_us(fns) -> str:
    if not fns:
        return "n/a"
    try:
        for fn in fns:
            fn()  # JIT-compiles on first use
        return f"{time_device_ms(fns, rounds=5, per_round=20)['median'] * 1e3:.1f}"
    except Exception as exc:
        return f"error: {exc!r}"[:120]


def host_table(eg, peer) -> tuple[list, bool]:
    import torch

    sys.path.insert(1, str(REPO / "tests"))  # the torch references (never a tilebin module)
    from engram_ref import gate as ref
    from engram_ref import hash as href

    sets, wh, we = _inputs(4, 7168)
    x, k, v, go = sets[0]
    wf = eg.fused_weight(wh, we)
    stats = eg.engram_gate_fwd(x, k, v, wf, EPS, CLAMP)[1:]
    gwp = eg.engram_gate_bwd(go, x, k, v, wf, *stats, CLAMP)[3]
    gh, ge = torch.zeros_like(wf), torch.zeros_like(wf)
    ids = torch.randint(0, 100000, (4, 3), dtype=torch.int32, device="cuda")
    mul = torch.randint(0, 100000, (2, 3), dtype=torch.int64, device="cuda")
    sizes = torch.randint(100000, 1000000, (2, 2, 8), dtype=torch.int32, device="cuda")
    offs = href.make_offsets(sizes)
    f32 = torch.float32
    rows = [
        ("engram_hash", lambda m: m.engram_hash(ids, mul, sizes, offs), lambda: href.engram_hash(ids, mul, sizes, offs)),
        ("fused_weight", lambda m: m.fused_weight(wh, we), lambda: ref.fused_weight(wh, we)),
        ("engram_gate_fwd save", lambda m: m.engram_gate_fwd(x, k, v, wf, EPS, CLAMP, True),
         lambda: ref.gate_fwd(x, k, v, wf, EPS, CLAMP, f32)),
        ("engram_gate_bwd", lambda m: m.engram_gate_bwd(go, x, k, v, wf, *stats, CLAMP),
         lambda: ref.gate_bwd(go, x, k, v, wf, *stats, CLAMP, f32)),
        ("grad_w_reduce", lambda m: m.grad_w_reduce(gwp, wh, we, gh, ge),
         lambda: ref.grad_w_reduce(gwp, wh, we, gh, ge)),
    ]
    out, ok = [], True
    for label, call, eager in rows:
        try:
            row = [label, f"{host_us(lambda: call(eg)):.1f}", f"{host_us(eager):.1f}"]
        except Exception as exc:
            ok = False
            row = [label, f"error: {exc!r}"[:160], ""]
        peer_ok = peer is not None and not (label == "grad_w_reduce" and gwp.shape[0] % 4)
        row.append(f"{host_us(lambda: call(peer)):.1f}" if peer_ok else "n/a")
        out.append(row)
        print(" | ".join(map(str, row)), flush=True)
    return out, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--no-peer", action="store_true", help="skip tile_kernels even when importable")
    ap.add_argument("--candidate", action="store_true", help="add a row for each op's speed candidate kernel")
    ap.add_argument("--only-candidates", action="store_true",
                    help="with --candidate: only the ops that have a candidate, no host table")
    ns = ap.parse_args()
    from tilebin.ops import engram as eg

    facts = env_facts()
    peer = None if ns.no_peer else load_peer()
    dev_rows, ok_dev = device_table(eg, peer, ns.candidate, ns.only_candidates)
    host_rows, ok_host = ([], True) if ns.only_candidates else host_table(eg, peer)
    md = "### tilebin.ops.engram\n\n" + env_markdown(facts) + "\n\n"
    md += f"hc_mult {HC}, eps {EPS}, clamp {CLAMP}; peer: {'tile_kernels' if peer else 'not installed'}.\n\n"
    md += markdown_table(["op", "tokens", "hidden", "device us", "GB/s", "% copy (same traffic)", "% copy (2x traffic)",
                          "tile_kernels us"],
                         dev_rows) + "\n\n"
    md += markdown_table(["op (4 tokens, hidden 7168)", "host us/call", "torch eager ref us", "tile_kernels us"],
                         host_rows)
    write_reports({"facts": facts, "device": dev_rows, "host": host_rows}, md, ns.json, ns.md)
    return 0 if ok_dev and ok_host else 1


if __name__ == "__main__":
    sys.exit(main())
