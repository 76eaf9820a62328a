"""Fixtures of the GPU-free runtime tests (helpers live in rt_fakes.py, imported by plain name)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import rt_fakes  # noqa: E402


@pytest.fixture
def rt():
    from tilebin import runtime

    return runtime


@pytest.fixture
def make_registry(tmp_path, rt):
    """``make_registry(manifest_dict=None, **kw)`` -> a Registry over a fresh artifacts folder."""
    def _make(data=None, **kw):
        folder = rt_fakes.write_artifacts(tmp_path / "artifacts", data or rt_fakes.standard_manifest())
        return rt.Registry(folder, **kw)

    return _make


@pytest.fixture(scope="session")
def hot_module(tmp_path_factory):
    """The compiled hot path, built from csrc/_hot.c for these tests (fails under CI when it cannot be)."""
    return rt_fakes.hot_or_skip(tmp_path_factory.mktemp("hot"))


@pytest.fixture(params=["c", "python"])
def hot_path(request, monkeypatch):
    """Every test that launches runs twice: through the compiled Launcher and through its Python twin."""
    from tilebin.runtime import _launcher

    mod = request.getfixturevalue("hot_module") if request.param == "c" else None
    monkeypatch.setattr(_launcher, "_HOT", [mod])
    return request.param


@pytest.fixture
def fake_gpu(monkeypatch, hot_path):
    """Replace the driver, the device table and module loading with fakes; yields the FakeDriver.

    Loading returns function handles named after their entry, the device is an 'H200 (fake)'
    of compute capability 9.0, and TMA encoding writes the global address into the first 8
    bytes of the descriptor and counts calls (``fake.encodes``).  Parametrized over the hot
    path (``fake.hot``: "c" or "python").
    """
    import ctypes

    from cuda.bindings import driver as real

    from tilebin.runtime import _driver, _loader, _tma

    counts = {"scale_bfloat16_128": 5, "scale_float16_128": 5, "scale_bfloat16_256": 5,
              "gemm_1024_1024": 4, "gemm_4096_7168": 4, "quant_a": 3, "quant_b": 3}
    fake = rt_fakes.FakeDriver(real, counts, {"gemm_1024_1024": {0}, "gemm_4096_7168": {0}})
    fake.encodes = []
    fake.hot = hot_path
    monkeypatch.setattr(_driver, "_STATE", {"driver": fake, "mod": fake, "bindings": fake, "version": 13000})
    info = _driver.DeviceInfo(0, 0, "NVIDIA H200 (fake)", (9, 0), real.CUcontext(0x1234), 0x1234, 232448, 13000)
    monkeypatch.setattr(_driver, "_DEVICES", {0: info})
    monkeypatch.setattr(_driver, "_SUPPORTED", set())
    monkeypatch.setattr(_driver.THREAD, "dev", None, raising=False)

    def function(self, kernel, variant, entry, smem, dev):
        return _loader.LoadedFunction(rt_fakes.FakeFn(entry), 0)

    monkeypatch.setattr(_loader.Loader, "function", function)

    def encode(out, dtype, rank, ptr, dims, strides, box, estr, interleave, swizzle, l2, oob):
        fake.encodes.append(ptr)
        ctypes.memmove(out, ctypes.c_uint64(ptr).value.to_bytes(8, "little") + bytes(120), 128)
        return 0

    monkeypatch.setattr(_tma, "_STATE", {"raw": encode})
    yield fake


@pytest.fixture
def counting_torch_registry(make_registry, fake_gpu, monkeypatch):
    """``(registry, slow)``: a registry whose launches see ``rt_fakes.FakeTorchTensor`` as torch
    tensors (stream 0x77), and ``slow``, a list that grows by one per launch that reached the
    Python ``KernelEntry.launch`` (a plan-cache miss for the compiled path)."""
    from tilebin.runtime import _launcher, _registry, _signature, _tensors

    cell = [rt_fakes.FakeTorchTensor]
    for mod in (_registry, _signature, _tensors):
        monkeypatch.setattr(mod, "TORCH_TENSOR", cell)
    monkeypatch.setattr(_launcher, "torch_stream_getter", lambda: (lambda index: 0x77))
    slow: list = []
    real = _registry.KernelEntry.launch
    monkeypatch.setattr(_registry.KernelEntry, "launch", lambda self, *a: slow.append(1) or real(self, *a))
    return make_registry(), slow
