#!/usr/bin/env python3
"""Device time, bandwidth and host cost of the mHC ops (``tilebin.modeling.mhc.ops``), with
tile_kernels' side by side.

    PYTHONPATH=<site with the tilebin wheel>[:<folder with tile_kernels + tilelang>] \\
        python3 bench/bench_mhc.py [--json F] [--md F] [--no-peer] [--candidate]

Two tables:

* device time (CUDA events, median of 5 rounds x 20 calls, each round queued behind a GPU
  sleep: ``_common.time_device_ms``), GB/s of the bytes the op must move (inputs read + outputs
  written, the op's own gradient buffers included) and % of torch ``copy_``'s GB/s when it
  moves the same bytes (``_common.pct_of_copy``; next to it the earlier tables' figure, a copy of
  twice the traffic), at leading dims ``(1, n1)`` with n1 {4096, 8192} x hidden {4096, 7168},
  mhc_mult 4.  Backward rows time ``torch.autograd.grad`` through the op's autograd Function
  (its kernels plus the gradient buffers it allocates; the host side hides behind the queued
  sleep), for tilebin and tile_kernels alike.  With tile_kernels importable (as
  bench_engram.py loads it), its time on the same inputs is in the last column (warmed up
  first: it JIT-compiles).
* host us per call at 4 tokens, hidden 7168 (``_common.host_us``), tilebin and tile_kernels.

``--candidate`` adds a row "<op> (candidate <tag>)" after each op per speed candidate kernel
(``CANDIDATES``): the candidate launched directly (``tilebin.runtime.unchecked_launcher``) with
the arguments and variant key the shipped op passes its kernel, its output allocated per call as
the op does; same inputs, bytes and timing; its tile_kernels column repeats the op's.
``--only-candidates`` keeps only those ops' rows (and no host table).

Every op of the nine mHC op modules has rows; an op whose module is missing from the installed
tilebin is skipped with the reason printed.  Exit status 1 when a tilebin row could not be
measured (the other rows are still reported).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from _common import env_facts, env_markdown, host_us, markdown_table, pct_of_copy, time_device_ms, write_reports

M = 4
SHAPES = [(n1, h) for n1 in (4096, 8192) for h in (4096, 7168)]
# op row label -> its speed candidates, one row each "<op> (candidate <tag>)": {tag: (kernel, variant key)}
# (issue 9); the call: _candidate_call (expand, pre_apply_mix, post and head-mix forwards, multilayer
# recompute).  Round 3's post_fwd pair and head_compute_mix_fwd hoist, round 5's recompute ring2 and round
# 6's recompute i2s2 shipped, the rest were dropped (H200, 2026-12-02 12:00-14:14 UTC; kernels/README.md).
CANDIDATES: dict = {}
MODULES = ("expand", "pre_apply_mix", "post", "head_compute_mix", "sinkhorn", "pre_split_mixes",
           "multilayer_recompute", "norm_fn", "pre_big_fuse")


def _nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def load_ours() -> dict:
    """``{module: tilebin.modeling.mhc.ops.<module>}`` for the modules the installed tilebin has."""
    mods = {}
    for name in MODULES:
        try:
            mods[name] = importlib.import_module(f"tilebin.modeling.mhc.ops.{name}")
        except Exception as exc:
            print(f"skipping tilebin.modeling.mhc.ops.{name}: not importable ({exc!r})", flush=True)
    return mods


def load_peer():
    """tile_kernels' ``modeling.mhc.ops`` package, or None (with the reason printed)."""
    try:
        import tilelang.backend.target as target  # tile_kernels 1.0.0 imports the old module path

        sys.modules.setdefault("tilelang.utils.target", target)
        from tile_kernels.modeling.mhc import ops as peer
        return peer
    except Exception as exc:  # no peer on this machine: tilebin's rows only
        print(f"tile_kernels not importable ({exc!r}): no side-by-side column", flush=True)
        return None


def _grad_fn(fn, inputs, grads):
    """A call that runs the backward of ``fn(*inputs)`` (graph built once, kept) for ``grads``."""
    import torch

    out = fn()
    outs = out if isinstance(out, tuple) else (out,)
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
    return lambda: torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], retain_graph=True,
                                       allow_unused=True)


def _inputs(n1: int, hidden: int):
    import torch

    lead = (1, n1)
    k = M * hidden
    r = torch.randn(*lead, M, hidden, device="cuda").bfloat16()
    x = torch.randn(*lead, hidden, device="cuda").bfloat16()
    g_r = torch.randn_like(r)
    g_x = torch.randn_like(x)
    pre = torch.rand(*lead, M, 1, device="cuda")
    post = torch.rand(*lead, M, 1, device="cuda") * 2
    comb = torch.rand(*lead, M, M, device="cuda")
    mixes = torch.randn(*lead, M * (M + 2), device="cuda")
    fn = torch.randn(M * (M + 2), k, device="cuda") * k ** -0.5
    scale = torch.tensor([0.5, 0.7, 1.3], device="cuda")
    base = torch.randn(M * (M + 2), device="cuda") * 0.1
    return dict(lead=lead, r=r, x=x, g_r=g_r, g_x=g_x, pre=pre, post=post, comb=comb, mixes=mixes, fn=fn,
                scale=scale, base=base)


def _recompute_call(fn, r, lists: tuple):
    """The multilayer recompute candidate's call: the op's pointer table (rows pre_mix,
    layer_input, layer_output, post_mix, comb_mix, residual; padded to the layer count) copied to
    the device per call from pinned memory, as the op does, then the launch."""
    import torch

    pre, l_in, outs, post, comb, res = lists
    layers, mhc, hidden = len(pre), r.shape[-2], r.shape[-1]
    table = [t.data_ptr() for row in (pre, l_in, outs, post, comb, res) for t in row]  # one per layer each

    def call():
        host = torch.tensor(table, dtype=torch.int64, pin_memory=True)
        ptrs = host.to(r.device, non_blocking=True).view(6, layers)
        fn(r.view(-1, mhc, hidden), ptrs, len(outs))
    return call


def _candidate_call(label: str, tag: str, t: dict, lists: tuple | None = None):
    """The call of ``label``'s candidate kernel ``tag`` on the inputs ``t`` (and, for multilayer
    recompute, its tensor lists): the launch the shipped op makes (same views, same variant key),
    the output allocated per call as the op does."""
    import torch

    from tilebin import runtime

    kernel, key = CANDIDATES[label][tag]
    fn = runtime.unchecked_launcher(kernel, **key)
    r, x, pre, post, comb = t["r"], t["x"], t["pre"], t["post"], t["comb"]
    mhc, hidden = r.shape[-2:]
    if lists is not None:
        return _recompute_call(fn, r, lists)
    if label == "mhc_head_compute_mix fwd":
        head_in, head_scale, head_base = (v.detach() for v in t["head"])

        def call():
            out = torch.empty(head_in.shape, dtype=torch.float32, device=head_in.device)
            fn(head_in.view(-1, mhc), head_scale, head_base, out.view(-1, mhc), 1e-6)
            return out
    elif label == "expand_to_mhc fwd":
        def call():
            out = torch.empty(r.shape, dtype=torch.bfloat16, device=x.device)
            fn(x.view(-1, hidden), out.view(-1, mhc, hidden))
            return out
    elif label == "mhc_pre_apply_mix fwd":
        def call():
            out = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
            fn(r.view(-1, mhc, hidden), pre.view(-1, mhc), out.view(-1, hidden))
            return out
    else:  # mhc_post_fwd
        def call():
            out = torch.empty(r.shape, dtype=torch.bfloat16, device=x.device)
            fn(x.view(-1, hidden), r.view(-1, mhc, hidden), post.view(-1, mhc), comb.view(-1, mhc, mhc),
               out.view(-1, mhc, hidden))
            return out
    return call


def rows_for(ours: dict, peer, n1: int, hidden: int, candidate: bool = False):
    """``[(label, module, tilebin call or None, peer call or None, bytes moved)]`` at one shape;
    calls are built lazily (a failing builder becomes an error row)."""
    import torch

    t = _inputs(n1, hidden)
    lead, r, x, g_r, g_x = t["lead"], t["r"], t["x"], t["g_r"], t["g_x"]
    pre, post, comb, mixes, fn, scale, base = (t[k] for k in ("pre", "post", "comb", "mixes", "fn", "scale", "base"))
    tokens = n1
    rg = r.clone().requires_grad_()
    xg = x.clone().requires_grad_()
    preg, postg, combg = (v.clone().requires_grad_() for v in (pre, post, comb))
    mixg = mixes.clone().requires_grad_()
    head_in = torch.randn(*lead, M, device="cuda").requires_grad_()
    head_scale, head_base = torch.tensor([0.8], device="cuda").requires_grad_(), torch.zeros(M, device="cuda").requires_grad_()
    t["head"] = (head_in, head_scale, head_base)
    f32 = 4

    def both(name, build):
        """(tilebin call, peer call): ``build(namespace)`` on tilebin's module and on tile_kernels'."""
        mine = (lambda: build(ours[name])) if name in ours else None
        theirs = (lambda: build(peer)) if peer is not None else None
        return mine, theirs

    rows = []

    def add(label, name, build, moved, lists=None):
        mine, theirs = both(name, build)
        rows.append((label, name, mine, theirs, moved))
        for tag in CANDIDATES.get(label, {}) if candidate else ():
            cand = (lambda tag=tag: _candidate_call(label, tag, t, lists)) if name in ours else None
            rows.append((f"{label} (candidate {tag})", name, cand, theirs, moved))

    add("expand_to_mhc fwd", "expand", lambda m: (lambda: m.expand_to_mhc(x, M)), _nbytes(x, r))
    add("expand_to_mhc bwd", "expand",
        lambda m: _grad_fn(lambda: m.expand_to_mhc(xg, M), [xg], [g_r]), _nbytes(g_r, x))
    add("mhc_pre_apply_mix fwd", "pre_apply_mix", lambda m: (lambda: m.mhc_pre_apply_mix(r, pre)), _nbytes(r, pre, x))
    add("mhc_pre_apply_mix bwd", "pre_apply_mix",
        lambda m: _grad_fn(lambda: m.mhc_pre_apply_mix(rg, preg), [rg, preg], [g_x]),
        _nbytes(g_x, r, pre) + _nbytes(r, pre))
    add("mhc_post_fwd", "post", lambda m: (lambda: m.mhc_post_fwd(x, r, post, comb)), _nbytes(x, r, post, comb, r))
    add("mhc_post_bwd", "post", lambda m: (lambda: m.mhc_post_bwd(x, r, post, comb, g_r, fuse_grad_acc=False)),
        _nbytes(g_r, x, r, post, comb) + _nbytes(x, r, post, comb))
    add("mhc_head_compute_mix fwd", "head_compute_mix",
        lambda m: (lambda: m.mhc_head_compute_mix(head_in.detach(), head_scale.detach(), head_base.detach(), 1e-6)),
        2 * tokens * M * f32)
    add("mhc_head_compute_mix bwd", "head_compute_mix",
        lambda m: _grad_fn(lambda: m.mhc_head_compute_mix(head_in, head_scale, head_base, 1e-6),
                           [head_in, head_scale, head_base], [torch.ones_like(head_in)]),
        3 * tokens * M * f32)
    add("sinkhorn_normalize fwd", "sinkhorn", lambda m: (lambda: m.sinkhorn_normalize(comb, 10, 1e-6)),
        2 * _nbytes(comb))
    add("sinkhorn_normalize bwd", "sinkhorn",
        lambda m: _grad_fn(lambda: m.sinkhorn_normalize(combg, 10, 1e-6), [combg], [torch.ones_like(comb)]),
        3 * _nbytes(comb))
    add("mhc_pre_split_mixes fwd", "pre_split_mixes",
        lambda m: (lambda: m.mhc_pre_split_mixes(mixes, scale, base, M, 1.0, 1e-6)),
        _nbytes(mixes) + _nbytes(pre, post, comb))
    add("mhc_pre_split_mixes bwd", "pre_split_mixes",
        lambda m: _grad_fn(lambda: m.mhc_pre_split_mixes(mixg, scale, base, M, 1.0, 1e-6), [mixg],
                           [torch.ones_like(pre), torch.ones_like(post), torch.ones_like(comb)]),
        2 * _nbytes(mixes) + _nbytes(pre, post, comb))
    add("mhc_pre_norm_fn fwd", "norm_fn", lambda m: (lambda: m.mhc_pre_norm_fn(r, fn, None, 1e-6, False)),
        _nbytes(r, fn, mixes))
    fng = fn.clone().requires_grad_()
    add("mhc_pre_norm_fn bwd", "norm_fn",
        lambda m: _grad_fn(lambda: m.mhc_pre_norm_fn(rg, fng, None, 1e-6, False), [rg, fng], [torch.ones_like(mixes)]),
        _nbytes(mixes, r, fn) + _nbytes(r, fn))
    add("mhc_pre_big_fuse", "pre_big_fuse",
        lambda m: (lambda: m.mhc_pre_big_fuse(r, fn, scale, base, 1e-6, 1e-6, 1e-6, 1.0, 10)),
        _nbytes(r, fn) + _nbytes(x, post, comb))
    layers = 2
    outs = [torch.randn_like(x) for _ in range(layers)]
    l_in = [torch.empty_like(x) for _ in range(layers)]
    res = [torch.empty_like(r) for _ in range(layers)]
    add(f"mhc_multilayer_recompute ({layers} layers)", "multilayer_recompute",
        lambda m: (lambda: m.mhc_multilayer_recompute(r, [pre] * layers, outs, [post] * layers, [comb] * layers,
                                                      l_in, res)),
        _nbytes(r) + layers * _nbytes(x, pre, post, comb) + layers * _nbytes(x, r),
        ([pre] * layers, l_in, outs, [post] * layers, [comb] * layers, res))
    return rows


def _peer_us(build) -> str:
    if build is None:
        return "n/a"
    try:
        fn = build()
        fn()  # JIT-compiles on first use
        return f"{time_device_ms([fn], rounds=5, per_round=20)['median'] * 1e3:.1f}"
    except Exception as exc:
        return f"error: {exc!r}"[:120]


def device_table(ours: dict, peer, candidate: bool = False, only_candidates: bool = False) -> tuple[list, bool]:
    out, ok = [], True
    for n1, hidden in SHAPES:
        for label, name, mine, theirs, moved in rows_for(ours, peer, n1, hidden, candidate):
            if only_candidates and label.split(" (candidate ")[0] not in CANDIDATES:
                continue
            if mine is None:
                row = [label, n1, hidden, f"skipped: tilebin.modeling.mhc.ops.{name} missing", "", ""]
            else:
                try:
                    fn = mine()
                    fn()
                    ms = time_device_ms([fn], rounds=5, per_round=20)["median"]
                    gbps = moved / (ms * 1e-3) / 1e9
                    row = [label, n1, hidden, f"{ms * 1e3:.1f}", f"{gbps:.0f}",
                           *(f"{p:.1f}" for p in pct_of_copy(moved, ms))]
                except Exception as exc:
                    ok = False
                    row = [label, n1, hidden, f"error: {exc!r}"[:160], "", "", ""]
            row.append(_peer_us(theirs))
            out.append(row)
            print(" | ".join(map(str, row)), flush=True)
    return out, ok


def host_table(ours: dict, peer) -> tuple[list, bool]:
    out, ok = [], True
    for label, name, mine, theirs, _ in rows_for(ours, peer, 4, 7168):
        if mine is None:
            out.append([label, "skipped", "n/a"])
            continue
        try:
            fn = mine()
            row = [label, f"{host_us(fn):.1f}"]
        except Exception as exc:
            ok = False
            row = [label, f"error: {exc!r}"[:160]]
        try:
            row.append(f"{host_us(theirs()):.1f}" if theirs is not None else "n/a")
        except Exception as exc:
            row.append(f"error: {exc!r}"[:120])
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
    facts = env_facts()
    ours = load_ours()
    peer = None if ns.no_peer else load_peer()
    dev_rows, ok_dev = device_table(ours, peer, ns.candidate, ns.only_candidates)
    host_rows, ok_host = ([], True) if ns.only_candidates else host_table(ours, peer)
    md = "### tilebin.modeling.mhc.ops\n\n" + env_markdown(facts) + "\n\n"
    md += f"mhc_mult {M}, leading dims (1, n1); peer: {'tile_kernels' if peer else 'not installed'}.\n\n"
    md += markdown_table(["op", "n1", "hidden", "device us", "GB/s", "% copy (same traffic)", "% copy (2x traffic)",
                          "tile_kernels us"],
                         dev_rows) + "\n\n"
    md += markdown_table(["op (4 tokens, hidden 7168)", "host us/call", "tile_kernels us"], host_rows)
    write_reports({"facts": facts, "device": dev_rows, "host": host_rows}, md, ns.json, ns.md)
    return 0 if ok_dev and ok_host else 1


if __name__ == "__main__":
    sys.exit(main())
