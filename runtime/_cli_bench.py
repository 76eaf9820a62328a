"""``tilebin bench``: host and device time per call of a few ops (needs a GPU and torch; runtime/_cli.py)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from . import _cli, _settings
from ._cli import PROG, _emit, _table
from ._errors import ArgumentError, DeviceError
from ._registry import load_manifest


def _bench_cases(torch: Any, names: Any) -> list[tuple[str, str, Callable[[], Any]]]:
    from . import launch
    cases = []
    if "quant.per_token_cast" in names:
        quant = _cli._outside("tilebin.ops.quant")
        x = torch.randn(4096, 7168, dtype=torch.bfloat16, device="cuda")
        cases.append(("per_token_cast", "[4096, 7168] bf16 -> e4m3", lambda: quant.per_token_cast(x, "e4m3", 128)))
    if "moe.topk_gate" in names:
        moe = _cli._outside("tilebin.ops.moe")
        s = torch.randn(4096, 256, dtype=torch.float32, device="cuda")
        cases.append(("topk_gate", "[4096, 256] f32, top 8", lambda: moe.topk_gate(s, 8)))
    if SMOKE_KERNEL in names:
        t = torch.randn(8, 1024, 1024, dtype=torch.bfloat16, device="cuda")
        o = torch.empty_like(t)
        cases.append(("batched_transpose", "[8, 1024, 1024] bf16", lambda: launch(SMOKE_KERNEL, t, o)))
    return cases


def _time(torch: Any, fn: Callable[[], Any], iters: int) -> tuple[float, float]:
    """(host µs per call, device µs per call) over ``iters`` back-to-back calls after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t0) / iters * 1e6
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end) / iters * 1e3


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        torch = _cli._outside("torch")
        ok, why = torch.cuda.is_available(), f"torch {torch.__version__} sees no GPU"
    except ImportError:
        ok, why = False, 'torch is not installed (pip install "tilebin[torch]")'
    if not ok:
        raise DeviceError(f"bench needs a CUDA GPU and torch with CUDA, but {why}; `{PROG} doctor` says what is "
                          "missing")
    if args.iters < 1:
        raise ArgumentError(f"--iters {args.iters}: give a positive number of timed calls")
    man = load_manifest(_settings.artifacts_dir())
    rows, data = [("OP", "SHAPE", "HOST us/call", "DEVICE us/call")], []
    for op, shape, fn in _bench_cases(torch, man.kernels):
        host, dev = _time(torch, fn, args.iters)
        rows.append((op, shape, f"{host:.1f}", f"{dev:.1f}"))
        data.append({"op": op, "shape": shape, "host_us": host, "device_us": dev})
    name = torch.cuda.get_device_name()
    text = f"{name}, {args.iters} calls each\n" + _table(rows)
    _emit(args, {"device": name, "iters": args.iters, "ops": data}, text)
    return 0
