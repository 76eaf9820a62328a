"""Several GPUs in one process (issue 15): every op and ``runtime.launch`` on the tensors' device,
whatever the current device; threads interleaving devices; CUDA graphs per device; the
cooperative kernels per device; no module loaded on a device the process never touches.

Each op call of the fuzz catalogue (``tests/fuzz_cases.py``, valid calls) is made once on the
first device as the reference, then on a copy of the same inputs (same storage bytes, offsets
and strides) on the other device while the current device is the first one, and the other way
round.  Results, and inputs an op mutates, must be equal bit for bit.

With one GPU the same tests run with both roles on ``cuda:0`` (the single-GPU run of the same
code); the tests that need two distinct devices skip and say so.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import fuzz_cases as F
from _gpu_util import assert_bits_equal

pytestmark = pytest.mark.gpu

TWO = torch.cuda.is_available() and torch.cuda.device_count() >= 2
NEEDS_TWO = pytest.mark.skipif(not TWO, reason="needs 2 CUDA devices (device kind nvidia-h200-x2); one is visible")
# (where the tensors live, the current device while calling)
ROLES = [(1, 0), (0, 1)] if TWO else [(0, 0)]
OPS = sorted(F.BUILDERS)


def copy_to(value, device: int):
    """``value`` with every tensor copied to ``cuda:<device>``: the whole storage (so offsets,
    strides, overlaps and alignment mod 16 are kept), recursively through tuples and lists."""
    if isinstance(value, torch.Tensor):
        raw = torch.empty(0, dtype=torch.uint8, device=value.device).set_(value.untyped_storage())
        moved = raw.to(f"cuda:{device}")
        out = torch.empty(0, dtype=value.dtype, device=moved.device)
        return out.set_(moved.untyped_storage(), value.storage_offset(), value.shape, value.stride())
    if isinstance(value, (tuple, list)):
        return type(value)(copy_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: copy_to(v, device) for k, v in value.items()}
    return value


def tensors_of(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in tensors_of(value[k])]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_of(v)]
    return []


def assert_same(got, want, what: str) -> None:
    got, want = tensors_of(got), tensors_of(want)
    assert len(got) == len(want), f"{what}: {len(got)} tensors, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert_bits_equal(g.cpu(), w.cpu(), f"{what}, tensor {i}")


def _valid_call(op: str, seed: int) -> F.Call:
    return F.build(op, random.Random(seed), "cuda:0")


@pytest.mark.parametrize("where, current", ROLES, ids=lambda r: str(r))
@pytest.mark.parametrize("op", OPS)
def test_op_on_the_tensors_device(op, where, current):
    for seed in range(3):
        call = _valid_call(op, seed)
        ref_args, ref_kwargs = copy_to(call.args, 0), copy_to(call.kwargs, 0)
        with torch.cuda.device(0):
            want = F.op_function(op)(*ref_args, **ref_kwargs)
        args, kwargs = copy_to(call.args, where), copy_to(call.kwargs, where)
        with torch.cuda.device(current):
            got = F.op_function(op)(*args, **kwargs)
        torch.cuda.synchronize(where)
        for t in tensors_of(got):
            assert t.device == torch.device(f"cuda:{where}"), f"{op}: an output is on {t.device}, want cuda:{where}"
        what = f"{call.describe()} on cuda:{where}, current cuda:{current}"
        assert_same(got, want, what)
        assert_same((args, kwargs), (ref_args, ref_kwargs), what + " (inputs after the call)")


@pytest.mark.parametrize("where, current", ROLES, ids=lambda r: str(r))
def test_runtime_launch_cooperative_on_the_tensors_device(rt, rng, require, where, current):
    from _cases import COOP_SUM, CoopSumCase

    require(COOP_SUM)
    with torch.cuda.device(where):  # the case allocates on the current device
        case = CoopSumCase(rng, 777_777, rt.spec(COOP_SUM))
    case.poison()
    with torch.cuda.device(current):
        assert case.launch(rt) is None
    torch.cuda.synchronize(where)
    assert case.x.device == torch.device(f"cuda:{where}")
    case.check(f"coop_sum on cuda:{where}, current cuda:{current}, seed={rng.seed}")


def test_threads_interleave_devices():
    """4 threads, each alternating devices call by call with no sync: every result bit-exact."""
    from tilebin.ops import quant

    devices = [0, 1] if TWO else [0]
    inputs = {d: [torch.randn((t, 2048), device=f"cuda:{d}").bfloat16() for t in (1, 33, 512)] for d in devices}
    want = {(d, i): quant.per_token_cast(x, "e4m3", 128) for d in devices for i, x in enumerate(inputs[d])}
    errors, results = [], {}

    def work(k: int) -> None:
        try:
            for step in range(30):
                d = devices[(k + step) % len(devices)]
                i = step % 3
                results[(k, step)] = (d, i, quant.per_token_cast(inputs[d][i], "e4m3", 128))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for d in devices:
        torch.cuda.synchronize(d)
    for (k, step), (d, i, got) in results.items():
        assert_same(got, want[(d, i)], f"thread {k} step {step} on cuda:{d}")


@pytest.mark.parametrize("device", [0, 1] if TWO else [0])
def test_cuda_graph_capture_on_each_device(device):
    from tilebin.ops import moe, quant

    dev = f"cuda:{device}"
    x = torch.randn((64, 1024), device=dev).bfloat16()
    logits = torch.randn((64, 256), device=dev)
    with torch.cuda.device(device):
        quant.per_token_cast(x, "e4m3", 128)  # warm: modules loaded before the capture
        moe.topk_gate(logits, 8)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            data, sf = quant.per_token_cast(x, "e4m3", 128)
            idx = moe.topk_gate(logits, 8)  # int64 [tokens, 8]: the indices only
    x.copy_(torch.randn_like(x, dtype=torch.float32).bfloat16())
    logits.copy_(torch.randn_like(logits))
    graph.replay()
    torch.cuda.synchronize(device)
    assert_same((data, sf), quant.per_token_cast(x, "e4m3", 128), f"per_token_cast replayed on {dev}")
    assert_same(idx, moe.topk_gate(logits, 8), f"topk_gate replayed on {dev}")


@pytest.mark.parametrize("device", [0, 1] if TWO else [0])
@pytest.mark.parametrize("tokens", [1, 4001])
def test_cooperative_ops_on_each_device(device, tokens):
    """get_fused_mapping, group_count and aux_fi (cooperative launches sized by the SM count) on
    each device, with that device's SM count, equal to the same calls on cuda:0."""
    from tilebin.ops import moe
    from tilebin.ops.config import get_num_sms

    gen = torch.Generator().manual_seed(tokens)
    idx0 = torch.randint(-1, 64, (tokens, 8), generator=gen).cuda(0)
    idx = idx0.to(f"cuda:{device}")
    with torch.cuda.device(0):  # the current device is not the tensors' (with two GPUs)
        assert get_num_sms(idx.device) == torch.cuda.get_device_properties(device).multi_processor_count
        for name, call in (("get_fused_mapping", lambda i: moe.get_fused_mapping(i, 64, i.numel() + 64 * 127, 128)),
                           ("group_count", lambda i: moe.group_count(i, 64)),
                           ("aux_fi", lambda i: moe.aux_fi(i, 64, 8))):
            got, want = call(idx), call(idx0)
            assert_same(got, want, f"{name} at {tokens} tokens on cuda:{device}")


@NEEDS_TWO
def test_tensors_on_two_devices_are_refused_before_any_launch():
    from tilebin.ops import quant
    from tilebin.runtime import ArgumentError

    x = torch.randn((4, 512), device="cuda:0").bfloat16()
    sf = torch.rand((4, 4), device="cuda:1") + 0.5
    with pytest.raises(ArgumentError, match="cuda:1.*cuda:0|cuda:0.*cuda:1"):
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, sf)


@NEEDS_TWO
def test_a_process_touching_only_cuda1_creates_no_context_on_cuda0():
    """Modules load lazily per device: a fresh process working only on cuda:1 leaves cuda:0's
    primary context inactive (no module, no memory there)."""
    script = textwrap.dedent("""
        import torch
        from cuda.bindings import driver
        torch.cuda.set_device(1)
        from tilebin.ops import moe, quant
        x = torch.randn((64, 1024), device="cuda:1").bfloat16()
        quant.per_token_cast(x, "e4m3", 128)
        moe.topk_gate(torch.randn((64, 256), device="cuda:1"), 8)
        torch.cuda.synchronize(1)
        for d in (0, 1):
            err, dev = driver.cuDeviceGet(d)
            err, flags, active = driver.cuDevicePrimaryCtxGetState(dev)
            print(d, int(active))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    active = dict(line.split() for line in out.stdout.split("\n") if line.strip())
    assert active == {"0": "0", "1": "1"}, f"primary contexts active per device: {active}\n{out.stderr[-1000:]}"
