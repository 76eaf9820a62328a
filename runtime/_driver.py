"""The CUDA driver: lazy init, one ``check``, devices, contexts.

The driver is reached at the first launch, never at import time: through ``ctypes`` on
``libcuda.so.1`` for the runtime's own calls (:mod:`._cudrv`: no ~20 ms import of
``cuda.bindings`` in a cold start), or through ``cuda.bindings.driver``, which serves the
pure-Python launch twin and replaces the ctypes calls where those are unavailable or
``TILEBIN_DRIVER=cuda-python``.  Each
device is checked once (architecture and driver version against the manifest) and its
primary context retained; :func:`enter` makes that context current in the calling thread.
Thread-safe: initialisation and the device table are guarded by one lock; which device a
thread has made current is remembered in a thread-local.
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from . import _cudrv, _settings
from ._record import record
from ._errors import DeviceError

_LOCK = threading.Lock()
THREAD = threading.local()  # .dev: the DeviceInfo whose context this thread made current, or None
_STATE: dict[str, Any] = {}  # "driver": the module, "version": cuDriverGetVersion(), "count": cuDeviceGetCount()
_DEVICES: dict[int, "DeviceInfo"] = {}
_SUPPORTED: set[tuple[int, str, int]] = set()  # (ordinal, arch, min_driver_cuda) that passed the checks

# cuDriverGetVersion() major -> the first driver branch that runs its cubins.
_DRIVER_FOR_CUDA = {13: 580, 12: 525, 11: 450}

_HINTS = {
    "CUDA_ERROR_NO_BINARY_FOR_GPU":
        "the cubin was built for another GPU architecture; these wheels are built for sm_90a",
    "CUDA_ERROR_INVALID_IMAGE": "the cubin is damaged or from an incompatible toolkit; reinstall the wheel",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION":
        "the driver is older than the toolkit that built the cubins; upgrade the driver",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES":
        "too many registers or threads per block for this GPU; pick a variant with fewer threads",
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE":
        "the grid exceeds what can be co-resident for a cooperative launch; use smaller inputs",
    "CUDA_ERROR_OUT_OF_MEMORY": "free GPU memory (other processes or caches) and retry",
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED":
        "launch once before capturing a CUDA graph so the cubin is loaded outside capture",
    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": "a previous operation broke the stream capture; fix that first",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "a previous kernel faulted; the CUDA context is unusable, restart the process",
    "CUDA_ERROR_INSUFFICIENT_DRIVER": "the NVIDIA driver is older than this cuda-python needs; upgrade it to >= 580",
    "CUDA_ERROR_INVALID_HANDLE": "the stream or function does not belong to the current context (device mismatch?)",
}


def driver(min_driver_cuda: int = 13000) -> Any:
    """The initialised driver (``cuInit`` done on first call): a :class:`._cudrv.CtypesDriver` on
    ``libcuda.so.1``, or the ``cuda.bindings.driver`` module where that cannot be opened or
    ``TILEBIN_DRIVER=cuda-python``; both answer the same calls the same way.

    Raises :class:`DeviceError` ("no NVIDIA driver found ...") when neither can reach a driver,
    or no GPU is visible; ``min_driver_cuda`` only shapes that message.  Thread-safe.
    """
    mod = _STATE.get("driver")
    if mod is not None:
        return mod
    with _LOCK:
        if "driver" not in _STATE:
            _STATE["driver"] = _init(min_driver_cuda)
    return _STATE["driver"]


def bindings() -> Any:
    """``cuda.bindings.driver`` (imported on first use): for what the ctypes driver does not
    offer (the pure-Python launch twin, TMA encoding through the bindings' wrapper)."""
    mod = _STATE.get("bindings")
    if mod is None:
        try:
            from cuda.bindings import driver as mod
        except Exception as exc:  # ImportError, or a broken install
            raise _no_driver(f"cannot import cuda.bindings.driver: {exc}", 13000) from None
        _STATE["bindings"] = mod
    return mod


def _no_driver(reason: str, min_driver_cuda: int) -> DeviceError:
    need = min_driver_cuda // 1000
    return DeviceError(
        f"no NVIDIA driver found ({reason}); tilebin needs an NVIDIA GPU of compute capability 9.0 "
        f"(H100/H200/H20/H800) with driver >= {_DRIVER_FOR_CUDA.get(need, '?')} (CUDA {_ver(min_driver_cuda)}) "
        "and cuda-python (cuda-bindings) installed"
    )


def _init(min_driver_cuda: int) -> Any:
    auto = _settings.driver() == "auto"
    mod = _cudrv.load() if auto else None
    if mod is None:
        try:
            from cuda.bindings import driver as mod
        except Exception as exc:  # ImportError, or a broken install
            tried = "libcuda.so.1 does not open through ctypes and " if auto else ""
            raise _no_driver(f"{tried}cannot import cuda.bindings.driver: {exc}", min_driver_cuda) from None
        _STATE["bindings"] = mod
    _STATE["mod"] = mod
    try:
        (err,) = mod.cuInit(0)
    except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError when libcuda is absent
        raise _no_driver(f"{type(exc).__name__}: {exc}", min_driver_cuda) from None
    if err == mod.CUresult.CUDA_ERROR_NO_DEVICE:
        raise _no_driver("cuInit: no CUDA-capable device is visible (check CUDA_VISIBLE_DEVICES)", min_driver_cuda)
    check((err,), "cuInit")
    _STATE["version"] = check(mod.cuDriverGetVersion(), "cuDriverGetVersion")
    return mod


def result(code: int) -> Any:
    """A CUresult code as :func:`check` takes it (cuda-python's enum member where it knows the code)."""
    enum = getattr(_STATE.get("mod"), "CUresult", None)
    try:
        return enum(code) if callable(enum) else code
    except ValueError:  # a code this cuda-python does not know: report the number
        return code


def error_name(err: Any) -> str:
    """``"CUDA_ERROR_X (driver's explanation)"`` for a CUresult (the enum name alone if the driver cannot say)."""
    mod = _STATE.get("mod")
    try:
        name = mod.cuGetErrorName(err)[1].decode()
        text = mod.cuGetErrorString(err)[1].decode()
        return f"{name} ({text})"
    except Exception:  # no driver to ask, or an unknown code
        name = getattr(err, "name", None)
        return f"{name} (CUresult {int(err)})" if name else f"CUresult {int(err)}"


def check(result: tuple, what: str, where: str = "") -> Any:
    """Unpack a cuda-python result tuple; raise :class:`DeviceError` naming the CUresult and ``what``.

    ``where`` names the kernel, variant and device when known.  Returns ``None``, the one
    value, or the tuple of values that follow the CUresult.
    """
    err = result[0]
    if err:
        name = error_name(err)
        hint = next((h for k, h in _HINTS.items() if name.startswith(k + " ")), "")
        raise DeviceError(
            f"{what} failed: {name}" + (f" [{where}]" if where else "") + (f"; {hint}" if hint else "")
        )
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


@record(eq=False)
class DeviceInfo:
    """One checked GPU: ordinal, driver handle, name, compute capability, retained primary context."""

    ordinal: int
    handle: Any
    name: str
    cc: tuple[int, int]
    ctx: Any
    ctx_id: int
    smem_optin: int
    driver_version: int

    def describe(self) -> str:
        cc = f"sm_{self.cc[0]}{self.cc[1]}"
        return f"cuda:{self.ordinal} ({self.name}, {cc}, driver CUDA {_ver(self.driver_version)})"


def _ver(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def required_cc(arch: str) -> tuple[tuple[int, int], bool]:
    """``"sm_90a"`` -> ((9, 0), exact=True); a plain ``"sm_90"`` accepts newer GPUs too."""
    m = re.fullmatch(r"sm_(\d+)(\d)([af]?)", arch)
    if not m:
        raise DeviceError(f"manifest names architecture {arch!r}, expected like 'sm_90a'; rebuild the artifacts")
    return (int(m.group(1)), int(m.group(2))), bool(m.group(3))


def device(ordinal: int, arch: str, min_driver_cuda: int) -> DeviceInfo:
    """The checked device ``ordinal`` (checked once per device; later calls are a dict lookup).

    Raises :class:`DeviceError` when there is no driver, the ordinal does not exist, the
    compute capability does not match ``arch``, or the driver is older than ``min_driver_cuda``.
    """
    info = _DEVICES.get(ordinal)
    if info is not None and (ordinal, arch, min_driver_cuda) in _SUPPORTED:
        return info
    mod = driver(min_driver_cuda)
    with _LOCK:
        info = _DEVICES.get(ordinal)
        if info is None:
            info = _open(mod, ordinal)
            _DEVICES[ordinal] = info
    _check_support(info, arch, min_driver_cuda)
    _SUPPORTED.add((ordinal, arch, min_driver_cuda))
    return info


def _open(mod: Any, ordinal: int) -> DeviceInfo:
    count = check(mod.cuDeviceGetCount(), "cuDeviceGetCount")
    _STATE["count"] = count  # fixed for the process (the compiled launch front reads "one device")
    if not 0 <= ordinal < count:
        raise DeviceError(
            f"tensors are on cuda:{ordinal} but the driver sees {count} device(s); check CUDA_VISIBLE_DEVICES"
        )
    where = f"cuda:{ordinal}"
    handle = check(mod.cuDeviceGet(ordinal), "cuDeviceGet", where)
    name = check(mod.cuDeviceGetName(256, handle), "cuDeviceGetName", where)
    name = name.split(b"\0", 1)[0].decode(errors="replace").strip()
    attr = mod.CUdevice_attribute
    get = lambda a: check(mod.cuDeviceGetAttribute(a, handle), "cuDeviceGetAttribute", where)  # noqa: E731
    cc = (get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
          get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
    optin = get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    ctx = check(mod.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain", where)
    return DeviceInfo(ordinal, handle, name, cc, ctx, int(ctx), optin, _STATE["version"])


def _check_support(info: DeviceInfo, arch: str, min_driver_cuda: int) -> None:
    (major, minor), exact = required_cc(arch)
    ok = info.cc == (major, minor) if exact else info.cc >= (major, minor)
    if not ok:
        raise DeviceError(
            f"cuda:{info.ordinal} is a {info.name} of compute capability {info.cc[0]}.{info.cc[1]}; these wheels "
            f"are built for {arch} (compute capability {major}.{minor}: H100/H200/H20/H800) and "
            f"{arch} code runs on no other GPU"
        )
    if info.driver_version < min_driver_cuda:
        need = min_driver_cuda // 1000
        drv = _DRIVER_FOR_CUDA.get(need, "the matching version")
        raise DeviceError(
            f"the NVIDIA driver supports CUDA {_ver(info.driver_version)}, but these cubins need CUDA "
            f"{_ver(min_driver_cuda)}: upgrade the NVIDIA driver to >= {drv} for CUDA {need} cubins"
        )


def enter(info: DeviceInfo) -> Any:
    """Make ``info``'s primary context current in this thread.

    Returns the context to restore afterwards (with :func:`leave`) when another context was
    current, else ``None``.  The thread-local lets later calls skip the driver entirely.
    """
    mod = _STATE["driver"]
    cur = check(mod.cuCtxGetCurrent(), "cuCtxGetCurrent", info.describe())
    if cur is not None and int(cur) == info.ctx_id:
        THREAD.dev = info
        return None
    check(mod.cuCtxSetCurrent(info.ctx), "cuCtxSetCurrent", info.describe())
    if cur is None or int(cur) == 0:
        THREAD.dev = info
        return None
    THREAD.dev = None  # we restore the caller's context after the launch
    return cur


def leave(previous: Any) -> None:
    """Restore the context :func:`enter` replaced."""
    mod = _STATE["driver"]
    check(mod.cuCtxSetCurrent(previous), "cuCtxSetCurrent (restoring the caller's context)")


def current_device() -> DeviceInfo | None:
    """The device whose context this thread made current through :func:`enter`, if any."""
    return getattr(THREAD, "dev", None)


def forget_current() -> None:
    """Drop the thread-local belief (after INVALID_CONTEXT / INVALID_HANDLE from a launch)."""
    THREAD.dev = None


_ENTRY_POINTS = (b"cuLaunchKernel", b"cuLaunchKernelEx", b"cuCtxGetCurrent", b"cuCtxSetCurrent")


def entry_points() -> tuple[int, ...]:
    """Addresses of the driver's ``cuLaunchKernel``, ``cuLaunchKernelEx``, ``cuCtxGetCurrent`` and
    ``cuCtxSetCurrent`` (``cuGetProcAddress``, CUDA 12.0 ABI), for the compiled hot path; cached.

    Raises :class:`DeviceError` when the driver cannot resolve one.
    """
    found = _STATE.get("entry_points")
    if found is None:
        mod = driver()
        flags = mod.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        found = []
        for name in _ENTRY_POINTS:
            pfn, _status = check(mod.cuGetProcAddress(name, 12000, flags), f"cuGetProcAddress({name.decode()})")
            if not int(pfn):
                raise DeviceError(f"cuGetProcAddress({name.decode()}) found nothing; upgrade the NVIDIA driver")
            found.append(int(pfn))
        found = _STATE["entry_points"] = tuple(found)
    return found


def pointer_device(ptr: int) -> int:
    """The device ordinal a CUDA pointer lives on (slow; for objects without ``__dlpack_device__``)."""
    mod = driver()
    attr = mod.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(check(mod.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute(DEVICE_ORDINAL)"))


@contextmanager
def relaxed_capture() -> Iterator[None]:
    """This thread's stream-capture mode is RELAXED inside the block (restored after).

    Module loading and function attribute calls are "unsafe" under a global-mode capture
    (torch.cuda.graph's default); a first launch inside a capture loads its cubin in this mode
    so the capture survives.  No effect outside capture.
    """
    mod = driver()
    relaxed = mod.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    old = check(mod.cuThreadExchangeStreamCaptureMode(relaxed), "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        check(mod.cuThreadExchangeStreamCaptureMode(old), "cuThreadExchangeStreamCaptureMode (restore)")


def ex_config(spec: Any, grid: tuple, block: tuple, smem: int, stream: int = 0) -> Any:
    """A cuda-python ``CUlaunchConfig`` with the launch's cooperative / PDL / cluster attributes."""
    driver()
    mod = bindings()
    cfg = mod.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes, cfg.hStream = smem, stream
    attrs = []
    ids = _cudrv.CUlaunchAttributeID
    for ident, value in launch_attributes(spec):
        a = mod.CUlaunchAttribute()
        a.id = mod.CUlaunchAttributeID(int(ident))
        if int(ident) == ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
            a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = value
        elif int(ident) == ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
            a.value.cooperative = value
        else:
            a.value.programmaticStreamSerializationAllowed = value
        attrs.append(a)
    cfg.attrs, cfg.numAttrs = attrs, len(attrs)
    return cfg


def launch_attributes(spec: Any) -> list[tuple[Any, Any]]:
    """``(CUlaunchAttributeID, value)`` of a launch: cooperative, PDL, cluster dims -- in that order."""
    ids = _cudrv.CUlaunchAttributeID  # cuda.h's values, whichever driver layer is in use
    out: list[tuple[Any, Any]] = []
    if spec.cooperative:
        out.append((ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE, 1))
    if spec.pdl:
        out.append((ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1))
    if tuple(spec.cluster) != (1, 1, 1):
        out.append((ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, tuple(spec.cluster)))
    return out


def attribute_bytes(spec: Any) -> bytes:
    """The same attributes as C ``CUlaunchAttribute`` structs (4-byte id, 4 pad, 64-byte value)."""
    out = b""
    for ident, value in launch_attributes(spec):
        raw = struct.pack("<III", *value) if isinstance(value, tuple) else struct.pack("<i", value)
        out += struct.pack("<I4x", int(ident)) + raw.ljust(64, b"\0")
    return out
