"""What the runtime reads from tensor arguments: torch tensors and ``__cuda_array_interface__`` objects.

torch is never imported here: a torch tensor is recognised only once torch is already in
``sys.modules`` (whoever made the tensor imported it).  :func:`describe` gives the slow,
uniform view (:class:`TensorInfo`) used to validate a new call signature; the hot path reads
torch tensors directly (see ``_registry``).
"""

from __future__ import annotations

import math
import sys
from typing import Any

from ._record import record
from ._errors import ArgumentError

# dtype name (torch spelling) -> bytes per element
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
}

# __cuda_array_interface__ typestr -> dtype name ('<' and '|' spellings; '=' is native = little)
_TYPESTR = {
    "f8": "float64", "f4": "float32", "f2": "float16",
    "i8": "int64", "i4": "int32", "i2": "int16", "i1": "int8",
    "u8": "uint64", "u4": "uint32", "u2": "uint16", "u1": "uint8", "b1": "bool",
}

_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13
TORCH_TENSOR: list[Any] = [None]  # [torch.Tensor] once torch has been imported by someone
_TORCH_DTYPES: dict[Any, str] = {}


def torch_tensor_type() -> Any:
    """``torch.Tensor`` if torch is already imported, else ``None`` (never imports torch)."""
    cls = TORCH_TENSOR[0]
    if cls is None:
        mod = sys.modules.get("torch")
        cls = getattr(mod, "Tensor", None) if mod is not None else None
        TORCH_TENSOR[0] = cls
    return cls


def torch_dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (cached)."""
    name = _TORCH_DTYPES.get(dtype)
    if name is None:
        name = _TORCH_DTYPES[dtype] = str(dtype).removeprefix("torch.")
    return name


def key_value(value: Any) -> Any:
    """A compile-time key value as the manifest spells it: a torch dtype becomes its name, and a
    config object (any other non-scalar, e.g. a frozen dataclass given to ``KernelDecl.from_jit``'s
    grid) its ``repr``, which is its key in the manifest."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        return torch_dtype_name(value)
    return repr(value)


def key_text(key: Any) -> str:
    """A variant's key as ``{dtype='bfloat16', block_m=64}`` (the one spelling in every message)."""
    return "{" + ", ".join(f"{k}={v!r}" for k, v in key.items()) + "}"


@record
class TensorInfo:
    """A uniform view of one tensor argument (strides in elements; device -1 when not CUDA)."""

    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    ptr: int
    device: int
    where: str  # where the data is, for messages: "on cuda:0", "on the CPU", "in host memory"
    itemsize: int
    is_torch: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def is_tensor(obj: Any) -> bool:
    cls = torch_tensor_type()
    return (cls is not None and isinstance(obj, cls)) or hasattr(obj, "__cuda_array_interface__")


def describe(obj: Any, what: str) -> TensorInfo:
    """Read dtype, shape, strides, pointer and device of ``obj``; ``what`` names it in errors.

    Raises :class:`ArgumentError` for objects that are not tensors or whose dtype or strides
    cannot be read.
    """
    cls = torch_tensor_type()
    if cls is not None and isinstance(obj, cls):
        dev = obj.device
        index = obj.get_device() if dev.type == "cuda" else -1
        where = f"on {dev}" if index >= 0 else "on the CPU" if dev.type == "cpu" else f"on device {str(dev)!r}"
        return TensorInfo(torch_dtype_name(obj.dtype), tuple(obj.shape), tuple(obj.stride()), obj.data_ptr(),
                          index, where, obj.element_size(), True)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if not isinstance(cai, dict):
        raise ArgumentError(
            f"{what}: expected a CUDA tensor (torch.Tensor or an object with __cuda_array_interface__), "
            f"got {type(obj).__name__}"
        )
    return _describe_cai(obj, cai, what)


def _describe_cai(obj: Any, cai: dict, what: str) -> TensorInfo:
    dtype = cai_dtype(obj, cai.get("typestr", ""), what)
    size = ITEMSIZE[dtype]
    shape = tuple(int(d) for d in cai.get("shape", ()))
    ptr = int(cai.get("data", (0,))[0] or 0)
    raw = cai.get("strides")
    if raw is None:
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= max(d, 1)
        strides = tuple(reversed(strides))
    else:
        if any(int(s) % size for s in raw):
            raise ArgumentError(f"{what}: byte strides {tuple(raw)} are not multiples of the {size}-byte element")
        strides = tuple(int(s) // size for s in raw)
    device = cai_device(obj, ptr)
    where = f"on cuda:{device}" if device >= 0 else "in host memory"
    return TensorInfo(dtype, shape, strides, ptr, device, where, size, False)


def cai_dtype(obj: Any, typestr: str, what: str) -> str:
    """dtype name of a CUDA-array-interface object; void typestrs fall back to ``obj.dtype``'s name."""
    name = _TYPESTR.get(typestr[1:]) if typestr[:1] in "<|=" else None
    if name is None and typestr[1:2] == "V":
        guess = str(getattr(obj, "dtype", "")).removeprefix("torch.")
        if ITEMSIZE.get(guess) == int(typestr[2:] or 0):
            name = guess
    if name is None:
        raise ArgumentError(
            f"{what}: cannot map __cuda_array_interface__ typestr {typestr!r} to a dtype; "
            "pass a torch tensor, or give the object a .dtype naming one of " + ", ".join(ITEMSIZE)
        )
    return name


def cai_device(obj: Any, ptr: int) -> int:
    """Device ordinal from ``__dlpack_device__`` when present, else asked of the driver; -1 if not CUDA."""
    probe = getattr(obj, "__dlpack_device__", None)
    if probe is not None:
        kind, index = probe()
        return int(index) if int(kind) in (_KDL_CUDA, _KDL_CUDA_MANAGED) else -1
    if ptr == 0:
        return -1
    from ._driver import pointer_device

    return pointer_device(ptr)


def cai_signature(obj: Any) -> tuple | None:
    """Hashable description of a CAI object for the plan cache, or ``None`` if it is not one."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if not isinstance(cai, dict):
        return None
    strides = cai.get("strides")
    ptr = int(cai.get("data", (0,))[0] or 0)
    return ("cai", type(obj), cai.get("typestr"), tuple(cai.get("shape", ())),
            None if strides is None else tuple(strides), cai_device(obj, ptr))


def data_ptr(obj: Any) -> int:
    """The data pointer of a torch tensor or CAI object (the generic, slower path)."""
    get = getattr(obj, "data_ptr", None)
    if get is not None:
        return get()
    return int(obj.__cuda_array_interface__["data"][0] or 0)


def stream_handle(stream: Any) -> int:
    """An ``int`` CUstream handle from an int, a torch.cuda.Stream, a ``__cuda_stream__`` object or a CUstream."""
    if type(stream) is int:
        handle = stream
    elif isinstance(stream, bool):
        raise ArgumentError("stream=True/False is not a stream; pass a torch.cuda.Stream, a CUstream or an int handle")
    elif getattr(stream, "cuda_stream", None) is not None:
        handle = int(stream.cuda_stream)
    elif hasattr(stream, "__cuda_stream__"):
        handle = int(stream.__cuda_stream__()[1])
    else:
        try:
            handle = int(stream)
        except (TypeError, ValueError):
            raise ArgumentError(
                f"stream: expected an int handle, torch.cuda.Stream, CUstream or an object with "
                f"__cuda_stream__, got {type(stream).__name__}"
            ) from None
    if handle < 0:
        raise ArgumentError(f"stream handle must be >= 0, got {handle}")
    return handle


def torch_stream_getter() -> Any:
    """``f(device_index) -> raw current stream`` of torch, the cheap private call when it exists."""
    torch = sys.modules["torch"]
    fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fast is not None:
        return fast
    return lambda index: torch.cuda.current_stream(index).cuda_stream


# ------------------------------------------------------------------ torch's stable C shim (csrc/_hot_tensor.h)
# the entry points _hot.tensor_abi takes, in its order (torch/csrc/inductor/aoti_torch/c/shim.h)
SHIM_ENTRIES = ("aoti_torch_get_dim", "aoti_torch_get_sizes", "aoti_torch_get_strides", "aoti_torch_get_data_ptr",
                "aoti_torch_get_dtype", "aoti_torch_get_device_type", "aoti_torch_get_device_index")
_DEVICE_TYPES = {"cpu": 0, "cuda": 1}  # c10::DeviceType codes (fixed by torch's C ABI)
_SHIM: dict[Any, Any] = {}  # compiled module -> None (on) or why it is off, decided once per process


def tensor_shim(hot: Any) -> Any:
    """Let the compiled hot path ``hot`` read torch tensors through torch's stable C shim; None when it
    does, else why not (decided once per process, at the first Launcher made after torch was imported).

    The shim's getters read a tensor's dim, sizes, strides, data pointer, dtype and device in a few ns
    each, where the Python accessors cost 50-150 ns; ``hot.tensor_abi`` checks them against the
    accessors on probe tensors first (csrc/_hot_tensor.h) and stays off on any difference.
    ``TILEBIN_TENSOR_SHIM=off`` keeps the accessors."""
    if hot in _SHIM:
        return _SHIM[hot]
    torch = sys.modules.get("torch")
    if torch is None:
        return "torch is not imported"  # not remembered: a later Launcher asks again
    from . import _settings

    why = enable_shim(hot, torch) if _settings.tensor_shim() else f"{_settings.TENSOR_SHIM.name}=off"
    _SHIM[hot] = why
    return why


def enable_shim(hot: Any, torch: Any, tensor_type: Any = None, gpu_type: int = 1) -> Any:
    """Resolve the shim's entry points in the libtorch_cpu this process has loaded (never loading it)
    and hand them, with probe tensors of ``tensor_type`` (default ``torch.Tensor``), to
    ``hot.tensor_abi``; None when on, else why not.  ``gpu_type``: the c10::DeviceType that counts as
    the GPU (CUDA; the CPU tests pass 0)."""
    import ctypes
    import os

    try:
        tensor_type = tensor_type or torch.Tensor
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"),
                          mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # only the library torch has loaded already
        entries = tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in SHIM_ENTRIES)
        probes = tuple(_probe(t, t if tensor_type is torch.Tensor else t.as_subclass(tensor_type))
                       for t in _probe_tensors(torch))
        return hot.tensor_abi(entries, tensor_type, probes, gpu_type)
    except Exception as exc:  # noqa: BLE001 - no usable shim (an older torch, a stand-in module): the accessors
        return f"torch's stable C shim is not usable here ({type(exc).__name__}: {exc})"


def _probe_tensors(torch: Any) -> list:
    """CPU tensors of every dtype this torch has, and of odd shapes: views with offsets, transposes,
    broadcast (stride 0), empty, 0-dim and 6-D (sizes stored out of line)."""
    base = torch.empty(2, 3, 5)  # (no values are read: torch.empty spares a cold process arange's first call)
    tensors = [base, base.transpose(0, 2), base[1:, ::2, 1:], torch.empty(0, 7), torch.tensor(3.0),
               torch.empty(3, 1).expand(3, 4), torch.empty(1, 2, 1, 3, 1, 2), base.view(torch.int32)[:, 1]]
    for name in ITEMSIZE:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            continue  # not a dtype of this torch: its tensors read through the accessors
        try:
            tensors.append(torch.empty(3, dtype=dtype))
        except (TypeError, RuntimeError):  # a dtype torch.empty does not make: read through the accessors
            pass
    return tensors


def _probe(t: Any, obj: Any = None) -> tuple:
    """``obj`` (default ``t``, else a subclass view of it) with what the accessors read of ``t``."""
    obj = t if obj is None else obj
    return (obj, obj._cdata, t.dim(), tuple(t.shape), tuple(t.stride()), t.data_ptr(), t.dtype,
            _DEVICE_TYPES.get(t.device.type, -2), -1 if t.device.index is None else t.device.index)


def op_key(nparams: int, entries: tuple) -> Any:
    """An op layer's compiled memo key for its tensors (``csrc/_hot_opkey.h``: ``OpKey(nparams,
    entries).key``), or None when Launchers use the Python twin or torch tensors are read through
    their Python accessors (:func:`tensor_shim`).  ``tilebin.ops`` builds one per op."""
    from ._launcher import hot_module

    hot = hot_module()
    if hot is None or tensor_shim(hot) is not None:
        return None
    return hot.OpKey(nparams, entries)
