"""Prepared launches: a validated :class:`Binding` plus loaded functions, ready to fire cheaply.

A :class:`Plan` is built once per call signature.  It owns, per device-kernel launch, a
prepacked ``void**`` argument array (ctypes) whose slots already hold every scalar; a
call then only reads the tensors' data pointers, checks them (alignment, output aliasing)
when they changed, patches the pointer/TMA/pass-through-scalar slots and calls
``cuLaunchKernel`` with the array's address.  Launches allocate nothing and never
synchronise, so they can be captured in CUDA graphs.

Thread-safety: a plan's argument buffers are shared; a per-plan lock is held from the
first patch to the return of the last driver call (cuda-python releases the GIL inside
the driver), so concurrent callers serialise on a plan, never corrupt it.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from typing import Any

from . import _driver
from ._errors import ArgumentError
from ._loader import LoadedFunction
from ._plan import SCALAR_DTYPES, Binding, BoundLaunch, convert_scalar
from ._tensors import data_ptr, stream_handle, torch_stream_getter
from ._tma import TmaArg

_CTYPES = {
    "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32, "int64": ctypes.c_int64,
    "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64,
    "float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_bool,
    "float16": ctypes.c_uint16, "bfloat16": ctypes.c_uint16,  # stored as their bit patterns
}
_THREAD = _driver.THREAD
_RETRY = (201, 400, 709)  # CUDA_ERROR_INVALID_CONTEXT, _INVALID_HANDLE, _CONTEXT_IS_DESTROYED


def scalar_bits(dtype: str, value: Any) -> Any:
    """The value to store in a ``_CTYPES[dtype]`` slot (half types become their bit patterns)."""
    if dtype == "float16":
        try:
            return struct.unpack("<H", struct.pack("<e", value))[0]
        except (OverflowError, struct.error):
            raise ArgumentError(f"{value!r} does not fit float16 (max 65504)") from None
    if dtype == "bfloat16":
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        if value != value:  # NaN: keep it a quiet NaN
            return 0x7FC0
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even
    return value


class _Direct:
    """A pass-through scalar parameter: re-read, checked and stored on every call.

    Python ints/floats inside the C type's range take a short path; anything else goes
    through :func:`convert_scalar` (which raises :class:`ArgumentError` with the details).
    """

    __slots__ = ("slot", "pos", "dtype", "what", "fast", "lo", "hi")

    def __init__(self, slot: Any, pos: int, dtype: str, what: str) -> None:
        self.slot, self.pos, self.dtype, self.what = slot, pos, dtype, what
        kind, lo, hi = SCALAR_DTYPES[dtype]
        if kind == "i":
            self.fast, self.lo, self.hi = (int,), lo, hi
        elif dtype in ("float32", "float64"):
            top = 3.4028234663852886e38 if dtype == "float32" else 1.7976931348623157e308
            self.fast, self.lo, self.hi = (float, int), -top, top
        else:
            self.fast, self.lo, self.hi = (), 0, 0

    def store(self, value: Any) -> None:
        if value.__class__ in self.fast and self.lo <= value <= self.hi:
            self.slot.value = value
        else:
            self.slot.value = scalar_bits(self.dtype, convert_scalar(value, self.dtype, self.what))


class PreparedLaunch:
    """One device-kernel launch: function, dims, prepacked ``void**`` buffer, and what to patch."""

    def __init__(self, bound: BoundLaunch, fn: LoadedFunction, binding: Binding, where: str) -> None:
        spec = bound.spec
        self.where = f"{where}, entry {spec.entry}"
        self.fn, self.grid, self.block, self.smem = fn.handle, bound.grid, bound.block, spec.smem
        kinds = [a[0] for a in bound.args]
        n, n_ptr = len(kinds), kinds.count("ptr")
        n_scalar = kinds.count("scalar")
        # storage: pointer slots first (8 bytes each, contiguous), then one 8-byte slot per scalar
        self._raw = (ctypes.c_uint64 * max(n_ptr + n_scalar, 1))()
        base = ctypes.addressof(self._raw)
        self._ptrs = (ctypes.c_uint64 * n_ptr).from_address(base)
        self._params = (ctypes.c_void_p * max(n, 1))()
        self.address = ctypes.addressof(self._params) if n else 0
        self._ptr_index: list[int] = []
        self._direct: list[_Direct] = []
        self._tma: list[tuple[int, TmaArg, int]] = []
        self._fill(bound, binding, base, n_ptr)
        self._identity = self._ptr_index == list(range(len(binding.tensor_positions)))
        special = spec.cooperative or spec.pdl or tuple(spec.cluster) != (1, 1, 1)
        self._config = ex_config(spec, self.grid, self.block, self.smem) if special else None  # None: plain cuLaunchKernel
        mod = _driver.driver()
        self._launch, self._launch_ex = mod.cuLaunchKernel, mod.cuLaunchKernelEx
        self._head = (self.fn, *self.grid, *self.block, self.smem)  # cuLaunchKernel's leading arguments

    def _fill(self, bound: BoundLaunch, binding: Binding, base: int, n_ptr: int) -> None:
        next_scalar = base + 8 * n_ptr
        for j, arg in enumerate(bound.args):
            if arg[0] == "ptr":
                self._params[j] = base + 8 * len(self._ptr_index)
                self._ptr_index.append(arg[1])
            elif arg[0] == "tma":
                m = binding.tma[arg[1]]
                self._tma.append((j, TmaArg(m, self.where), m.tensor_index))
            else:
                _, dtype, value, pos = arg
                slot = _CTYPES[dtype].from_address(next_scalar)
                slot.value = scalar_bits(dtype, value)
                self._params[j] = next_scalar
                next_scalar += 8
                if pos is not None:
                    self._direct.append(_Direct(slot, pos, dtype, f"{self.where} argument {j}"))


    def fire(self, values: Any, ptrs: tuple, stream: int, dev: _driver.DeviceInfo) -> None:
        """Patch this call's pointers and scalars, then launch (caller holds the plan lock)."""
        if self._identity:
            self._ptrs[:] = ptrs
        elif self._ptr_index:
            self._ptrs[:] = [ptrs[i] for i in self._ptr_index]
        for d in self._direct:
            d.store(values[d.pos])
        for j, t, i in self._tma:
            p = ptrs[i]
            if p != t.last_ptr:
                self._params[j] = t.address(p)
        if self._config is None:
            err = self._launch(*self._head, stream, self.address, 0)[0]
        else:
            err = self._call(stream)
        if err:
            self._failed(err, stream, dev)

    def _call(self, stream: int) -> Any:
        if self._config is None:
            return self._launch(*self._head, stream, self.address, 0)[0]
        self._config.hStream = stream
        return self._launch_ex(self._config, self.fn, self.address, 0)[0]

    def _failed(self, err: Any, stream: int, dev: _driver.DeviceInfo) -> None:
        """Retry once after fixing the current context; else raise :class:`DeviceError`."""
        if int(err) in _RETRY:
            _driver.forget_current()
            restore = _driver.enter(dev)
            try:
                err = self._call(stream)
            finally:
                if restore is not None:
                    _driver.leave(restore)
            if not err:
                return
        what = (f"{'cuLaunchKernelEx' if self._config is not None else 'cuLaunchKernel'}"
                f"(grid={self.grid}, block={self.block}, smem={self.smem}, stream={stream:#x})")
        _driver.check((err,), what, f"{self.where} on {dev.describe()}")


def ex_config(spec: Any, grid: tuple, block: tuple, smem: int, stream: int = 0) -> Any:
    """A ``CUlaunchConfig`` with the launch's cooperative / PDL / cluster attributes."""
    mod = _driver.driver()
    cfg = mod.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes, cfg.hStream = smem, stream
    ids, attrs = mod.CUlaunchAttributeID, []
    if spec.cooperative:
        a = mod.CUlaunchAttribute()
        a.id, a.value.cooperative = ids.CU_LAUNCH_ATTRIBUTE_COOPERATIVE, 1
        attrs.append(a)
    if spec.pdl:
        a = mod.CUlaunchAttribute()
        a.id = ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
        attrs.append(a)
    if tuple(spec.cluster) != (1, 1, 1):
        a = mod.CUlaunchAttribute()
        a.id = ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = spec.cluster
        attrs.append(a)
    cfg.attrs, cfg.numAttrs = attrs, len(attrs)
    return cfg


def pointer_reader(positions: tuple[int, ...], all_torch: bool) -> Any:
    """``f(values) -> tuple of data pointers`` of the tensor parameters (unrolled for up to 4 torch tensors)."""
    if not all_torch:
        return lambda v: tuple([data_ptr(v[i]) for i in positions])
    if len(positions) == 1:
        (a,) = positions
        return lambda v: (v[a].data_ptr(),)
    if len(positions) == 2:
        a, b = positions
        return lambda v: (v[a].data_ptr(), v[b].data_ptr())
    if len(positions) == 3:
        a, b, c = positions
        return lambda v: (v[a].data_ptr(), v[b].data_ptr(), v[c].data_ptr())
    if len(positions) == 4:
        a, b, c, d = positions
        return lambda v: (v[a].data_ptr(), v[b].data_ptr(), v[c].data_ptr(), v[d].data_ptr())
    return lambda v: tuple([v[i].data_ptr() for i in positions])


class Plan:
    """Everything a repeated call with one signature needs; :meth:`run` is the hot path."""

    def __init__(self, binding: Binding, launches: list[PreparedLaunch], dev: _driver.DeviceInfo,
                 torch_positions: frozenset[int]) -> None:
        self.binding, self.dev, self.launches = binding, dev, tuple(launches)
        positions = binding.tensor_positions
        self._pointers = pointer_reader(positions, torch_positions == frozenset(positions))
        # stream=None: torch's current stream of the device for torch tensors, else stream 0
        self._default_stream = (functools.partial(torch_stream_getter(), dev.ordinal) if torch_positions
                                else functools.partial(int, 0))
        self._guard = binding.guard
        self._ok_ptrs: tuple | None = None
        self._lock = threading.Lock()

    def run(self, values: Any, stream: Any = None) -> None:
        """Launch with this call's tensors and scalars (same signature as the plan was built for)."""
        self.run_checked(values, self.pointers(values), stream)

    def pointers(self, values: Any) -> tuple:
        """This call's data pointers, checked (alignment, output overlap) when they changed."""
        ptrs = self._pointers(values)
        if ptrs != self._ok_ptrs:
            self._guard.check(ptrs)
            self._ok_ptrs = ptrs
        return ptrs

    def run_checked(self, values: Any, ptrs: tuple, stream: Any = None) -> None:
        """Launch with pointers :meth:`pointers` returned for these values."""
        stream = self._default_stream() if stream is None else self._explicit_stream(stream)
        dev = self.dev
        restore = _driver.enter(dev) if getattr(_THREAD, "dev", None) is not dev else None
        try:
            with self._lock:
                for ln in self.launches:
                    ln.fire(values, ptrs, stream, dev)
        finally:
            if restore is not None:
                _driver.leave(restore)

    def _explicit_stream(self, stream: Any) -> int:
        device = getattr(stream, "device", None)
        index = getattr(device, "index", None)
        if index is not None and getattr(device, "type", "cuda") == "cuda" and index != self.dev.ordinal:
            raise ArgumentError(
                f"{self.binding.where()}: stream is on cuda:{index} but the tensors are on cuda:{self.dev.ordinal}; "
                "launch on a stream of the tensors' device"
            )
        return stream_handle(stream)


class PreparedCall:
    """One call validated once (:meth:`Registry.prepare`); calling it launches exactly that call again.

    It keeps references to its tensors, so their memory stays allocated.  What it does not
    re-check is the caller's contract: do not resize, re-stride or re-point (``resize_``,
    ``set_``, ``as_strided_``) those tensors afterwards; prepare again instead.  Their
    contents may change freely.  Thread-safe and capturable in CUDA graphs, like ``launch``.
    """

    __slots__ = ("_plan", "_values", "_ptrs")

    def __init__(self, plan: Any, values: tuple) -> None:
        self._plan, self._values = plan, values
        self._ptrs = plan.pointers(values)  # alignment and overlap checked here, once

    def __call__(self, stream: Any = None) -> None:
        """Launch on ``stream`` (default as for ``launch``: torch's current stream for torch tensors)."""
        self._plan.run_checked(self._values, self._ptrs, stream)

