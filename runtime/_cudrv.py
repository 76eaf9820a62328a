"""The driver calls of a cold start, through ``ctypes`` on ``libcuda.so.1``: no ``cuda.bindings``.

Importing ``cuda.bindings.driver`` costs ~20 ms (its extension modules and enum classes), more
than everything else of a first launch.  The first launch needs only the ~20 calls below (init,
device queries, the primary context, module loading, the entry points of the compiled hot path),
so :class:`CtypesDriver` offers exactly those, **with cuda-python's calling convention**: the
same names, arguments and ``(CUresult, value...)`` tuples, and the few enum members the runtime
reads.  :mod:`._driver` then uses one or the other through the same code.  Handles (context,
module, function) are plain ints, which cuda-python's own calls accept too.  What it does not
offer (TMA encoding through the bindings' wrapper, the pure-Python launch twin) imports
``cuda.bindings`` when first used (:func:`._driver.bindings`).

``libcuda.so.1`` is what cuda-python itself loads (its driver is "found via system search"): a
process that has initialised torch's CUDA already holds it.  :func:`load` returns ``None`` when
it cannot be opened, and the runtime then uses cuda-python for everything.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

_P, _I, _U, _U64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint64
_byref = ctypes.byref

# the members of cuda-python's enums that the runtime reads (values from cuda.h, CUDA 12/13)
CUresult = SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_NO_DEVICE=100)
CUdevice_attribute = SimpleNamespace(
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=97)
CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES=1,
                                       CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_RELAXED=2)
CUdriverProcAddress_flags = SimpleNamespace(CU_GET_PROC_ADDRESS_DEFAULT=0)
CUpointer_attribute = SimpleNamespace(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL=9)
CUlaunchAttributeID = SimpleNamespace(CU_LAUNCH_ATTRIBUTE_COOPERATIVE=2, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION=4,
                                      CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION=6)

# name -> argument types (every function returns CUresult, an int)
_SIGNATURES = {
    "cuInit": (_U,),
    "cuDriverGetVersion": (_P,),
    "cuDeviceGetCount": (_P,),
    "cuDeviceGet": (_P, _I),
    "cuDeviceGetName": (ctypes.c_char_p, _I, _I),
    "cuDeviceGetAttribute": (_P, _I, _I),
    "cuDevicePrimaryCtxRetain": (_P, _I),
    "cuCtxGetCurrent": (_P,),
    "cuCtxSetCurrent": (_P,),
    "cuModuleLoadData": (_P, ctypes.c_char_p),
    "cuModuleGetFunction": (_P, _P, ctypes.c_char_p),
    "cuFuncGetAttribute": (_P, _I, _P),
    "cuFuncSetAttribute": (_P, _I, _I),
    "cuThreadExchangeStreamCaptureMode": (_P,),
    "cuPointerGetAttribute": (_P, _I, _U64),
    "cuGetErrorName": (_I, _P),
    "cuGetErrorString": (_I, _P),
    "cuGetProcAddress_v2": (ctypes.c_char_p, _P, _I, _U64, _P),
}


class CtypesDriver:
    """cuda-python's ``cuda.bindings.driver`` calls of a cold start, on ``libcuda.so.1`` (see the module docstring)."""

    CUresult = CUresult
    CUdevice_attribute = CUdevice_attribute
    CUfunction_attribute = CUfunction_attribute
    CUstreamCaptureMode = CUstreamCaptureMode
    CUdriverProcAddress_flags = CUdriverProcAddress_flags
    CUpointer_attribute = CUpointer_attribute
    CUlaunchAttributeID = CUlaunchAttributeID

    def __init__(self, lib: Any) -> None:
        self._f = {}
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)  # AttributeError: a driver without it (load() then gives up)
            fn.argtypes, fn.restype = argtypes, _I
            self._f[name] = fn

    def _out(self, name: str, ctype: Any, *args: Any) -> tuple:
        value = ctype()
        err = self._f[name](_byref(value), *args)
        return err, value.value

    def cuInit(self, flags: int) -> tuple:
        return (self._f["cuInit"](flags),)

    def cuDriverGetVersion(self) -> tuple:
        return self._out("cuDriverGetVersion", _I)

    def cuDeviceGetCount(self) -> tuple:
        return self._out("cuDeviceGetCount", _I)

    def cuDeviceGet(self, ordinal: int) -> tuple:
        return self._out("cuDeviceGet", _I, ordinal)

    def cuDeviceGetName(self, length: int, dev: int) -> tuple:
        buf = ctypes.create_string_buffer(length)
        err = self._f["cuDeviceGetName"](buf, length, int(dev))
        return err, buf.raw

    def cuDeviceGetAttribute(self, attr: int, dev: int) -> tuple:
        return self._out("cuDeviceGetAttribute", _I, int(attr), int(dev))

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple:
        err, ctx = self._out("cuDevicePrimaryCtxRetain", _P, int(dev))
        return err, ctx or 0

    def cuCtxGetCurrent(self) -> tuple:
        err, ctx = self._out("cuCtxGetCurrent", _P)
        return err, ctx or 0

    def cuCtxSetCurrent(self, ctx: Any) -> tuple:
        return (self._f["cuCtxSetCurrent"](int(ctx) if ctx else None),)

    def cuModuleLoadData(self, image: bytes) -> tuple:
        err, handle = self._out("cuModuleLoadData", _P, image)
        return err, handle or 0

    def cuModuleGetFunction(self, module: Any, name: bytes) -> tuple:
        err, handle = self._out("cuModuleGetFunction", _P, int(module), name)
        return err, handle or 0

    def cuFuncGetAttribute(self, attr: int, fn: Any) -> tuple:
        return self._out("cuFuncGetAttribute", _I, int(attr), int(fn))

    def cuFuncSetAttribute(self, fn: Any, attr: int, value: int) -> tuple:
        return (self._f["cuFuncSetAttribute"](int(fn), int(attr), int(value)),)

    def cuThreadExchangeStreamCaptureMode(self, mode: int) -> tuple:
        value = _I(int(mode))
        err = self._f["cuThreadExchangeStreamCaptureMode"](_byref(value))
        return err, value.value

    def cuPointerGetAttribute(self, attr: int, ptr: int) -> tuple:
        value = _I()
        err = self._f["cuPointerGetAttribute"](_byref(value), int(attr), int(ptr))
        return err, value.value

    def cuGetErrorName(self, err: int) -> tuple:
        return self._text("cuGetErrorName", err)

    def cuGetErrorString(self, err: int) -> tuple:
        return self._text("cuGetErrorString", err)

    def _text(self, name: str, err: int) -> tuple:
        out = ctypes.c_char_p()
        status = self._f[name](int(err), _byref(out))
        return status, out.value if out.value is not None else b""

    def cuGetProcAddress(self, symbol: bytes, version: int, flags: int) -> tuple:
        pfn, found = _P(), _I()
        err = self._f["cuGetProcAddress_v2"](symbol, _byref(pfn), version, int(flags), _byref(found))
        return err, pfn.value or 0, found.value


def load() -> CtypesDriver | None:
    """A :class:`CtypesDriver` on ``libcuda.so.1``, or ``None`` when that library (or one of the
    calls above) is not there: the caller then uses cuda-python."""
    try:
        return CtypesDriver(ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError):
        return None


__all__ = ["CtypesDriver", "load"]
