"""``runtime/_cudrv.py`` (CPU): the ctypes driver answers cuda-python's calls with cuda-python's
conventions, and ``runtime/_driver.py`` runs its cold start on it (no ``cuda.bindings`` import).

A fake ``libcuda`` stands in: Python functions that receive the output pointers (``_byref``
is swapped for ``ctypes.pointer`` so that they can write through them) and record their calls.
"""

from __future__ import annotations

import ctypes
import sys

import pytest

from tilebin.runtime import DeviceError, _cudrv, _driver


class FakeLib:
    """The subset of libcuda the ctypes driver binds; ``no_device`` makes cuInit fail with 100."""

    def __init__(self, no_device: bool = False) -> None:
        self.calls: list[str] = []
        self.current = 0
        names = {
            "cuInit": lambda flags: 100 if no_device else 0,
            "cuDriverGetVersion": lambda p: self._put(p, 13000),
            "cuDeviceGetCount": lambda p: self._put(p, 2),
            "cuDeviceGet": lambda p, ordinal: self._put(p, ordinal),
            "cuDeviceGetName": self._name,
            "cuDeviceGetAttribute": lambda p, attr, dev: self._put(p, {75: 9, 76: 0, 97: 232448}[attr]),
            "cuDevicePrimaryCtxRetain": lambda p, dev: self._put(p, 0x1000 + dev),
            "cuCtxGetCurrent": lambda p: self._put(p, self.current or None),
            "cuCtxSetCurrent": self._set,
            "cuModuleLoadData": lambda p, image: self._put(p, 0x2000 + len(image)),
            "cuModuleGetFunction": lambda p, module, name: self._put(p, module + len(name)),
            "cuFuncGetAttribute": lambda p, attr, fn: self._put(p, 48),
            "cuFuncSetAttribute": lambda fn, attr, value: 0 if value <= 232448 else 1,
            "cuThreadExchangeStreamCaptureMode": lambda p: self._exchange(p),
            "cuPointerGetAttribute": lambda p, attr, ptr: self._put(p, 1),
            "cuGetErrorName": lambda err, p: self._put(p, b"CUDA_ERROR_NO_DEVICE" if err == 100 else b"CUDA_ERROR_X"),
            "cuGetErrorString": lambda err, p: self._put(p, b"no CUDA-capable device is detected"),
            "cuGetProcAddress_v2": lambda symbol, p, version, flags, found: self._put(found, 1) or self._put(p, 0xABC),
        }
        for name, fn in names.items():
            setattr(self, name, self._recorded(name, fn))

    def _recorded(self, name, fn):
        def call(*args):
            self.calls.append(name)
            return fn(*args)
        return call

    @staticmethod
    def _put(pointer, value) -> int:
        pointer[0] = value
        return 0

    def _name(self, buf, length, dev) -> int:
        ctypes.memmove(buf, b"NVIDIA H200\0", 12)
        return 0

    def _set(self, ctx) -> int:
        self.current = ctx or 0
        return 0

    def _exchange(self, pointer) -> int:
        pointer[0] = 0  # the previous mode: global
        return 0


@pytest.fixture
def fake_lib(monkeypatch):
    lib = FakeLib()
    monkeypatch.setattr(_cudrv, "_byref", ctypes.pointer)
    monkeypatch.setattr(_cudrv, "load", lambda: _cudrv.CtypesDriver(lib))
    monkeypatch.setattr(_driver, "_STATE", {})
    monkeypatch.setattr(_driver, "_DEVICES", {})
    monkeypatch.setattr(_driver, "_SUPPORTED", set())
    monkeypatch.setattr(_driver.THREAD, "dev", None, raising=False)
    monkeypatch.delenv("TILEBIN_DRIVER", raising=False)
    return lib


def test_calls_return_cuda_python_tuples(fake_lib):
    drv = _cudrv.CtypesDriver(fake_lib)
    assert drv.cuInit(0) == (0,)
    assert drv.cuDriverGetVersion() == (0, 13000)
    assert drv.cuDeviceGetName(256, 1)[1].split(b"\0", 1)[0] == b"NVIDIA H200"
    assert drv.cuDevicePrimaryCtxRetain(1) == (0, 0x1001)
    assert drv.cuCtxGetCurrent() == (0, 0)  # NULL reads 0, as int(CUcontext(None)) does
    assert drv.cuModuleGetFunction(*drv.cuModuleLoadData(b"abcd")[1:], b"kern") == (0, 0x2008)
    assert drv.cuGetProcAddress(b"cuLaunchKernel", 12000, 0) == (0, 0xABC, 1)
    assert drv.cuGetErrorName(100) == (0, b"CUDA_ERROR_NO_DEVICE")
    assert drv.cuThreadExchangeStreamCaptureMode(2) == (0, 0)


def test_the_cold_start_runs_on_ctypes_without_cuda_bindings(fake_lib, monkeypatch):
    import cuda.bindings

    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)  # an import would now fail
    monkeypatch.delattr(cuda.bindings, "driver", raising=False)
    info = _driver.device(1, "sm_90a", 13000)
    assert (info.name, info.cc, info.ctx_id, info.smem_optin) == ("NVIDIA H200", (9, 0), 0x1001, 232448)
    assert _driver.enter(info) is None and fake_lib.current == 0x1001
    assert _driver.entry_points() == (0xABC,) * 4
    with _driver.relaxed_capture():
        pass
    assert _driver.pointer_device(0x7000) == 1
    assert "cuInit" in fake_lib.calls and not isinstance(_driver._STATE["driver"], type(sys))


def test_a_failed_call_names_the_driver_error(fake_lib, monkeypatch):
    monkeypatch.setattr(_cudrv, "load", lambda: _cudrv.CtypesDriver(FakeLib(no_device=True)))
    with pytest.raises(DeviceError, match="no CUDA-capable device is visible"):
        _driver.driver()
    monkeypatch.setattr(_driver, "_STATE", {})
    monkeypatch.setattr(_cudrv, "load", lambda: _cudrv.CtypesDriver(fake_lib))
    _driver.driver()
    with pytest.raises(DeviceError, match=r"cuInit failed: CUDA_ERROR_NO_DEVICE \(no CUDA-capable device"):
        _driver.check((100,), "cuInit")


def test_cuda_python_setting_skips_ctypes(fake_lib, monkeypatch):
    import cuda.bindings

    monkeypatch.setenv("TILEBIN_DRIVER", "cuda-python")
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    monkeypatch.delattr(cuda.bindings, "driver", raising=False)  # else the import finds the attribute
    with pytest.raises(DeviceError, match=r"no NVIDIA driver found \(cannot import cuda.bindings.driver"):
        _driver.driver()
    assert not fake_lib.calls
    monkeypatch.setenv("TILEBIN_DRIVER", "ctypes-please")
    with pytest.raises(Exception, match="TILEBIN_DRIVER='ctypes-please' is not one of auto, cuda-python"):
        _driver.driver()


def test_load_gives_none_without_libcuda():
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        assert _cudrv.load() is None
    else:
        pytest.skip("libcuda.so.1 opens here: the GPU tests cover the real driver")
