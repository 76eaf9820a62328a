"""Unchecked launchers: one variant, any shape, no per-call validation (the op layer's fast path).

``Registry.unchecked_launcher(name, **key)`` returns an :class:`UncheckedLauncher` for the one
variant whose key is exactly ``key``.  Calling it with the kernel's parameters in order reads
the runtime symbols the manifest binds from tensor sizes and strides (and scalar parameters),
evaluates grids and scalar kernel arguments with closures compiled from the manifest's
expression trees, patches a prepacked ``void**`` buffer and calls ``cuLaunchKernel`` on torch's
current stream.  A new token count costs nothing extra: there is no per-shape plan.

The contract, and why it exists: ``launch`` validates dtype, shape, strides, alignment and
aliasing of every tensor (a plan per call signature; a new shape costs ~100-200 us).  An op of
``tilebin.ops`` has already validated its user's inputs and allocated its outputs itself, so it
launches through this path and pays only for reading sizes and pointers.  Nothing here checks
dtypes, shapes, strides or pointers: a wrong call reads or writes out of bounds.  What is still
checked: every int32 kernel argument and grid extent fits its type (:class:`ArgumentError`),
and driver results (:class:`DeviceError`).  Variants with TMA descriptors are refused (their
descriptors need the validated path).  Thread-safe (a lock per launcher around buffer patching
and the driver call); capturable in CUDA graphs; torch tensors only.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

from . import _driver
from ._errors import ArgumentError, NoVariantError
from ._expr import OPS, Expr
from ._launch import _CTYPES, _RETRY, scalar_bits
from ._manifest import KernelSpec, LaunchSpec, VariantSpec
from ._plan import SCALAR_DTYPES, convert_scalar
from ._tensors import torch_stream_getter

_THREAD = _driver.THREAD
_GRID_MAX = ((1 << 31) - 1, 65535, 65535)


def compile_expr(tree: Expr, slots: dict[str, int]) -> Callable[[tuple], int]:
    """A closure ``f(values) -> int`` for a checked tree; ``slots`` maps symbols to tuple indices."""
    if isinstance(tree, int):
        return lambda s, c=tree: c
    if isinstance(tree, str):
        i = slots[tree]
        return lambda s: s[i]
    fn = OPS[tree[0]][1]
    args = [compile_expr(a, slots) for a in tree[1:]]
    if len(args) == 1:
        (a,) = args
        return lambda s: fn(a(s))
    a, b = args
    if isinstance(tree[2], int):  # the common `sym op const` shape, one call fewer
        c = tree[2]
        return lambda s: fn(a(s), c)
    return lambda s: fn(a(s), b(s))


def symbol_readers(spec: KernelSpec, variant: VariantSpec) -> tuple[list[str], list[Callable[[tuple], Any]]]:
    """Symbols in binding order and, per symbol, ``f(args) -> value`` (a size, a stride or a scalar)."""
    position = {p.name: i for i, p in enumerate(spec.params)}
    names: list[str] = []
    readers: list[Callable[[tuple], Any]] = []
    late: list[tuple[str, int, int]] = []
    for t in variant.tensors:
        p = position[t.name]
        for d, e in enumerate(t.shape):
            if isinstance(e, str) and e not in names:
                names.append(e)
                readers.append(lambda a, p=p, d=d: a[p].size(d))
        for d, e in enumerate(t.strides):
            if isinstance(e, str):
                late.append((e, p, d))
    for e, p, d in late:
        if e not in names:
            names.append(e)
            readers.append(lambda a, p=p, d=d: a[p].stride(d))
    for s in variant.scalars:
        if s.name not in names:
            p = position[s.name]
            names.append(s.name)
            readers.append(lambda a, p=p: a[p])
    return names, readers


def _grid_fn(fns: list[Callable[[tuple], int]], tree: tuple) -> Callable[[tuple], tuple]:
    """One closure for the three grid extents (constant extents inlined)."""
    x, y, z = fns
    if isinstance(tree[1], int) and isinstance(tree[2], int):
        cy, cz = tree[1], tree[2]
        return lambda s: (x(s), cy, cz)
    return lambda s: (x(s), y(s), z(s))


class _Launch:
    """One device-kernel launch of the variant: compiled grid, argument buffer, slots to patch."""

    def __init__(self, spec: LaunchSpec, slots: dict[str, int], position: dict[str, int], where: str) -> None:
        self.spec, self.where = spec, f"{where}, entry {spec.entry}"
        if any(a.kind == "tma" for a in spec.args):
            raise NoVariantError(f"{where}: uses TMA descriptors, which the unchecked path does not encode; "
                                 "use tilebin.runtime.launch for it")
        self.grid = _grid_fn([compile_expr(e, slots) for e in spec.grid], tuple(spec.grid))
        self.block = tuple(self._static(e, "block") for e in spec.block)
        self.smem = spec.smem
        n = len(spec.args)
        self._raw = (ctypes.c_uint64 * max(n, 1))()
        self._params = (ctypes.c_void_p * max(n, 1))()
        base = ctypes.addressof(self._raw)
        self.address = ctypes.addressof(self._params) if n else 0
        self.ptrs: list[tuple[Any, int]] = []  # (slot, parameter position)
        self.ints: list[tuple[Any, Callable, int, int]] = []  # (slot, expr, lo, hi)
        self.others: list[tuple[Any, Callable, str, tuple, float]] = []  # (slot, expr, dtype, fast types, max)
        for j, a in enumerate(spec.args):
            self._params[j] = base + 8 * j
            if a.kind == "ptr":
                self.ptrs.append((ctypes.c_uint64.from_address(base + 8 * j), position[a.param]))
                continue
            kind, lo, hi = SCALAR_DTYPES[a.dtype]
            slot, f = _CTYPES[a.dtype].from_address(base + 8 * j), compile_expr(a.value, slots)
            if kind == "i":
                self.ints.append((slot, f, lo, hi))
            else:  # float32/float64 store Python floats directly; half types and bool convert
                top = {"float32": 3.4028234663852886e38, "float64": 1.7976931348623157e308}.get(a.dtype)
                self.others.append((slot, f, a.dtype, (float, int) if top else (), top or 0.0))
        self.special = spec.cooperative or spec.pdl or tuple(spec.cluster) != (1, 1, 1)
        # cuLaunchKernelEx's config: built once; grid and stream are set per call (under the lock)
        self.config = _ex_config(spec, (1, 1, 1), self.block, 0) if self.special else None

    def configured(self, grid: tuple, stream: int) -> Any:
        cfg = self.config
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.hStream = stream
        return cfg

    def _static(self, e: Expr, what: str) -> int:
        if not isinstance(e, int):
            raise NoVariantError(f"{self.where}: {what} {e!r} depends on runtime values; use tilebin.runtime.launch")
        return e

    def fill(self, s: tuple, args: tuple) -> None:
        for slot, p in self.ptrs:
            slot.value = args[p].data_ptr()
        for slot, f, lo, hi in self.ints:
            v = f(s)
            if not lo <= v <= hi:
                raise ArgumentError(f"{self.where}: an integer kernel argument evaluates to {v}, outside "
                                    f"[{lo}, {hi}]; the input is too large for this kernel: split the call")
            slot.value = v
        for slot, f, dtype, fast, top in self.others:
            v = f(s)
            if v.__class__ in fast and -top <= v <= top:
                slot.value = v
            else:
                slot.value = scalar_bits(dtype, convert_scalar(v, dtype, f"{self.where} scalar"))


class UncheckedLauncher:
    """Launch one variant with no argument validation; see the module docstring for the contract."""

    def __init__(self, registry: Any, spec: KernelSpec, variant: VariantSpec) -> None:
        self.registry, self.spec, self.variant = registry, spec, variant
        key = ", ".join(f"{k}={v!r}" for k, v in variant.key.items())
        self.where = f"kernel {spec.name!r} variant {{{key}}}"
        names, self._readers = symbol_readers(spec, variant)
        slots = {n: i for i, n in enumerate(names)}
        position = {p.name: i for i, p in enumerate(spec.params)}
        self._launches = [_Launch(ln, slots, position, self.where) for ln in variant.launches]
        tensors = [i for i, p in enumerate(spec.params) if p.kind == "tensor"]
        if not tensors:
            raise NoVariantError(f"{self.where}: has no tensor parameter to take the device from")
        self._first = tensors[0]
        self._nparams = len(spec.params)
        self._devices: dict[int, tuple[Any, list]] = {}  # ordinal -> (DeviceInfo, function handles)
        self._stream = torch_stream_getter()
        self._lock = threading.Lock()
        mod = _driver.driver()
        self._launch, self._launch_ex = mod.cuLaunchKernel, mod.cuLaunchKernelEx

    def __call__(self, *args: Any) -> None:
        """Launch on torch's current stream of the first tensor's device (asynchronous)."""
        if len(args) != self._nparams:
            raise ArgumentError(f"{self.where}: takes {self._nparams} arguments "
                                f"({', '.join(p.name for p in self.spec.params)}), got {len(args)}")
        s = tuple([r(args) for r in self._readers])
        ordinal = args[self._first].get_device()
        state = self._devices.get(ordinal)
        if state is None:
            if ordinal < 0:
                raise ArgumentError(f"{self.where}: the tensors are not on a CUDA device; move them with .cuda()")
            state = self._load(ordinal)
        dev, fns = state
        stream = self._stream(ordinal)
        restore = _driver.enter(dev) if getattr(_THREAD, "dev", None) is not dev else None
        try:
            with self._lock:
                for ln, fn in fns:
                    grid = ln.grid(s)
                    gx, gy, gz = grid
                    if not (0 < gx <= 2147483647 and 0 < gy <= 65535 and 0 < gz <= 65535):
                        if gx and gy and gz:
                            raise ArgumentError(f"{ln.where}: grid {grid} is outside [1, {list(_GRID_MAX)}]; "
                                                "split the call")
                        continue  # an empty problem
                    ln.fill(s, args)
                    if ln.special:
                        err = self._launch_ex(ln.configured(grid, stream), fn, ln.address, 0)[0]
                    else:
                        err = self._launch(fn, gx, gy, gz, *ln.block, ln.smem, stream, ln.address, 0)[0]
                    if err:
                        self._failed(err, ln, fn, grid, stream, dev)
        finally:
            if restore is not None:
                _driver.leave(restore)

    def _failed(self, err: Any, ln: _Launch, fn: Any, grid: tuple, stream: int, dev: Any) -> None:
        """A launch failed: retry once after fixing the current context, else raise DeviceError."""
        if int(err) in _RETRY:
            _driver.forget_current()
            restore = _driver.enter(dev)
            try:
                err = self._call(ln, fn, grid, stream)
            finally:
                if restore is not None:
                    _driver.leave(restore)
        if err:
            what = f"{'cuLaunchKernelEx' if ln.special else 'cuLaunchKernel'}(grid={grid}, block={ln.block})"
            _driver.check((err,), what, f"{ln.where} on {dev.describe()}")

    def _call(self, ln: _Launch, fn: Any, grid: tuple, stream: int) -> Any:
        if not ln.special:
            return self._launch(fn, *grid, *ln.block, ln.smem, stream, ln.address, 0)[0]
        return self._launch_ex(ln.configured(grid, stream), fn, ln.address, 0)[0]

    def _load(self, ordinal: int) -> tuple[Any, list]:
        """Check the device and load the variant's functions on it (once per device)."""
        build = self.registry.manifest.build
        dev = _driver.device(ordinal, build.arch, build.min_driver_cuda)
        restore = _driver.enter(dev)
        try:
            with _driver.relaxed_capture():
                fns = [(ln, self.registry._loader.function(self.spec.name, self.variant, ln.spec.entry,
                                                            ln.spec.smem, dev).handle) for ln in self._launches]
        finally:
            if restore is not None:
                _driver.leave(restore)
        with self._lock:
            self._devices[ordinal] = (dev, fns)
        return dev, fns


def _ex_config(spec: LaunchSpec, grid: tuple, block: tuple, stream: int) -> Any:
    """A ``CUlaunchConfig`` for cooperative / PDL / cluster launches (built per call: grids vary)."""
    mod = _driver.driver()
    cfg = mod.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes, cfg.hStream = spec.smem, stream
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


def find_variant(spec: KernelSpec, key: dict[str, Any]) -> VariantSpec:
    """The variant whose key is exactly ``key``; :class:`NoVariantError` listing the keys otherwise."""
    for v in spec.variants:
        if dict(v.key) == key:
            return v
    shown = "; ".join("{" + ", ".join(f"{k}={x!r}" for k, x in v.key.items()) + "}" for v in spec.variants[:12])
    more = f" (+{len(spec.variants) - 12} more)" if len(spec.variants) > 12 else ""
    raise NoVariantError(f"kernel {spec.name!r}: no prebuilt variant has key {key}; available: {shown}{more}")
