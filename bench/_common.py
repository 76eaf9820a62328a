"""Shared by the benchmarks: environment facts, statistics, device timing, report writing.

Run the benchmarks as scripts (``python3 bench/bench_*.py``): ``sys.path[0]`` is then
``bench/``, never the checkout's root, so ``tilebin`` resolves to the installed wheel.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _pkg_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _nvidia_smi() -> dict:
    fields = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,pstate"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
        return dict(zip(fields.split(","), (v.strip() for v in out.split(","))))
    except Exception as exc:  # a fact we could not read is recorded as such
        return {"error": repr(exc)}


def env_facts() -> dict:
    """Date, GPU, driver, clocks, and the versions of python/torch/cuda-bindings/tilebin."""
    import torch

    facts: dict = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_bindings": _pkg_version("cuda-bindings"),
        "tilebin_dist": _pkg_version("tilebin"),
        "nvidia_smi": _nvidia_smi(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        facts.update(gpu=p.name, sm_count=p.multi_processor_count, capability=f"{p.major}.{p.minor}",
                     l2_bytes=getattr(p, "L2_cache_size", None), gpu_mem_bytes=p.total_memory)
    try:
        from cuda.bindings import driver

        facts["cuDriverGetVersion"] = driver.cuDriverGetVersion()[1]
    except Exception as exc:
        facts["cuDriverGetVersion"] = repr(exc)
    facts.update(_tilebin_facts())
    return facts


def _tilebin_facts() -> dict:
    try:
        import tilebin
        from tilebin import runtime

        manifest = artifacts_dir() / "manifest.json"
        build = json.loads(manifest.read_text()).get("build", {})
        inside = Path(runtime.__file__).resolve().is_relative_to(REPO)
        return {"tilebin": tilebin.__version__, "tilebin_runtime_file": runtime.__file__,
                "tilebin_from_checkout": inside, "manifest_build": build}
    except Exception as exc:
        return {"tilebin": f"not importable: {exc!r}"}


def artifacts_dir() -> Path:
    import importlib.resources

    return Path(str(importlib.resources.files("tilebin") / "_artifacts"))


def summary(values: list[float]) -> dict:
    s = sorted(values)
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))]  # noqa: E731
    return {"median": statistics.median(s), "min": s[0], "p10": q(0.10), "p90": q(0.90), "n": len(s)}


def time_device_ms(fns, rounds: int, per_round: int, backlog_cycles: int = 4_000_000) -> dict:
    """Per-call device time (ms) with CUDA events around each call.

    Each round first queues a GPU sleep, so the host enqueues the whole round before the GPU
    reaches it: no launch gaps inside the timed regions.  The sleep is at least
    ``backlog_cycles`` and long enough to cover the round's host time, measured first (an
    autograd backward spends 100-200 us of host time per call; a fixed 4M-cycle sleep, 2 ms,
    ran out during a round of 20 and the events then timed the host).  ``fns`` are rotated
    through (pass several buffers so the working set exceeds the L2).
    """
    import time

    import torch

    for fn in fns:  # warm-up (a JIT peer compiles here), then one timed pass of host time per call
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for fn in fns:
        fn()
    host_s = (time.perf_counter() - t0) / len(fns)
    torch.cuda.synchronize()
    # cycles at 2.5 GHz (above the H200's 1.98 GHz boost clock) for the whole round, twice over;
    # at most 2.5e9 (1 s)
    backlog_cycles = max(backlog_cycles, min(int(2 * per_round * host_s * 2.5e9), 2_500_000_000))
    times = []
    for r in range(rounds):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(backlog_cycles)
        pairs = []
        for i in range(per_round):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fns[(r * per_round + i) % len(fns)]()
            e1.record()
            pairs.append((e0, e1))
        torch.cuda.synchronize()
        times += [e0.elapsed_time(e1) for e0, e1 in pairs]
    return summary(times)


_COPY_MS: dict = {}


def copy_ms(buffer_bytes: int) -> float:
    """Device ms of torch ``copy_`` of a ``buffer_bytes`` buffer (at least 1 MiB; cached per size;
    timed like the ops: ``time_device_ms``, 5 rounds x 20)."""
    import torch

    n = max(buffer_bytes, 1 << 20)
    if n not in _COPY_MS:
        a, b = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
        _COPY_MS[n] = time_device_ms([lambda: b.copy_(a)], rounds=5, per_round=20)["median"]
        del a, b
    return _COPY_MS[n]


def pct_of_copy(moved: int, ms: float) -> tuple[float, float]:
    """``(same traffic, double traffic)``: an op that moves ``moved`` bytes (reads + writes) in
    ``ms``, as % of torch ``copy_``'s GB/s (a) when the copy moves the same bytes (a buffer of
    ``moved / 2`` read and written: both pay one launch, ramp and tail on equal traffic) and
    (b) on a buffer of ``moved`` bytes (twice the traffic: the figure of the tables before
    2026-12-02 12:00 UTC, which favours the copy by half its fixed cost per call)."""
    def copy_rate(buffer_bytes: int) -> float:  # bytes per ms, reads + writes
        return 2 * max(buffer_bytes, 1 << 20) / copy_ms(buffer_bytes)

    rate = moved / ms
    return 100 * rate / copy_rate(moved // 2), 100 * rate / copy_rate(moved)


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_reports(result: dict, md: str, json_path: str | None, md_path: str | None) -> None:
    """Print the markdown; write the JSON (with the markdown inside) and append the markdown."""
    result = {**result, "markdown": md}
    print(md, flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {json_path}")
    if md_path:
        with open(md_path, "a") as fh:
            fh.write(md + "\n\n")
        print(f"appended to {md_path}")


def env_markdown(facts: dict) -> str:
    smi = facts.get("nvidia_smi", {})
    return (f"{facts.get('date_utc')} · {facts.get('gpu')} ({facts.get('sm_count')} SMs) · driver "
            f"{smi.get('driver_version')} · SM clock {smi.get('clocks.sm')} (max {smi.get('clocks.max.sm')}) · "
            f"torch {facts.get('torch')} · cuda-bindings {facts.get('cuda_bindings')} · tilebin "
            f"{facts.get('tilebin')} ({facts.get('tilebin_runtime_file')})")


def host_us(fn, batch: int = 50, batches: int = 30, busy: bool = False) -> float:
    """Host wall time per call of ``fn`` (median over batches of the per-call mean), in us.

    Default: a sync before each batch and tiny inputs, so the GPU keeps up and the launch
    queue stays short (what bench_launch measures).  ``busy=True``: each batch is queued
    behind a GPU sleep instead, so every launch lands in a non-empty queue.
    """
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(batches):
        if busy:
            torch.cuda._sleep(20_000_000)
        else:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        out.append((time.perf_counter_ns() - t0) / batch / 1e3)
    torch.cuda.synchronize()
    return statistics.median(out)


def with_attr(obj, attr: str, value, call):
    """A function running ``call()`` with ``obj.<attr>`` set to ``value`` (restored after): how the
    benches switch an op module's kernel constant to a speed candidate."""

    def run():
        old = getattr(obj, attr)
        setattr(obj, attr, value)
        try:
            return call()
        finally:
            setattr(obj, attr, old)

    return run
