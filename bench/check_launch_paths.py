#!/usr/bin/env python3
"""On a GPU: the compiled hot path and the pure-Python Launcher launch the same thing.

    PYTHONPATH=<site with the tilebin wheel> python3 bench/check_launch_paths.py [--json F]

Runs the same seeded calls (runtime.launch / prepare / unchecked launchers, and tilebin.ops
quant and moe ops at 4 and 4001 tokens) once per hot path, each in its own process
(``TILEBIN_HOT_PATH=c`` and ``=python``).  Every driver launch is recorded on its way to the
driver -- entry, grid, block, shared memory, and the bytes of every kernel argument -- and every
output is hashed.  The two processes must agree on all of it.  Pointer and TMA-descriptor
arguments hold addresses, which differ between processes, so they are compared by size only
(tests/runtime compares them byte for byte against a stubbed driver).  Exit status 0 when the
paths agree and the compiled one was really used.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r'''
import ctypes, hashlib, json, sys
import torch
from tilebin import runtime as rt
from tilebin.runtime import _driver, _launcher, _loader

records, kinds = [], {}  # kinds: int(function handle) -> (entry, [argument kinds])
real_function = _loader.Loader.function

def function(self, kernel, variant, entry, smem, dev):
    fn = real_function(self, kernel, variant, entry, smem, dev)
    ln = next(ln for ln in variant.launches if ln.entry == entry)
    kinds[int(fn.handle)] = (entry, [a.kind for a in ln.args])
    return fn

_loader.Loader.function = function

def record(fn, grid, block, smem, address):
    entry, arg_kinds = kinds[int(fn)]
    params = (ctypes.c_void_p * max(len(arg_kinds), 1)).from_address(address) if arg_kinds else []
    args = [ctypes.string_at(params[j], 8).hex() if k == "scalar" else f"<{k}>" for j, k in enumerate(arg_kinds)]
    records.append([entry, list(grid), list(block), int(smem), args])

mod = _driver.driver()
if rt.hot_path() == "c":  # the compiled path calls these addresses: record, then forward to the driver
    launch, launch_ex, get, set_ = _driver.entry_points()
    L = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_void_p)
    LX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    real_l, real_lx = L(launch), LX(launch_ex)
    def rec_l(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        record(fn, (gx, gy, gz), (bx, by, bz), smem, params)
        return real_l(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra)
    def rec_lx(cfg, fn, params, extra):
        u = (ctypes.c_uint * 7).from_address(cfg)
        record(fn, tuple(u[0:3]), tuple(u[3:6]), u[6], params)
        return real_lx(cfg, fn, params, extra)
    keep = (L(rec_l), LX(rec_lx))
    _driver._STATE["entry_points"] = (ctypes.cast(keep[0], ctypes.c_void_p).value,
                                      ctypes.cast(keep[1], ctypes.c_void_p).value, get, set_)
# the Python twin calls cuda-python's functions (also for calls the compiled path hands over): wrap them
real_drive = _launcher.Launcher._drive
def drive(self, i, fn, grid, stream, address):
    ln = self.layout.launches[i]
    record(fn, grid, ln.block, ln.smem, address)
    return real_drive(self, i, fn, grid, stream, address)
_launcher.Launcher._drive = drive
handed_over = []  # calls the compiled path gave to the twin (unusual values; errors)
for slow in ("_slow_call", "_slow_run"):
    def counting(self, *a, _real=getattr(_launcher.Launcher, slow), _name=slow):
        handed_over.append(f"{self.where} ({_name})")
        return _real(self, *a)
    setattr(_launcher.Launcher, slow, counting)

def digest(obj):
    if isinstance(obj, torch.Tensor):
        torch.cuda.synchronize()
        return hashlib.sha256(obj.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]
    if isinstance(obj, (tuple, list)):
        return [digest(o) for o in obj]
    return repr(obj)

def cases():
    from tilebin.ops import moe, quant
    g = torch.Generator(device="cuda").manual_seed(1234)
    bf = lambda *s: torch.randn(*s, device="cuda", generator=g).to(torch.bfloat16)
    x, out = bf(1, 32, 64), torch.empty(1, 64, 32, device="cuda", dtype=torch.bfloat16)
    a, b, c = bf(70, 1024), bf(1024, 1024), torch.empty(70, 1024, device="cuda", dtype=torch.bfloat16)
    xf, yf, zf = (torch.randn(5000, device="cuda", generator=g) for _ in range(3))
    yield "launch transpose", lambda: (rt.launch("transpose.batched_transpose", x, out), out)[1]
    yield "prepare transpose", lambda: (rt.prepare("transpose.batched_transpose", x, out)(), out)[1]
    yield "unchecked transpose", lambda: (rt.unchecked_launcher("transpose.batched_transpose",
                                                                dtype="bfloat16", small=False)(x, out), out)[1]
    yield "launch gemm (TMA, cluster, PDL)", lambda: (rt.launch("testing.gemm_nt", a, b, c), c)[1]
    yield "launch pdl_chain", lambda: (rt.launch("testing.pdl_chain", xf, yf, zf), (yf, zf))[1]
    for tokens in (4, 4001):
        h = bf(tokens, 7168)
        scores = torch.randn(tokens, 256, device="cuda", generator=g)
        weights = torch.rand(tokens, 8, device="cuda", generator=g) + 0.1
        idx = torch.randint(-1, 64, (tokens, 8), device="cuda", generator=g)
        yield f"quant.per_token_cast e4m3 {tokens}", lambda h=h: quant.per_token_cast(h, "e4m3", 128)
        yield f"quant.per_token_cast e2m1 {tokens}", lambda h=h: quant.per_token_cast(
            h, "e2m1", 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
        yield f"quant.per_block_cast {tokens}", lambda h=h: quant.per_block_cast(h, "e4m3", (128, 128))
        yield f"moe.topk_gate {tokens}", lambda s=scores: moe.topk_gate(s, 8)
        yield f"moe.normalize_weight {tokens}", lambda w=weights: moe.normalize_weight(w)
        yield f"moe.group_count (cooperative when large) {tokens}", lambda i=idx: moe.group_count(i, 64)

result = {"hot_path": rt.hot_path(), "cases": {}}
for name, call in cases():
    start = len(records)
    try:
        outputs = digest(call())
    except Exception as exc:
        outputs = f"error: {type(exc).__name__}: {exc}"
    result["cases"][name] = {"launches": records[start:], "outputs": outputs, "handed_over": handed_over[:]}
    handed_over.clear()
print("RESULT " + json.dumps(result))
'''


def run_child(path: str) -> dict:
    with tempfile.TemporaryDirectory() as cwd:
        env = {**os.environ, "TILEBIN_HOT_PATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
        p = subprocess.run([sys.executable, "-c", _CHILD], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=900)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode or line is None:
        raise SystemExit(f"{path} child failed (rc={p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return json.loads(line[7:])


def compare(c: dict, py: dict) -> list[str]:
    problems = []
    if c["hot_path"] != "c":
        problems.append(f"TILEBIN_HOT_PATH=c ran the {c['hot_path']} path: the extension did not load")
    for name, want in py["cases"].items():
        got = c["cases"].get(name)
        if got is None:
            problems.append(f"{name}: missing in the compiled run")
            continue
        if got["outputs"] != want["outputs"]:
            problems.append(f"{name}: outputs differ: c {got['outputs']} python {want['outputs']}")
        if got["launches"] != want["launches"]:
            problems.append(f"{name}: launches differ:\n  c      {got['launches']}\n  python {want['launches']}")
        if not want["launches"] and not str(want["outputs"]).startswith("error"):
            problems.append(f"{name}: nothing was recorded (the recorder missed the launch)")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    args = ap.parse_args()
    c, py = run_child("c"), run_child("python")
    problems = compare(c, py)
    for name, case in c["cases"].items():
        print(f"{name:48s} launches {len(case['launches'])}  outputs {str(case['outputs'])[:60]}"
              + (f"  handed to the twin: {case['handed_over']}" if case["handed_over"] else ""))
    print("\n".join(problems) if problems else f"OK: both paths agree on {len(c['cases'])} cases")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"c": c, "python": py, "problems": problems}, f, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
