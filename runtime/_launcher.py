"""The Launcher: one manifest variant, compiled once (:mod:`._layout`), launched many times.

This is the launch hot path, and the pure-Python twin of the compiled one (``csrc/_hot.c``,
module ``tilebin.runtime._hot``), which runs the same steps and hands any call it cannot
finish (an unusual value, an error to raise) to this twin before launching anything.  What
one call does, in order:

1. read the runtime symbols the layout needs: tensor sizes and strides, scalar parameters (the
   compiled path reads an exact torch.Tensor through torch's stable C shim: ``_tensors.tensor_shim``);
2. pick the device: the first tensor's (unchecked launchers) or the launcher's own (bound);
3. bound launchers: read every tensor's data pointer; check alignment and aliasing when the
   pointers differ from the last checked ones;
4. per launch: evaluate the grid (an empty grid skips the launch, one out of range is an
   ArgumentError), read pointers, evaluate and range-check scalars, take TMA descriptors,
   and pack everything;
5. the device's functions (loaded lazily, once per device, thread-safe) and the stream
   (torch's current stream of the device, or the one given);
6. make the device's context current, launch every launch, restore the caller's context; a
   launch failing with a context error is retried once, any other failure is a DeviceError.

Launches allocate nothing and never synchronise (capturable in CUDA graphs).  Thread-safe:
this twin packs into per-launcher buffers under a lock; the compiled path packs on the stack.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from typing import Any

from . import _driver, _settings
from ._errors import ArgumentError, DeviceError, TilebinError
from ._scalars import CONVERTED, DTYPE_CODE, SLOT_FORMAT, convert_scalar, scalar_bits
from ._tensors import cai_device, data_ptr, stream_handle, tensor_shim, torch_stream_getter
from ._tma import TmaArg

GRID_MAX = ((1 << 31) - 1, 65535, 65535)
_RETRY = (201, 400, 709)  # CUDA_ERROR_INVALID_CONTEXT, _INVALID_HANDLE, _CONTEXT_IS_DESTROYED
_FORMAT = {"ptr": "Q"}
_SLOT_KINDS = ("ptr", "prog", "direct", "const", "tma")  # csrc/_hot.c: ARG_PTR ...
_HOT: list[Any] = []  # [the compiled module, or None], chosen at the first Launcher


class Bound:
    """What a validated call fixes: the device, its functions, the pointer rules, TMA geometry, default stream."""

    def __init__(self, dev: Any, handles: list, guard: Any, tma: tuple, torch_stream: bool) -> None:
        self.dev, self.handles, self.guard, self.tma, self.torch_stream = dev, handles, guard, tma, torch_stream


class _Buffers:
    """One launch's reusable ``void**`` array and 8-byte slots, and how a call fills them.

    The slots a call changes (pointers, programs, pass-through scalars) come first and are
    written with one ``pack_into``; constant slots follow, written once here.
    """

    def __init__(self, ln: Any) -> None:
        n = max(len(ln.slots), 1)
        self.raw = (ctypes.c_uint64 * n)()
        self.params = (ctypes.c_void_p * n)()
        base = ctypes.addressof(self.raw)
        moving = [(j, s) for j, s in enumerate(ln.slots) if s.kind in ("ptr", "prog", "direct")]
        fixed = [(j, s) for j, s in enumerate(ln.slots) if s.kind == "const"]
        for k, (j, s) in enumerate(moving + fixed):
            self.params[j] = base + 8 * k
            if s.kind == "const":
                ctypes.memmove(base + 8 * k, s.raw, 8)
        self.address = ctypes.addressof(self.params) if ln.slots else 0
        self.packer = struct.Struct("<" + "".join(_FORMAT.get(s.kind) or SLOT_FORMAT[s.dtype] for _, s in moving))
        self.getters = [_GETTERS[s.kind](s) for _, s in moving]
        self.scalars = [s for _, s in moving if s.kind != "ptr"]
        self.converted = [(k, s) for k, (_, s) in enumerate(moving) if s.dtype in CONVERTED]
        self.tma = [(j, s.tma, s.pos) for j, s in enumerate(ln.slots) if s.kind == "tma"]


_GETTERS = {  # slot -> f(args, symbols): the value a call packs into it
    "ptr": lambda slot: lambda a, s, p=slot.pos: data_ptr(a[p]),
    "prog": lambda slot: lambda a, s, f=slot.fn: f(s),
    "direct": lambda slot: lambda a, s, p=slot.pos: a[p],
}


class Launcher:
    """Launch one variant; ``launcher(*args)`` is the op layer's (unchecked) contract.

    Unchecked (``bound=None``): any shape, no validation of dtypes, shapes, strides or
    pointers (a wrong call reads or writes out of bounds); checked: arity, the device, every
    integer kernel argument and grid extent against its type (:class:`ArgumentError`), and
    driver results (:class:`DeviceError`).  Launches on torch's current stream of the first
    tensor's device.  Bound (a validated call, see ``Registry``): :meth:`run` re-launches
    that call's signature with new pointers and pass-through scalars.
    """

    def __init__(self, layout: Any, load: Any, bound: Bound | None = None) -> None:
        self.layout, self.where, self._load, self._bound = layout, layout.where, load, bound
        self._bufs = [_Buffers(ln) for ln in layout.launches]
        self._lock = threading.Lock()
        self._devices: dict[int, tuple[Any, list]] = {}
        self._tma: list[Any] = []
        self._ok_ptrs: tuple | None = None
        self._configs: list | None = None  # cuda-python launch configs: made at this twin's first launch
        if bound is None:
            self._stream = torch_stream_getter()
        else:
            self._devices[bound.dev.ordinal] = (bound.dev, bound.handles)
            self._tma = [TmaArg(m, self.where) if m is not None else None for m in bound.tma]
            self._stream = torch_stream_getter() if bound.torch_stream else None

    def twin(self) -> "Launcher":
        """This launcher (the compiled one answers its Python twin)."""
        return self

    def __call__(self, *args: Any) -> None:
        """Launch with the kernel's parameters in order (asynchronous)."""
        if self._bound is not None:
            self.run(args)
            return
        layout = self.layout
        if len(args) != len(layout.params):
            raise ArgumentError(f"{self.where}: takes {len(layout.params)} arguments "
                                f"({', '.join(layout.params)}), got {len(args)}")
        s = [g(args) for g in layout.getters]
        first = args[layout.first]
        get = getattr(first, "get_device", None)
        ordinal = get() if get is not None else cai_device(first, data_ptr(first))
        if ordinal < 0:
            raise ArgumentError(f"{self.where}: the tensors are not on a CUDA device; move them with .cuda()")
        self._fire(args, s, ordinal, None)

    def run(self, values: Any, stream: Any = None) -> None:
        """A bound launcher's call: ``values`` are the parameters in order (the signature it was built for)."""
        if len(values) != len(self.layout.params):
            raise ArgumentError(f"{self.where}: takes {len(self.layout.params)} arguments, got {len(values)}")
        self.check_values(values)
        self._fire(values, [], self._bound.dev.ordinal, stream)

    def check_values(self, values: Any) -> None:
        """Bound launchers: check this call's pointers (alignment, output overlap) when they changed."""
        self._check_pointers(tuple(data_ptr(values[i]) for i in self.layout.tensors))

    def _check_pointers(self, ptrs: tuple) -> None:
        if ptrs != self._ok_ptrs:
            self._bound.guard.check(ptrs)
            self._ok_ptrs = ptrs

    def packed(self, values: Any) -> list[tuple[Any, tuple, tuple, int, int]]:
        """Pack a call into this launcher's own buffers without launching; per non-empty launch,
        ``(function, grid, block, smem, void** address)``: what a raw ``cuLaunchKernel`` needs.

        For benchmarks and diagnostics (the buffers change at this launcher's next call).
        """
        if self._bound is not None:
            self.check_values(values)
            s, ordinal = [], self._bound.dev.ordinal
        else:
            s, ordinal = [g(values) for g in self.layout.getters], values[self.layout.first].get_device()
        with self._lock:
            grids = self._pack_all(values, s)
            _dev, handles = self._device(ordinal)
        return [(handles[i], g, ln.block, ln.smem, self._bufs[i].address)
                for i, (g, ln) in enumerate(zip(grids, self.layout.launches)) if g is not None]

    def _pack_all(self, args: Any, s: list) -> list:
        try:
            return [self._pack(i, ln, s, args) for i, ln in enumerate(self.layout.launches)]
        except ZeroDivisionError:
            raise ArgumentError(f"{self.where}: a grid or scalar expression divides by zero with the runtime "
                                f"values {s}; check the sizes and scalar arguments") from None

    def _fire(self, args: Any, s: list, ordinal: int, stream: Any) -> None:
        with self._lock:
            grids = self._pack_all(args, s)
            dev, handles = self._device(ordinal)
            handle = self._stream_of(stream) if stream is not None else (
                self._stream(ordinal) if self._stream is not None else 0)
            restore = _driver.enter(dev) if getattr(_driver.THREAD, "dev", None) is not dev else None
            try:
                for i, grid in enumerate(grids):
                    if grid is not None:
                        err = self._drive(i, handles[i], grid, handle, self._bufs[i].address)
                        if err:
                            self._failed(i, err, grid, handle, self._bufs[i].address, dev)
            finally:
                if restore is not None:
                    _driver.leave(restore)

    def _pack(self, i: int, ln: Any, s: list, args: Any) -> tuple | None:
        """Launch ``i``'s grid (None: empty, skip it), its arguments packed into its buffers."""
        grid = ln.grid(s)
        gx, gy, gz = grid
        if not (0 < gx <= GRID_MAX[0] and 0 < gy <= GRID_MAX[1] and 0 < gz <= GRID_MAX[2]):
            if gx and gy and gz:
                raise ArgumentError(f"{ln.where}: grid {grid} is outside [1, {list(GRID_MAX)}]; split the call")
            return None
        buf = self._bufs[i]
        values = [g(args, s) for g in buf.getters]
        for k, slot in buf.converted:  # half types and bool: checked, then their bit patterns
            values[k] = scalar_bits(slot.dtype, convert_scalar(values[k], slot.dtype, f"{ln.where} scalar"))
        try:
            buf.packer.pack_into(buf.raw, 0, *values)
        except (struct.error, OverflowError, TypeError):
            for slot in buf.scalars:  # raises the ArgumentError naming the argument that does not fit
                v = slot.fn(s) if slot.kind == "prog" else args[slot.pos]
                convert_scalar(v, slot.dtype, f"{ln.where}: the {slot.dtype} kernel argument")
            raise
        for j, k, pos in buf.tma:
            buf.params[j] = self._tma[k].address(data_ptr(args[pos]))
        return grid

    def _drive(self, i: int, fn: Any, grid: tuple, stream: int, address: int) -> Any:
        """One driver launch call; returns its CUresult."""
        ln = self.layout.launches[i]
        if self._configs is None:
            self._bind_driver()
        if type(fn) is int:  # a handle the ctypes driver loaded: cuda-python's type for it
            fn = self._function_type(fn)
        cfg = self._configs[i]
        if cfg is None:
            return self._launch(fn, *grid, *ln.block, ln.smem, stream, address, 0)[0]
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.hStream = stream
        return self._launch_ex(cfg, fn, address, 0)[0]

    def _bind_driver(self) -> None:
        """cuda-python's launch calls and this launcher's launch configs (the twin's first launch)."""
        mod = _driver.bindings()
        self._launch, self._launch_ex, self._function_type = mod.cuLaunchKernel, mod.cuLaunchKernelEx, mod.CUfunction
        self._configs = [_driver.ex_config(ln.spec, (1, 1, 1), ln.block, ln.smem) if ln.special else None
                         for ln in self.layout.launches]

    def _failed(self, i: int, err: Any, grid: tuple, stream: int, address: int, dev: Any) -> None:
        """A launch failed: retry once after fixing the current context, else raise DeviceError."""
        ln = self.layout.launches[i]
        if int(err) in _RETRY:
            _driver.forget_current()
            restore = _driver.enter(dev)
            try:
                err = self._drive(i, self._devices[dev.ordinal][1][i], grid, stream, address)
            finally:
                if restore is not None:
                    _driver.leave(restore)
            if not err:
                return
        what = (f"{'cuLaunchKernelEx' if ln.special else 'cuLaunchKernel'}(grid={grid}, block={ln.block}, "
                f"smem={ln.smem}, stream={stream:#x})")
        _driver.check((err,), what, f"{ln.where} on {dev.describe()}")

    def _device(self, ordinal: int) -> tuple[Any, list]:
        """The device and the variant's function handles on it (loaded once per device)."""
        state = self._devices.get(ordinal)
        if state is None:
            if ordinal < 0:
                raise ArgumentError(f"{self.where}: the tensors are not on a CUDA device; move them with .cuda()")
            state = self._devices[ordinal] = self._load(ordinal)
        return state

    def _stream_of(self, stream: Any) -> int:
        """An explicit stream as an int handle; ArgumentError when it belongs to another device."""
        device = getattr(stream, "device", None)
        index = getattr(device, "index", None)
        ordinal = self._bound.dev.ordinal if self._bound is not None else None
        if index is not None and getattr(device, "type", "cuda") == "cuda" and index != ordinal:
            raise ArgumentError(f"{self.where}: stream is on cuda:{index} but the tensors are on cuda:{ordinal}; "
                                "launch on a stream of the tensors' device")
        return stream_handle(stream)

    # --- what the compiled twin calls back into (csrc/_hot.c) --------------------------------
    def _slow_call(self, args: tuple) -> None:
        self(*args)

    def _slow_run(self, values: tuple, stream: Any) -> None:
        self.run(values, stream)

    def _device_state(self, ordinal: int) -> tuple[int, tuple]:
        with self._lock:
            dev, handles = self._device(ordinal)
        return int(dev.ctx_id), tuple(int(h) for h in handles)

    def _tma_address(self, k: int, ptr: int) -> bytes:
        with self._lock:  # the descriptor buffers are shared with this twin's own calls
            return ctypes.string_at(self._tma[k].address(ptr), 128)

    def _launch_failed(self, info: tuple) -> None:
        i, code, grid, stream, address, ordinal = info
        dev = self._devices[ordinal][0]
        err = _driver.result(code)
        if i < 0:
            _driver.check((err,), "cuCtxSetCurrent (restoring the caller's context)", dev.describe())
            return
        self._failed(i, err, grid, stream, address, dev)


class PreparedCall(functools.partial):
    """One call validated once (:meth:`Registry.prepare`); ``call(stream=None)`` launches exactly
    that call again (default stream as for ``launch``: torch's current stream for torch tensors).

    It keeps references to its tensors, so their memory stays allocated.  What it does not
    re-check is the caller's contract: do not resize, re-stride or re-point (``resize_``,
    ``set_``, ``as_strided_``) those tensors afterwards; prepare again instead.  Their
    contents may change freely.  Thread-safe and capturable in CUDA graphs, like ``launch``.
    (A ``functools.partial`` of the bound Launcher's ``run``: a call adds no Python frame.)
    """

    def __new__(cls, plan: Any, values: tuple) -> "PreparedCall":
        return super().__new__(cls, plan.run, tuple(values))

    def __init__(self, plan: Any, values: tuple) -> None:
        plan.twin().check_values(values)  # alignment and overlap checked here, once

    def launcher(self) -> Any:
        """The bound Launcher this call runs (compiled or Python; ``.twin()`` gives the Python one)."""
        return self.func.__self__


def hot_module() -> Any:
    """The compiled hot path (``tilebin.runtime._hot``), or ``None`` when the Python twin is used.

    Chosen once per process from :data:`._settings.HOT_PATH`: ``auto`` takes the extension when it
    imports, ``python`` never does, ``c`` requires it (:class:`TilebinError` if it cannot load).
    """
    if not _HOT:
        choice = _settings.hot_path()
        mod = None
        if choice != "python":
            try:
                from . import _hot as mod
            except ImportError as exc:
                if choice == "c":
                    raise TilebinError(
                        f"{_settings.HOT_PATH.name}=c but the compiled hot path does not load ({exc}); "
                        "reinstall the tilebin wheel, or unset the variable to use the pure-Python path") from None
        _HOT[:] = [mod]
    return _HOT[0]


def use_hot_module(mod: Any) -> None:
    """Pin the hot path for Launchers made from now on (``None``: the Python twin); for tests and benchmarks."""
    _HOT[:] = [mod]


def make_launcher(layout: Any, load: Any, bound: Bound | None = None) -> Any:
    """A Launcher for ``layout``: the compiled one when available (it mirrors this twin), else the twin."""
    twin = Launcher(layout, load, bound)
    hot = hot_module()
    if hot is None:
        return twin
    try:
        entries = _driver.entry_points()
    except DeviceError:  # this driver does not hand out the entry points: the whole process uses the twin
        if _settings.hot_path() == "c":
            raise
        use_hot_module(None)
        return twin
    tensor_shim(hot)  # once torch is imported: torch tensors read through its C shim (csrc/_hot_tensor.h)
    fixed = None
    if bound is not None:
        fixed = (bound.dev.ordinal, int(bound.dev.ctx_id), tuple(int(h) for h in bound.handles))
    try:
        return hot.Launcher(twin, len(layout.params), layout.first, layout.sources, layout.tensors,
                            core_launches(layout), layout.ntma, entries,
                            twin._stream, fixed)
    except ValueError:  # beyond the compiled path's fixed limits (csrc/_hot.c MAX*): the twin serves it
        return twin


def core_launches(layout: Any) -> tuple:
    """The layout's launches as the compiled Launcher's constructor reads them (csrc/_hot.c: parse_launch)."""
    out = []
    for ln in layout.launches:
        slots = []
        for s in ln.slots:
            kind = _SLOT_KINDS.index(s.kind)
            if s.kind == "ptr":
                slots.append((kind, s.pos, 0))
            elif s.kind in ("prog", "direct"):
                slots.append((kind, DTYPE_CODE[s.dtype], s.prog if s.kind == "prog" else s.pos))
            elif s.kind == "const":
                slots.append((kind, 0, int.from_bytes(s.raw, "little")))
            else:
                slots.append((kind, s.tma, s.pos))
        attrs = _driver.attribute_bytes(ln.spec) if ln.special else b""
        out.append((ln.grid_progs, ln.block, ln.smem, tuple(slots), attrs))
    return tuple(out)
