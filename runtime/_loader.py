"""Per-device module loading: each cubin is read once, checksum-verified, loaded once per device.

Cubins are content-addressed by their sha256, so two variants sharing bytes share one
module.  Loading is lazy (first launch on a device), thread-safe (one lock, double-checked),
and never repeated.  Functions get their dynamic shared memory limit raised once, to the
largest amount any launch asks of them.
"""

from __future__ import annotations

import hashlib
import threading
try:  # Python 3.11+
    from importlib.resources.abc import Traversable
except ImportError:  # Python 3.10: the same protocol, under its older name
    from importlib.abc import Traversable
from typing import Any

from . import _driver
from ._errors import ArtifactError, DeviceError
from ._record import Factory, record
from ._tensors import key_text

_DEFAULT_SMEM = 48 * 1024  # what a kernel may use without opting in


def verify_cubin(data: bytes, expected: str, *, kernel: str, key: str, path: str) -> None:
    """Raise :class:`ArtifactError` unless ``sha256(data)`` equals ``expected`` (hex)."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected.lower():
        raise ArtifactError(
            f"cubin {path} of kernel {kernel!r} variant {key} fails its checksum: expected sha256 {expected}, "
            f"got {actual}; the installed artifacts are damaged or mixed up: reinstall the wheel"
        )


def cubin_path(root: Traversable, relative: str, kernel: str) -> Traversable:
    """``root / relative``, refusing absolute paths and ``..`` (the manifest is data, not a path oracle)."""
    parts = relative.replace("\\", "/").split("/")
    if not relative or relative.startswith("/") or ".." in parts or any(":" in p for p in parts):
        raise ArtifactError(f"kernel {kernel!r}: cubin path {relative!r} must be relative inside the artifacts folder")
    node = root
    for p in parts:
        if p and p != ".":
            node = node / p
    return node


@record(frozen=False)
class LoadedFunction:
    """A ``CUfunction`` in one device's primary context, and the dynamic smem it is opted in to."""

    handle: Any
    static_smem: int
    smem_limit: int = _DEFAULT_SMEM


@record(frozen=False)
class _Module:
    handle: Any
    image: bytes  # kept alive with the module: the driver may read it again when it loads lazily
    functions: dict[str, LoadedFunction] = Factory(dict)


class Loader:
    """Loads a registry's cubins on demand; one instance per :class:`Registry`.  Thread-safe."""

    def __init__(self, root: Traversable) -> None:
        self._root = root
        self._lock = threading.Lock()
        self._modules: dict[tuple[str, int], _Module] = {}

    def function(self, kernel: str, variant: Any, entry: str, smem: int, dev: _driver.DeviceInfo) -> LoadedFunction:
        """The loaded ``entry`` of ``variant``'s cubin on ``dev``, opted in to ``smem`` dynamic bytes.

        The caller has made ``dev``'s context current.  Raises :class:`ArtifactError` (missing or
        corrupt cubin) or :class:`DeviceError` (driver failure, or ``smem`` above the device limit).
        """
        where = f"kernel {kernel!r} variant {key_text(variant.key)}"
        with self._lock:
            mod = self._modules.get((variant.sha256, dev.ordinal))
            if mod is None:
                mod = self._load(kernel, variant, dev, where)
                self._modules[(variant.sha256, dev.ordinal)] = mod
            fn = mod.functions.get(entry)
            if fn is None:
                fn = mod.functions[entry] = self._get(mod, entry, dev, where)
            if smem > fn.smem_limit:
                self._opt_in(fn, smem, dev, f"{where}, entry {entry}")
            return fn

    def _read(self, variant: Any, where: str) -> bytes:
        path = cubin_path(self._root, variant.cubin, where)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ArtifactError(
                f"{where}: cannot read cubin {variant.cubin} under {self._root} ({exc}); reinstall the wheel "
                "or point TILEBIN_ARTIFACTS_DIR at a complete build"
            ) from None

    def _load(self, kernel: str, variant: Any, dev: _driver.DeviceInfo, where: str) -> _Module:
        data = self._read(variant, where)
        verify_cubin(data, variant.sha256, kernel=kernel, key=key_text(variant.key), path=variant.cubin)
        mod = _driver.driver()
        handle = _driver.check(mod.cuModuleLoadData(data), "cuModuleLoadData", f"{where} on {dev.describe()}")
        return _Module(handle, data)

    def _get(self, module: _Module, entry: str, dev: _driver.DeviceInfo, where: str) -> LoadedFunction:
        mod = _driver.driver()
        ctx = f"{where}, entry {entry}, on {dev.describe()}"
        handle = _driver.check(mod.cuModuleGetFunction(module.handle, entry.encode()), "cuModuleGetFunction", ctx)
        attr = mod.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
        static = _driver.check(mod.cuFuncGetAttribute(attr, handle), "cuFuncGetAttribute(SHARED_SIZE_BYTES)", ctx)
        return LoadedFunction(handle, int(static))

    def _opt_in(self, fn: LoadedFunction, smem: int, dev: _driver.DeviceInfo, where: str) -> None:
        if smem + fn.static_smem > dev.smem_optin:
            raise DeviceError(
                f"{where}: needs {smem} bytes of dynamic + {fn.static_smem} static shared memory per block, but "
                f"{dev.describe()} allows at most {dev.smem_optin}; this variant does not fit this GPU: "
                "pick a variant with smaller tiles"
            )
        mod = _driver.driver()
        attr = mod.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _driver.check(mod.cuFuncSetAttribute(fn.handle, attr, smem),
                      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", f"{where} on {dev.describe()}")
        fn.smem_limit = smem
