"""8 threads launching at once, each with its own tensors and torch stream, many iterations.

Half the threads use the module-level ``runtime.launch``, half a fresh ``Registry`` over the
installed artifacts, so first-use module loading races too (all threads start at a barrier).
Even threads rely on torch's current stream, odd ones pass ``stream=`` explicitly.  Every
iteration refills the inputs, poisons the outputs, launches and compares on the device;
mismatch counts are summed on the device and read once at the end.
"""

from __future__ import annotations

import threading
import time
import traceback

import pytest

torch = pytest.importorskip("torch")

from _cases import CASE_KERNEL, make_case  # noqa: E402
from _gpu_util import Rng  # noqa: E402

pytestmark = pytest.mark.gpu
THREAD_KINDS = ("transpose_bf16", "transpose_fp8", "gemm_small", "pdl_chain",
                "transpose_f32", "gemm_large", "coop_sum", "transpose_bf16")
ITERATIONS = 150


def _worker(i, launcher, kind, rt, nodeid, barrier, results):
    try:
        rng = Rng(nodeid, salt=i)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            case = make_case(kind, rng, rt)
            bad = torch.zeros((), dtype=torch.int64, device="cuda")
            barrier.wait(timeout=60)
            for _ in range(ITERATIONS):
                case.refill()
                case.poison()
                if i % 2:
                    case.launch(launcher, stream=stream)
                else:
                    case.launch(launcher)
                bad += case.mismatches()
        stream.synchronize()
        results[i] = (repr(case), int(bad))
    except BaseException:  # reported by the main thread with the traceback
        results[i] = ("exception", traceback.format_exc())
        barrier.abort()


def test_eight_threads(rt, artifacts_dir, require, request):
    for kind in set(THREAD_KINDS):
        require(CASE_KERNEL[kind])
    fresh = rt.Registry(artifacts_dir)
    barrier = threading.Barrier(len(THREAD_KINDS))
    results: dict[int, tuple] = {}
    threads = [threading.Thread(target=_worker, name=f"tb-{i}",
                                args=(i, rt if i < 4 else fresh, kind, rt, request.node.nodeid, barrier, results))
               for i, kind in enumerate(THREAD_KINDS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 240
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    torch.cuda.synchronize()
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running after 240 s: {alive}; finished: {results}"
    errors = {i: r[1] for i, r in results.items() if r[0] == "exception"}
    assert not errors, "thread exceptions:\n" + "\n".join(f"[thread {i}] {tb}" for i, tb in errors.items())
    wrong = {i: r for i, r in results.items() if r[1]}
    assert len(results) == len(THREAD_KINDS) and not wrong, (
        f"mismatching elements summed over {ITERATIONS} iterations per thread: {wrong}; all: {results}")
