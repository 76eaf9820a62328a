"""The compiled hot path (csrc/_hot.c) against its Python twin, on the fake driver.

Every launching test of tests/runtime runs on both paths (the ``fake_gpu`` fixture is
parametrized); here the two are run side by side on the same calls and must launch the same
bytes and raise the same errors, the compiled path must not hand ordinary calls to the twin,
and the TILEBIN_HOT_PATH setting picks the path.
"""

from __future__ import annotations

import struct
import sys
import threading
import types

import pytest
import rt_fakes as F
from test_runtime_unchecked import TorchLike, streams  # noqa: F401  (fixture)

from tilebin.runtime import _launcher, _settings


def _bf16(*shape, **kw):
    return F.tensor(shape, dtype="bfloat16", **kw)


def _scenario(reg) -> list:
    """Valid and invalid calls through launch, prepare and unchecked launchers; what each raised."""
    x, out = _bf16(300, 64), _bf16(300, 64)
    a, b, c = _bf16(70, 1024), _bf16(1024, 1024), _bf16(70, 1024)
    fn = reg.unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    q = reg.unchecked_launcher("toy.quant", dtype="float32")
    t1, t2 = TorchLike(129, 64), TorchLike(129, 64)
    calls = [
        lambda: reg.launch("toy.scale", x, out, 2.5),
        lambda: reg.launch("toy.scale", x, out, 3),  # an int for a float32 scalar
        lambda: reg.launch("toy.scale", x, out, 1e39),  # does not fit float32
        lambda: reg.launch("toy.scale", x, out, float("nan")),
        lambda: reg.launch("toy.scale", x, out, float("inf")),  # +-inf pack as themselves (a "no clamp" value)
        lambda: reg.launch("toy.scale", x, out, -float("inf")),
        lambda: reg.launch("toy.scale", x, out, 3.4028234663852886e38),  # float32's largest (not bfloat16's)
        lambda: reg.launch("toy.scale", x, out, 3.4028235e38),  # just past it
        lambda: reg.launch("toy.scale", x, out, "a"),
        lambda: reg.launch("toy.scale", x, out, 1.0, stream=0x99),
        lambda: reg.launch("toy.scale", x, out, 1.0, stream=-1),
        lambda: reg.launch("toy.quant", F.tensor((1000,)), F.tensor((8,)), 128, 0.5),
        lambda: reg.launch("toy.quant", F.tensor((1000,)), F.tensor((8,)), 128, 1e6),  # float16 overflow
        lambda: reg.launch("toy.gemm", a, b, c),
        lambda: reg.launch("toy.gemm", _bf16(70, 1024), b, c),  # a new TMA address
        lambda: reg.prepare("toy.scale", x, out, 0.25)(),
        lambda: reg.prepare("toy.scale", x, out, 0.25)(stream=0x42),
        lambda: reg.launch("toy.scale", _bf16(300, 64, ptr=x.ptr + 2), out, 1.0),  # misaligned
        lambda: fn(t1, t2, 1.5),
        lambda: fn(TorchLike(2**31, 1), TorchLike(2**31, 1), 1.0),  # int32 overflow
        lambda: fn(TorchLike(2**40, 1), TorchLike(2**40, 1), 1.0),  # grid out of range
        lambda: fn(TorchLike(0, 64), TorchLike(0, 64), 1.0),  # empty
        lambda: fn(t1, t2),  # arity
        lambda: fn(TorchLike(4, 4, device=-1), TorchLike(4, 4, device=-1), 1.0),
        lambda: fn(t1, t2, True),
        lambda: q(TorchLike(1000), TorchLike(8), 128, 0.5),
        lambda: q(TorchLike(1000), TorchLike(8), 0, 0.5),  # division by zero in the grid
        lambda: q(TorchLike(1000), TorchLike(8), 2**70, 0.5),  # does not fit int64
    ]
    seen = []
    for call in calls:
        try:
            call()
            seen.append(None)
        except Exception as exc:  # compared between the paths
            seen.append((type(exc).__name__, str(exc)))
    return seen


@pytest.mark.parametrize("hot_path", ["c"], indirect=True)
def test_both_paths_launch_the_same_bytes_and_raise_the_same_errors(make_registry, fake_gpu, streams, hot_module,
                                                                       monkeypatch):
    results = {}
    for path, mod in (("c", hot_module), ("python", None)):
        monkeypatch.setattr(_launcher, "_HOT", [mod])
        monkeypatch.setattr(F, "_NEXT", [0x7F0000000000])  # the same made-up pointers in both runs
        monkeypatch.setattr(TorchLike, "_next", [0x7E0000000000])
        fake_gpu.launches.clear()
        reg = make_registry()
        assert isinstance(reg.unchecked_launcher("toy.scale", dtype="bfloat16", block=128),
                          _launcher.Launcher) == (mod is None)
        results[path] = (_scenario(reg), list(fake_gpu.launches))
    (c_errors, c_launches), (py_errors, py_launches) = results["c"], results["python"]
    assert c_errors == py_errors
    assert len(c_launches) == len(py_launches) > 10
    for c, p in zip(c_launches, py_launches):
        assert c == p
    assert sum(e is not None for e in c_errors) >= 10
    assert all(e is None or e[0] == "ArgumentError" for e in c_errors), c_errors


def test_ordinary_calls_stay_compiled(make_registry, fake_gpu, streams, monkeypatch):
    """The compiled path finishes these calls itself: the twin's slow entries are never used."""
    if fake_gpu.hot != "c":
        pytest.skip("compiled path only")
    slow = []
    monkeypatch.setattr(_launcher.Launcher, "_slow_call", lambda self, args: slow.append(args))
    monkeypatch.setattr(_launcher.Launcher, "_slow_run", lambda self, values, stream: slow.append(values))
    reg = make_registry()
    fn = reg.unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    # float, int, bool and +-inf (ops pass inf for "no clamp") for the float32 scalar
    for m, alpha in ((1, 1.5), (300, 2), (4001, True), (7, float("inf")), (8, -float("inf"))):
        fn(TorchLike(m, 64), TorchLike(m, 64), alpha)
    x, out = _bf16(300, 64), _bf16(300, 64)
    for stream in (None, 0, 0x77):
        reg.launch("toy.scale", x, out, 2.0, stream=stream)
    b, c = _bf16(1024, 1024), _bf16(70, 1024)
    for _ in range(3):
        reg.launch("toy.gemm", _bf16(70, 1024), b, c)
    reg.prepare("toy.scale", x, out, 1.0)()
    assert slow == [] and len(fake_gpu.launches) == 12


def test_devices_have_their_own_functions_context_and_stream(make_registry, fake_gpu, streams, monkeypatch):
    from cuda.bindings import driver as real

    from tilebin.runtime import _driver

    second = _driver.DeviceInfo(1, 1, "NVIDIA H200 (fake)", (9, 0), real.CUcontext(0x5678), 0x5678, 232448, 13000)
    monkeypatch.setitem(_driver._DEVICES, 1, second)
    fn = make_registry().unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    fn(TorchLike(4, 64), TorchLike(4, 64), 1.0)
    seen = []
    real_record = fake_gpu._record
    monkeypatch.setattr(fake_gpu, "_record", lambda *a, **k: seen.append(fake_gpu.current) or real_record(*a, **k))
    fn(TorchLike(4, 64, device=1), TorchLike(4, 64, device=1), 1.0)
    fn(TorchLike(4, 64), TorchLike(4, 64), 1.0)
    assert [ln["stream"] for ln in fake_gpu.launches] == [0x50, 0x51, 0x50]
    assert seen == [0x5678, 0x1234] and fake_gpu.current == 0x1234  # the caller's context restored


def test_unchecked_retry_then_device_error(make_registry, fake_gpu, streams, rt):
    fn = make_registry().unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    fake_gpu.fail_next = [201]  # CUDA_ERROR_INVALID_CONTEXT: retried once
    fn(TorchLike(4, 64), TorchLike(4, 64), 1.0)
    assert len(fake_gpu.launches) == 2 and fake_gpu.launches[0]["args"] == fake_gpu.launches[1]["args"]
    fake_gpu.fail_next = [719]
    with pytest.raises(rt.DeviceError, match=r"cuLaunchKernel\(grid=\(1, 1, 1\).*toy.scale.*NVIDIA H200"):
        fn(TorchLike(4, 64), TorchLike(4, 64), 1.0)


def test_threads_share_an_unchecked_launcher(make_registry, fake_gpu, streams):
    fn = make_registry().unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    pairs = [(TorchLike(64 * (k + 1), 8), TorchLike(64 * (k + 1), 8)) for k in range(6)]
    barrier, errors = threading.Barrier(6), []

    def work(x, y, k):
        barrier.wait()
        try:
            for _ in range(200):
                fn(x, y, float(k))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(*p, k)) for k, p in enumerate(pairs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(fake_gpu.launches) == 1200
    for ln in fake_gpu.launches:
        k = int(struct.unpack_from("<f", ln["args"][4])[0])
        x, y = pairs[k]
        assert struct.unpack_from("<QQi", b"".join(ln["args"][:3]))[:3] == (x.ptr, y.ptr, 64 * (k + 1))


@pytest.mark.parametrize("value, expect", [(None, "auto"), ("python", "python"), (" C ", "c"), ("auto", "auto")])
def test_hot_path_setting(monkeypatch, value, expect):
    if value is None:
        monkeypatch.delenv(_settings.HOT_PATH.name, raising=False)
    else:
        monkeypatch.setenv(_settings.HOT_PATH.name, value)
    assert _settings.hot_path() == expect


def test_hot_path_setting_is_applied(monkeypatch, rt):
    monkeypatch.setattr(_launcher, "_HOT", [])
    monkeypatch.setenv(_settings.HOT_PATH.name, "python")
    assert rt.hot_path() == "python"
    monkeypatch.setattr(_launcher, "_HOT", [])
    monkeypatch.setenv(_settings.HOT_PATH.name, "c")
    import importlib.util

    if importlib.util.find_spec("tilebin.runtime._hot") is None:  # a checkout: no built extension in runtime/
        with pytest.raises(rt.TilebinError, match="TILEBIN_HOT_PATH=c but the compiled hot path does not load"):
            rt.hot_path()
    monkeypatch.setattr(_launcher, "_HOT", [])
    monkeypatch.setenv(_settings.HOT_PATH.name, "fast")
    with pytest.raises(rt.TilebinError, match="not one of auto, c, python"):
        rt.hot_path()


def test_plan_cache_hits_skip_python(counting_torch_registry, fake_gpu):
    """runtime.launch with plain (torch-like) tensors: after the first call builds the plan, the
    compiled Dispatch finds it by the same key _signature.fast_signature builds, without Python."""
    reg, slow = counting_torch_registry
    pairs = [(F.FakeTorchTensor((300, 64)), F.FakeTorchTensor((300, 64))) for _ in range(3)]
    for k, (x, out) in enumerate(pairs):
        reg.launch("toy.scale", x, out, float(k))
    reg.launch("toy.scale", *pairs[0], 1.0, stream=0x99)
    assert len(slow) == (1 if fake_gpu.hot == "c" else 4)
    assert len(reg._entries["toy.scale"].fast_plans) == 1
    for ln, (x, out), alpha, stream in zip(fake_gpu.launches, pairs + pairs[:1], (0.0, 1.0, 2.0, 1.0),
                                           (0x77, 0x77, 0x77, 0x99)):
        assert struct.unpack_from("<QQ", b"".join(ln["args"][:2])) == (x.data_ptr(), out.data_ptr())
        assert struct.unpack_from("<f", ln["args"][4])[0] == alpha and ln["stream"] == stream


@pytest.mark.parametrize("hot_path", ["c"], indirect=True)
def test_every_shipped_variant_fits_the_compiled_path(built_wheel, fake_gpu, tmp_path, monkeypatch):
    """Each variant of the built wheel's manifest gets a compiled unchecked Launcher (none falls back
    to the twin for exceeding csrc/_hot.c's fixed limits) and needs no half-precision scalar
    (which the compiled path hands to the twin on every call)."""
    import json
    import zipfile

    from tilebin.runtime import Registry

    with zipfile.ZipFile(built_wheel) as zf:
        data = json.loads(zf.read("tilebin/_artifacts/manifest.json"))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=types.SimpleNamespace(
        _cuda_getCurrentRawStream=lambda i: 0)))
    reg = Registry(F.write_artifacts(tmp_path / "a", data))
    compiled = 0
    for name, kernel in data["kernels"].items():
        for v in kernel["variants"]:
            halves = [a for ln in v["launches"] for a in ln["args"]
                      if a["kind"] == "scalar" and a["dtype"] in ("float16", "bfloat16", "bool")]
            assert not halves, f"{name} {v['key']}: {halves}"
            if v.get("tma"):
                continue
            fn = reg.unchecked_launcher(name, **v["key"])
            assert not isinstance(fn, _launcher.Launcher), f"{name} {v['key']} fell back to the Python twin"
            compiled += 1
    assert compiled > 100


def test_no_entry_points_means_the_twin(make_registry, fake_gpu, streams, monkeypatch, rt):
    """A driver that cannot hand out cuLaunchKernel & co: Launchers fall back to the Python twin
    (TILEBIN_HOT_PATH=auto), or the launch says why (TILEBIN_HOT_PATH=c)."""
    if fake_gpu.hot != "c":
        pytest.skip("compiled path only")
    failing = lambda name, version, flags: (fake_gpu.CUresult(500), 0, 0)  # noqa: E731  CUDA_ERROR_NOT_FOUND
    monkeypatch.setattr(fake_gpu, "cuGetProcAddress", failing)
    monkeypatch.setenv(_settings.HOT_PATH.name, "c")
    with pytest.raises(rt.DeviceError, match="cuGetProcAddress.cuLaunchKernel"):
        make_registry().unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    monkeypatch.setenv(_settings.HOT_PATH.name, "auto")
    fn = make_registry().unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    assert isinstance(fn, _launcher.Launcher) and rt.hot_path() == "python"
    fn(TorchLike(4, 64), TorchLike(4, 64), 1.0)
    assert len(fake_gpu.launches) == 1

