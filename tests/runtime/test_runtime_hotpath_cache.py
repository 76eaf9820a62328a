"""The compiled path's caches, on the fake driver: runtime.launch's compiled front, a Dispatch's
recent signatures (csrc/_hot_recent.h), and a bound Launcher's recent pointer sets and TMA
descriptors (csrc/_hot_call.h).  Each must serve only calls equal to the ones it remembers, and
both paths must launch the same bytes and raise the same errors.
"""

from __future__ import annotations

import struct
import threading

import pytest
import rt_fakes as F

from tilebin.runtime import _launcher


def _bf16(*shape, **kw):
    return F.tensor(shape, dtype="bfloat16", **kw)


def test_recent_signatures_serve_only_equal_calls(counting_torch_registry, make_registry, fake_gpu, rt):
    """The compiled Dispatch's recent signatures (csrc/_hot_recent.h): a repeated call skips the key,
    while a call differing in strides, dtype, device, or a keyed scalar's value or type gets its own
    plan or its own refusal; plans the registry evicts are forgotten."""
    reg, slow = counting_torch_registry
    x, out = F.FakeTorchTensor((300, 64)), F.FakeTorchTensor((300, 64))
    for _ in range(3):
        reg.launch("toy.scale", x, out, 1.0)
    assert len(slow) == (1 if fake_gpu.hot == "c" else 3)
    strided = F.FakeTorchTensor((300, 64))
    strided._strides = (128, 1)
    with pytest.raises(rt.ArgumentError):
        reg.launch("toy.scale", strided, out, 1.0)
    reg.launch("toy.scale", F.FakeTorchTensor((300, 64), "float16"), F.FakeTorchTensor((300, 64), "float16"), 1.0)
    assert fake_gpu.launches[-1]["fn"] == "scale_float16_128"
    with pytest.raises(rt.ArgumentError, match="cuda"):
        reg.launch("toy.scale", F.FakeTorchTensor((300, 64), device=("cpu", 0)), out, 1.0)
    q = (F.FakeTorchTensor((1000,), "float32"), F.FakeTorchTensor((8,), "float32"))
    for group in (128, 128, 64, 128):
        reg.launch("toy.quant", *q, group, 0.5)
        assert fake_gpu.launches[-2]["dims"][0] == ((1000 + group - 1) // group, 1, 1)
    small = make_registry(plan_cache_size=1)
    slow.clear()
    a, b = (F.FakeTorchTensor((8, 64)), F.FakeTorchTensor((8, 64))), (F.FakeTorchTensor((16, 64)),) * 2
    b = (b[0], F.FakeTorchTensor((16, 64)))
    for pair in (a, a, b, a):  # a's plan is remembered, then evicted by b's: a is built again
        small.launch("toy.scale", *pair, 1.0)
    assert len(slow) == (3 if fake_gpu.hot == "c" else 4)


def test_tma_descriptors_are_kept_per_address(make_registry, fake_gpu, monkeypatch, rt):
    """A launch alternating between recent tensors encodes each descriptor once and, on the compiled
    path, asks the twin for each address, and to check each pointer set, once (csrc: RECENT_PTRS)."""
    asked, checked = [], []
    real, check = _launcher.Launcher._tma_address, _launcher.Launcher._check_pointers
    monkeypatch.setattr(_launcher.Launcher, "_tma_address",
                        lambda self, k, ptr: asked.append(ptr) or real(self, k, ptr))
    monkeypatch.setattr(_launcher.Launcher, "_check_pointers", lambda self, p: checked.append(p) or check(self, p))
    reg = make_registry()
    b, c = _bf16(1024, 1024), _bf16(70, 1024)
    a_list = [_bf16(70, 1024) for _ in range(4)]
    for _ in range(3):
        for a in a_list:
            reg.launch("toy.gemm", a, b, c)
    assert sorted(set(fake_gpu.encodes)) == sorted(a.ptr for a in a_list) == sorted(fake_gpu.encodes)
    assert [u64 for u64 in (int.from_bytes(ln["args"][0][:8], "little") for ln in fake_gpu.launches)] == \
        [a.ptr for a in a_list] * 3
    assert len(asked) == (4 if fake_gpu.hot == "c" else 0)
    assert len(checked) == (4 if fake_gpu.hot == "c" else 12)
    misaligned = F.FakeTensor((70, 1024), dtype="bfloat16", ptr=a_list[0].ptr + 2)
    for _ in range(2):  # a refused pointer set is never remembered
        with pytest.raises(rt.ArgumentError, match="aligned"):
            reg.launch("toy.gemm", misaligned, b, c)


def _front_scenario(front) -> list:
    x, out = F.FakeTorchTensor((300, 64)), F.FakeTorchTensor((300, 64))
    calls = [lambda: front("toy.scale", x, out, 1.0), lambda: front("toy.scale", x, out, 2.0),
             lambda: front("toy.scale", x, out, 1.0, stream=0x99), lambda: front("toy.scale", x, out, alpha=3.0),
             lambda: front("toy.scale", x, out, 1.0, stream=0x5, block=128), lambda: front("toy.nope", x),
             lambda: front("toy.scale", x), lambda: front(), lambda: front(["unhashable"], x),
             lambda: front("toy.scale", x, out, 1.0, strem=1)]
    seen = []
    for call in calls:
        try:
            seen.append(call())
        except Exception as exc:  # compared between the paths
            seen.append((type(exc).__name__, str(exc)))
    return seen


@pytest.mark.parametrize("hot_path", ["c"], indirect=True)
def test_compiled_front_is_runtime_launch(make_registry, fake_gpu, hot_module, monkeypatch, rt):
    """runtime.launch's compiled front (_hot.Front) launches the same bytes and raises the same errors
    as the Python function it fronts, and serves plan-cache hits without it."""
    from tilebin.runtime import _registry, _signature, _tensors

    cell = [F.FakeTorchTensor]
    for mod in (_registry, _signature, _tensors):
        monkeypatch.setattr(mod, "TORCH_TENSOR", cell)
    monkeypatch.setattr(_launcher, "torch_stream_getter", lambda: (lambda index: 0x77))
    slow = []
    python = rt._launch_python
    results = {}
    for path, mod in (("c", hot_module), ("c tp_call", hot_module), ("python", None)):
        monkeypatch.setattr(_launcher, "_HOT", [mod])
        monkeypatch.setattr(F, "_NEXT", [0x7F0000000000])
        monkeypatch.setattr(_registry, "_DEFAULT", [make_registry()])
        fake_gpu.launches.clear()
        front = python if mod is None else mod.Front(_registry._DEFAULT,
                                                      lambda *a, **k: slow.append(1) or python(*a, **k))
        if path == "c":  # runtime.launch: the fastcall method (front(...) is the same call)
            front = front.launch
        results[path] = (_front_scenario(front), list(fake_gpu.launches))
    assert results["c"] == results["python"] == results["c tp_call"]
    assert len(results["c"][1]) == 5 and results["c"][1][2]["stream"] == 0x99
    assert len(slow) == 2 * (1 + 6)  # per front: the first call (no entry yet); other keywords, unknown names, no name


def test_runtime_launch_is_the_front_of_the_chosen_path(rt):
    assert rt.launch is rt._launch_python or type(rt.launch.__self__).__name__ == "Front"


def test_recent_signatures_under_threads(make_registry, fake_gpu, monkeypatch):
    """8 threads, 24 signatures (more than a Dispatch remembers): every launch packs its own caller's
    pointers and row count while the recent entries are replaced under it."""
    from tilebin.runtime import _registry, _signature, _tensors

    cell = [F.FakeTorchTensor]
    for mod in (_registry, _signature, _tensors):
        monkeypatch.setattr(mod, "TORCH_TENSOR", cell)
    monkeypatch.setattr(_launcher, "torch_stream_getter", lambda: (lambda index: 0x77))
    reg = make_registry()
    pairs = [(F.FakeTorchTensor((m, 64)), F.FakeTorchTensor((m, 64))) for m in range(1, 25)]
    errors, barrier = [], threading.Barrier(8)

    def work(k):
        barrier.wait()
        try:
            for i in range(150):
                reg.launch("toy.scale", *pairs[(k * 3 + i) % len(pairs)], 1.0)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(fake_gpu.launches) == 8 * 150
    rows = {x.data_ptr(): (out.data_ptr(), x.shape[0]) for x, out in pairs}
    for ln in fake_gpu.launches:
        x_ptr, out_ptr, m = struct.unpack_from("<QQi", b"".join(ln["args"][:3]))
        assert rows[x_ptr] == (out_ptr, m)


def test_one_device_skips_get_device(make_registry, fake_gpu, monkeypatch, rt):
    """A driver that sees one device (csrc/_hot_recent.h one_device): the compiled front's recent
    signatures take a CUDA tensor's ordinal as 0 without calling get_device(); with more devices, or an
    unknown count, they read it.  Both launch the same bytes, and a non-CUDA tensor is still refused."""
    from tilebin.runtime import _driver, _registry, _signature, _tensors

    cell = [F.FakeTorchTensor]
    for mod in (_registry, _signature, _tensors):
        monkeypatch.setattr(mod, "TORCH_TENSOR", cell)
    monkeypatch.setattr(_launcher, "torch_stream_getter", lambda: (lambda index: 0x77))
    calls = []
    real = F.FakeTorchTensor.get_device
    monkeypatch.setattr(F.FakeTorchTensor, "get_device", lambda self: calls.append(1) or real(self))
    hot = _launcher.hot_module()
    seen = {}
    try:
        for count in (1, 2, None):
            monkeypatch.setitem(_driver._STATE, "count", count)
            reg = make_registry()
            x, out = F.FakeTorchTensor((300, 64)), F.FakeTorchTensor((300, 64))
            reg.launch("toy.scale", x, out, 1.0)  # builds the plan (and tells the front the device count)
            calls.clear()
            for _ in range(3):
                reg.launch("toy.scale", x, out, 1.0)
            seen[count] = [dict(ln, args=ln["args"][2:]) for ln in fake_gpu.launches[-3:]]  # past the pointers
            if hot is not None:
                assert hot.single_device(count == 1) is (count == 1)
                assert (len(calls) == 0) is (count == 1)
            with pytest.raises(rt.ArgumentError, match="cuda"):
                reg.launch("toy.scale", F.FakeTorchTensor((300, 64), device=("cpu", 0)), out, 1.0)
    finally:
        if hot is not None:
            hot.single_device(False)
    assert len(seen[1]) == 3 and seen[1] == seen[2] == seen[None]
