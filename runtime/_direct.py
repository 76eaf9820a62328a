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
import operator
import struct
import threading
from collections.abc import Callable
from typing import Any

from . import _driver
from ._errors import ArgumentError, NoVariantError
from ._expr import OPS, Expr
from ._launch import _RETRY, ex_config, scalar_bits
from ._manifest import KernelSpec, LaunchSpec, VariantSpec
from ._plan import convert_scalar
from ._tensors import torch_stream_getter

_THREAD = _driver.THREAD
_GRID_MAX = ((1 << 31) - 1, 65535, 65535)
# struct format of one 8-byte scalar slot per manifest dtype (little-endian, value then padding)
_SLOT_FORMAT = {
    "int8": "b7x", "int16": "h6x", "int32": "i4x", "int64": "q",
    "uint8": "B7x", "uint16": "H6x", "uint32": "I4x", "uint64": "Q",
    "float32": "f4x", "float64": "d", "float16": "H6x", "bfloat16": "H6x", "bool": "B7x",
}
_CONVERTED = ("float16", "bfloat16", "bool")  # stored as bits after convert_scalar's checks


def compile_expr(tree: Expr, slots: dict[str, tuple[int, int | None]]) -> Callable[[list], int]:
    """A closure ``f(sources) -> int`` for a checked tree.

    ``slots`` maps each symbol to ``(i, d)``: element ``d`` of ``sources[i]`` (a shape or a
    stride tuple), or ``sources[i]`` itself when ``d`` is None (a scalar argument).
    """
    if isinstance(tree, int):
        return lambda s, c=tree: c
    if isinstance(tree, str):
        i, d = slots[tree]
        if d is None:
            return lambda s: s[i]
        return lambda s: s[i][d]
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


def symbol_sources(spec: KernelSpec, variant: VariantSpec) -> tuple[list[Callable[[tuple], Any]], dict]:
    """What a call reads for the runtime symbols: ``getters`` (``f(args)``: a tensor's ``.shape``,
    its ``.stride()``, or a scalar argument), each read once per call, and per symbol its
    ``(getter index, dim or None)``.  Shapes bind first, then strides, then scalars (the order
    ``runtime.launch`` binds them in)."""
    position = {p.name: i for i, p in enumerate(spec.params)}
    getters: list[Callable[[tuple], Any]] = []
    index: dict[tuple, int] = {}
    slots: dict[str, tuple[int, int | None]] = {}

    def source(kind: str, p: int) -> int:
        if (kind, p) not in index:
            index[kind, p] = len(getters)
            getters.append({"shape": lambda a: a[p].shape, "stride": lambda a: a[p].stride(),
                            "scalar": operator.itemgetter(p)}[kind])
        return index[kind, p]

    late = []
    for t in variant.tensors:
        p = position[t.name]
        for d, e in enumerate(t.shape):
            if isinstance(e, str) and e not in slots:
                slots[e] = (source("shape", p), d)
        late += [(e, p, d) for d, e in enumerate(t.strides) if isinstance(e, str)]
    for e, p, d in late:
        if e not in slots:
            slots[e] = (source("stride", p), d)
    for sc in variant.scalars:
        if sc.name not in slots:
            slots[sc.name] = (source("scalar", position[sc.name]), None)
    return getters, slots


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
        self._raw = (ctypes.c_uint64 * max(n, 1))()  # pointer slots first, then one 8-byte slot per scalar
        self._params = (ctypes.c_void_p * max(n, 1))()
        base = ctypes.addressof(self._raw)
        self.address = ctypes.addressof(self._params) if n else 0
        ptrs = [(j, a) for j, a in enumerate(spec.args) if a.kind == "ptr"]
        scalars = [(j, a) for j, a in enumerate(spec.args) if a.kind == "scalar"]
        for k, (j, _) in enumerate(ptrs + scalars):
            self._params[j] = base + 8 * k
        self.ptr_pos = tuple(position[a.param] for _, a in ptrs)
        self.scalar_fns = tuple(compile_expr(a.value, slots) for _, a in scalars)
        self.scalar_types = tuple(a.dtype for _, a in scalars)
        self.converted = tuple(k for k, (_, a) in enumerate(scalars) if a.dtype in _CONVERTED)
        self.packer = struct.Struct("<" + "Q" * len(ptrs) + "".join(_SLOT_FORMAT[a.dtype] for _, a in scalars))
        self.special = spec.cooperative or spec.pdl or tuple(spec.cluster) != (1, 1, 1)
        # cuLaunchKernelEx's config: built once; grid and stream are set per call (under the lock)
        self.config = ex_config(spec, (1, 1, 1), self.block, spec.smem) if self.special else None

    def configured(self, grid: tuple, stream: int) -> Any:
        cfg = self.config
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.hStream = stream
        return cfg

    def _static(self, e: Expr, what: str) -> int:
        if not isinstance(e, int):
            raise NoVariantError(f"{self.where}: {what} {e!r} depends on runtime values; use tilebin.runtime.launch")
        return e

    def fill(self, s: list, args: tuple) -> None:
        """Write this call's pointers and scalars into the argument buffer (one ``pack_into``)."""
        values = [args[p].data_ptr() for p in self.ptr_pos]
        values += [f(s) for f in self.scalar_fns]
        for k in self.converted:  # half types and bool: checked and converted to their bit patterns
            dtype, at = self.scalar_types[k], len(self.ptr_pos) + k
            values[at] = scalar_bits(dtype, convert_scalar(values[at], dtype, f"{self.where} scalar"))
        try:
            self.packer.pack_into(self._raw, 0, *values)
        except (struct.error, OverflowError, TypeError):
            self._bad_values(values)
            raise

    def _bad_values(self, values: list) -> None:
        """Raise the ArgumentError naming the scalar kernel argument that does not fit its type."""
        for dtype, v in zip(self.scalar_types, values[len(self.ptr_pos):]):
            convert_scalar(v, dtype, f"{self.where}: the {dtype} kernel argument")


class UncheckedLauncher:
    """Launch one variant with no argument validation; see the module docstring for the contract."""

    def __init__(self, registry: Any, spec: KernelSpec, variant: VariantSpec) -> None:
        self.registry, self.spec, self.variant = registry, spec, variant
        key = ", ".join(f"{k}={v!r}" for k, v in variant.key.items())
        self.where = f"kernel {spec.name!r} variant {{{key}}}"
        self._getters, slots = symbol_sources(spec, variant)
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
        s = [g(args) for g in self._getters]
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




def find_variant(spec: KernelSpec, key: dict[str, Any]) -> VariantSpec:
    """The variant whose key is exactly ``key``; :class:`NoVariantError` listing the keys otherwise."""
    for v in spec.variants:
        if dict(v.key) == key:
            return v
    shown = "; ".join("{" + ", ".join(f"{k}={x!r}" for k, x in v.key.items()) + "}" for v in spec.variants[:12])
    more = f" (+{len(spec.variants) - 12} more)" if len(spec.variants) > 12 else ""
    raise NoVariantError(f"kernel {spec.name!r}: no prebuilt variant has key {key}; available: {shown}{more}")
