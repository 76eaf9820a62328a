"""What every op of ``tilebin.ops`` shares: argument checks that name the op, and kernel launchers.

Ops validate everything first (typed :class:`ArgumentError` naming the op, the value received,
what is supported and the fix), check the device last (so argument errors surface the same on
CPU tensors), allocate their outputs, then launch through :func:`launcher`: the runtime's
unchecked path, which costs a few microseconds whatever the shape (no per-shape plan).
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Mapping
from typing import Any

import torch

from tilebin import runtime
from tilebin.runtime import ArgumentError

_LAUNCHERS: dict[tuple, Any] = {}


class _Tracing(threading.local):
    """Per thread: whether the op running now is the fake (shape-only) twin of itself.

    ``tilebin.ops._torch`` registers every op with ``torch.library``; its fake implementation
    runs the op's own code on fake tensors with ``on`` set, so shapes, dtypes, strides and
    argument errors come from the one code path.  While ``on``: launches are no-ops, pointers
    read as 0 (fake tensors have no memory), and nothing is memoized (a memo, a placeholder or
    a launcher cached from fake tensors must never serve a real call).
    """

    def __init__(self) -> None:  # runs once per thread: an instance attribute reads ~2x faster than a class one
        self.on = False


TRACING = _Tracing()


class _SoleGpu:
    """Whether this process sees exactly one CUDA device (settled at the first op call, then fixed).

    Then every CUDA tensor is on that device, and a memo key holds a tensor's ``is_cuda`` (a bool:
    a singleton, free to hash and compare) where it would hold ``device``: each ``t.device`` read
    makes a new object whose hash and compare cost ~0.1 µs per tensor in every lookup.  Without
    CUDA or with several GPUs, keys hold ``t.device``.  A key reads it as
    ``t.is_cuda if SOLE_GPU.on else t.device``; a generated key reads :meth:`attr` (after :meth:`settle`).
    """

    def __init__(self) -> None:
        self.on = False
        self._settled = False

    def settle(self) -> None:
        """Decide ``on`` (once, before the first memo key; CUDA is initialised by then if used)."""
        if not self._settled:
            self.on = torch.cuda.is_available() and torch.cuda.device_count() == 1
            self._settled = True

    def attr(self) -> str:
        """The tensor attribute a generated memo key reads for the device (once settled)."""
        return "is_cuda" if self.on else "device"


SOLE_GPU = _SoleGpu()


def _no_launch(*args: Any) -> None:
    """The launch of an op traced with fake tensors: nothing to run."""


def launcher(name: str, **key: Any) -> runtime.UncheckedLauncher:
    """The launcher of kernel ``name``'s variant whose key is exactly ``key`` (cached).

    ``fn(*args)`` launches with the PrimFunc's parameters in order on torch's current stream;
    see :meth:`tilebin.runtime.Registry.unchecked_launcher` for what it does not check.  A
    variant with TMA descriptors launches through the checked ``runtime.launch`` instead.
    While tracing with fake tensors (:data:`TRACING`) it is a no-op that reads nothing.
    """
    if TRACING.on:
        return _no_launch
    cache_key = (name, tuple(sorted(key.items())))
    fn = _LAUNCHERS.get(cache_key)
    if fn is None:
        fn = _LAUNCHERS[cache_key] = _tma_launch(name, key) or runtime.unchecked_launcher(name, **key)
    return fn


def specialised_launcher(name: str, sizes: Mapping[str, int], **key: Any) -> runtime.UncheckedLauncher:
    """The launcher of kernel ``name``'s variant ``key`` built for these ``sizes`` (see
    :func:`specialised_key`), else of the run-time-size variant ``key``.  Op plans call it once per
    memo key, so a specialised variant costs nothing per call."""
    if TRACING.on:
        return _no_launch  # fake tensors: nothing launches (and symbolic sizes are not compared)
    return launcher(name, **specialised_key(runtime.spec(name).variants, sizes, key))


def specialised_key(variants: Any, sizes: Mapping[str, int], key: Mapping[str, Any]) -> dict[str, Any]:
    """The key of the first of ``variants`` that is ``key`` specialised for ``sizes`` (its
    ``specialised`` size symbols, ``KernelDecl.specialise``, all equal the call's), else ``key``.
    ``sizes`` names every size symbol the kernel may be specialised on."""
    for v in variants:
        names = v.specialised
        if names and all(n in sizes and v.key[n] == sizes[n] for n in names) \
                and {k: x for k, x in v.key.items() if k not in names} == dict(key):
            return dict(v.key)
    return dict(key)


def _tma_launch(name: str, key: dict) -> Any:
    """For a variant with TMA descriptors (which the unchecked path does not encode): a function
    launching it through :func:`tilebin.runtime.launch` (checked, its descriptors cached per
    address); else None."""
    if not any(dict(v.key) == key and v.tma for v in runtime.spec(name).variants):
        return None
    launch = runtime.launch

    def checked(*args: Any) -> None:
        launch(name, *args, **key)

    return checked


_META: dict[tuple[str, str], Any] = {}


class ZeroedState:
    """An int32 buffer of ``shape`` that a kernel finds all zero and leaves all zero (a ticket and
    totals, instead of a fill launch per call): :meth:`get` gives the one of torch's current
    stream on ``device``, made zeroed at its first use, so calls that could overlap (other
    streams) never share one.  Under CUDA-graph capture it gives a fresh zeroed buffer instead:
    the fill is then part of the graph, and graphs replayed at once on different streams never
    share state either.  Not for fake tensors (ops pass a placeholder while tracing)."""

    __slots__ = ("shape", "device", "by_stream", "stream", "capturing")

    def __init__(self, shape: tuple, device: torch.device) -> None:
        self.shape, self.device = shape, device
        self.by_stream: dict[Any, torch.Tensor] = {}
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
                lambda i: torch.cuda.current_stream(i).cuda_stream)
            self.stream = lambda: raw(index)
            self.capturing = lambda: _capturing(index)
        else:  # CPU tensors (the ops' stubbed tests): one stream
            self.stream, self.capturing = (lambda: None), (lambda: False)

    def get(self) -> torch.Tensor:
        """The zeroed buffer to pass to this call's launch (see the class)."""
        if self.capturing():
            return torch.zeros(self.shape, dtype=torch.int32, device=self.device)
        stream = self.stream()
        state = self.by_stream.get(stream)
        if state is None:
            state = self.by_stream[stream] = torch.zeros(self.shape, dtype=torch.int32, device=self.device)
        return state


def _capturing(index: int) -> bool:
    """Whether torch's current stream on device ``index`` is capturing a CUDA graph."""
    if torch.cuda.current_device() == index:
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(index):
        return torch.cuda.is_current_stream_capturing()


def kernel_meta(kernel: str, key: str) -> Any:
    """The constant ``key`` kernel ``kernel`` declares (``KernelDecl.meta``, from the manifest via
    :func:`tilebin.runtime.spec`; cached): tile widths and limits the ops size grids and check
    arguments by, never copied into ``tilebin.ops``."""
    value = _META.get((kernel, key))
    if value is None:
        value = _META[(kernel, key)] = runtime.spec(kernel).meta[key]
    return value


def ptr(t: torch.Tensor) -> int:
    """``t.data_ptr()``, or 0 while tracing with fake tensors (which have no memory): pointer
    and alignment checks apply to real tensors only."""
    return 0 if TRACING.on else t.data_ptr()


def typed_key(*parts: Any) -> tuple:
    """A memo key that equals another only when every part has the same type and value.

    ``True == 1 == 1.0`` and ``(128.0, 128.0) == (128, 128)`` hash alike; a memo keyed by raw
    arguments would serve a configuration validated for one of them to the other.  Here each
    part is tagged with its exact type (tuples and lists element by element) and floats by their
    bits (``0.0`` and ``-0.0`` differ).  Unhashable parts raise TypeError (callers then take the
    checked path).
    """
    types = tuple(map(type, parts))
    if FLAT_TYPES.issuperset(types):  # the common case: flat scalars
        return parts + types
    return tuple([_typed(p) for p in parts])


FLAT_TYPES = frozenset((int, bool, str, type(None), torch.dtype))  # values whose type and value are their whole key


def _typed(value: Any) -> Any:
    t = type(value)
    if isinstance(value, (tuple, list)):  # torch.Size and other subclasses too
        return t, tuple([_typed(v) for v in value])
    if isinstance(value, float):  # numpy floats too: 0.0 == -0.0, their bits differ
        return t, float.hex(value)
    return t, value


def check_flag(op: str, name: str, value: Any) -> bool:
    """``value`` as a bool: a Python bool, or the ints 0 and 1 (tile_kernels' callers pass both)."""
    if type(value) is bool:
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise fail(op, f"{name} must be a bool, got {type(value).__name__} {value!r}")


def fail(op: str, message: str) -> ArgumentError:
    """An :class:`ArgumentError` reading ``"<op>: <message>"`` (raise it)."""
    return ArgumentError(f"{op}: {message}")


def _names(dtypes: tuple) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_int(op: str, name: str, value: Any, lo: int, hi: int = 2**31 - 1) -> int:
    """``value`` as a Python int in ``[lo, hi]``.

    Integer-likes (``operator.index``: numpy ints) are converted once; bools, floats and tensors
    are refused (reading a CUDA tensor's value would synchronise with the GPU).
    """
    if type(value) is not int:
        if isinstance(value, (bool, torch.Tensor)):
            raise fail(op, f"{name} must be an int, got {type(value).__name__} {value!r}")
        try:
            value = operator.index(value)
        except TypeError:
            raise fail(op, f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if not lo <= value <= hi:
        raise fail(op, f"{name}={value} is out of range; supported: {lo} <= {name} <= {hi}")
    return value


def check_tensor(op: str, name: str, t: Any, dtypes: tuple, ndim: int | None = None) -> None:
    """``t`` is a torch.Tensor of one of ``dtypes`` with ``ndim`` dims."""
    if not isinstance(t, torch.Tensor):
        raise fail(op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise fail(op, f"{name} has dtype {str(t.dtype).removeprefix('torch.')}; supported: {_names(dtypes)}")
    if ndim is not None and t.dim() != ndim:
        raise fail(op, f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")


def check_cuda(op: str, **tensors: Any) -> None:
    """Every given tensor (None ignored) is on the same CUDA device.  Call it last."""
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not t.is_cuda:
            raise fail(op, f"{name} is on {t.device}, not a CUDA device; move it with {name}.cuda()")
        if first is None:
            first = (name, t.device)
        elif t.device != first[1]:
            raise fail(op, f"{name} is on {t.device} but {first[0]} is on {first[1]}; put every tensor on one GPU")


def aligned_input(t: Any, align: int = 16) -> Any:
    """``t`` (an input the kernel only reads), or a copy of it with the same shape and strides in a
    fresh, aligned allocation when its data pointer is not ``align``-byte aligned (a view that
    starts inside a tensor, e.g. the rows of a later chunk of tokens).  None and empty tensors
    pass through."""
    if t is None or not ptr(t) % align or not t.numel():
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


_F32_OVERFLOW = 3.4028235677973366e38  # the smallest magnitude float32 rounds to infinity


def check_float32(op: str, name: str, value: Any) -> float:
    """``value`` (a real number: int or float, bools and tensors refused) as the Python float the
    kernel's float32 scalar will hold: magnitudes float32 cannot represent become +-inf, as a
    float32 cast makes them.  NaN passes through."""
    if isinstance(value, (bool, torch.Tensor)) or not isinstance(value, (int, float)):
        raise fail(op, f"{name} must be a float, got {type(value).__name__} {value!r}")
    if abs(value) < _F32_OVERFLOW or value != value:
        return float(value)
    return math.inf if value > 0 else -math.inf


def check_aligned(op: str, name: str, t: torch.Tensor, align: int = 16) -> None:
    """The innermost dim is contiguous and the data pointer is ``align``-byte aligned."""
    if t.dim() and t.stride(-1) != 1 and t.size(-1) > 1:
        raise fail(op, f"{name} must be contiguous in its last dim (strides {tuple(t.stride())}); call .contiguous()")
    if ptr(t) % align:
        raise fail(op, f"{name}'s data pointer {t.data_ptr():#x} is not {align}-byte aligned (vector loads); "
                       f"pass {name}.clone()")
