"""CUDA graphs (capture on torch's current stream, change inputs in place, replay) and streams
(an explicit ``stream=`` in each accepted form, and torch's current stream by default).

Stream tests make the target stream busy (``torch.cuda._sleep``) before refilling the inputs
and poisoning the outputs on it: a launch that went to any other stream would run during the
sleep, and the poison queued after it would show up in the check.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from _cases import CASE_KERNEL, CASE_KINDS, TRANSPOSE, make_case  # noqa: E402

pytestmark = pytest.mark.gpu
SLEEP_CYCLES = 20_000_000  # ~10 ms at 2 GHz, longer while clocks ramp up


def _busy(stream) -> None:
    if hasattr(torch.cuda, "_sleep"):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(SLEEP_CYCLES)


@pytest.mark.parametrize("kind", CASE_KINDS)
def test_graph_capture_replay(rt, rng, require, kind):
    require(CASE_KERNEL[kind])
    case = make_case(kind, rng, rt)
    case.poison()
    case.launch(rt)
    case.check("eager warm-up")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        case.launch(rt)
    for rep in range(3):
        case.refill()
        case.poison()
        g.replay()
        torch.cuda.synchronize()
        case.check(f"graph replay {rep}, inputs changed in place")


def test_graph_with_every_kernel(rt, rng, require):
    """One graph holding every case back to back, replayed twice with new inputs."""
    for kernel in set(CASE_KERNEL.values()):
        require(kernel)
    cases = [make_case(k, rng, rt) for k in CASE_KINDS]
    for c in cases:
        c.launch(rt)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in cases:
            c.launch(rt)
    for rep in range(2):
        for c in cases:
            c.refill()
            c.poison()
        g.replay()
        torch.cuda.synchronize()
        for c in cases:
            c.check(f"multi-kernel graph replay {rep}")


_FIRST_LAUNCH_IN_CAPTURE = textwrap.dedent("""
    import torch
    from tilebin import runtime
    x = torch.randn(2, 70, 130, device="cuda").to(torch.bfloat16)
    out = torch.full((2, 130, 70), float("nan"), device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        runtime.launch("transpose.batched_transpose", x, out)  # the process's first launch
    x.copy_(torch.randn(2, 70, 130, device="cuda").to(torch.bfloat16))
    g.replay()
    torch.cuda.synchronize()
    bad = int((out.view(torch.int16) != x.transpose(1, 2).contiguous().view(torch.int16)).sum())
    print("MISMATCHES", bad)
    raise SystemExit(1 if bad else 0)
""")


def test_first_launch_inside_capture(rt, require, tmp_path):
    """Lazy module loading must not break a capture that holds a process's very first launch."""
    require(TRANSPOSE)
    proc = subprocess.run([sys.executable, "-c", _FIRST_LAUNCH_IN_CAPTURE], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"


def _stream_handle(form: str, s):
    if form == "torch":
        return s
    if form == "int":
        return s.cuda_stream
    from cuda.bindings import driver

    return driver.CUstream(s.cuda_stream)


@pytest.mark.parametrize("form", ["torch", "int", "custream"])
@pytest.mark.parametrize("kind", ["transpose_bf16", "gemm_small", "coop_sum", "pdl_chain"])
def test_explicit_stream(rt, rng, require, kind, form):
    require(CASE_KERNEL[kind])
    case = make_case(kind, rng, rt)
    s = torch.cuda.Stream()
    handle = _stream_handle(form, s)
    case.launch(rt, stream=handle)  # warm-up: module load outside the timed-ordering check
    torch.cuda.synchronize()
    _busy(s)
    with torch.cuda.stream(s):
        case.refill()
        case.poison()
    case.launch(rt, stream=handle)  # torch's current stream is the default one here
    s.synchronize()
    torch.cuda.synchronize()
    case.check(f"launched with stream={form} while that stream was busy")


@pytest.mark.parametrize("kind", ["transpose_fp8", "gemm_small", "coop_sum", "pdl_chain"])
def test_current_torch_stream_by_default(rt, rng, require, kind):
    require(CASE_KERNEL[kind])
    case = make_case(kind, rng, rt)
    case.launch(rt)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    _busy(s)
    with torch.cuda.stream(s):
        case.refill()
        case.poison()
        case.launch(rt)  # no stream=: must go to s
    torch.cuda.synchronize()
    case.check("launched inside torch.cuda.stream(s) while s was busy")
