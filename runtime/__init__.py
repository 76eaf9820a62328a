"""tilebin.runtime: launch the prebuilt sm_90a cubins shipped in the wheel, with cuda-python only.

::

    from tilebin import runtime
    runtime.launch("transpose.batched_transpose", x, out)      # validated, cached plan per signature
    call = runtime.prepare("transpose.batched_transpose", x, out)
    call()                                                      # the same launch, validated once

Importing this package does no work: it imports neither torch, numpy nor cuda.bindings
(the driver is loaded at the first launch).  The module-level functions use a default
:class:`Registry` created lazily (thread-safe) from ``$TILEBIN_ARTIFACTS_DIR`` or, when
unset, the artifacts inside the installed wheel; names it lacks are searched in
``$TILEBIN_KERNEL_PATH``'s folders and the registries given to :func:`add_artifacts`
(``_search.py``).  Your own kernels: ``Registry.for_package("mypkg")``.
"""

from __future__ import annotations

from typing import Any

from ._errors import ArgumentError, ArtifactError, DeviceError, NoVariantError, TilebinError, UnknownKernelError
from ._manifest import SCHEMA_VERSION, KernelSpec
from ._launcher import Launcher, PreparedCall, hot_module
from ._dispatch import is_internal
from . import _search
from ._registry import _DEFAULT, Registry, default_registry

UncheckedLauncher = Launcher  # the name the op layer's annotations use

__all__ = [
    "launch", "prepare", "unchecked_launcher", "kernel_names", "add_artifacts", "is_internal", "spec", "hot_path", "Registry",
    "PreparedCall", "Launcher", "UncheckedLauncher", "KernelSpec",
    "TilebinError", "NoVariantError", "UnknownKernelError", "ArgumentError", "ArtifactError", "DeviceError",
    "SCHEMA_VERSION",
]


def _launch_python(name: str, *args: Any, stream: Any = None, **kwargs: Any) -> None:
    """Launch kernel ``name`` from the default registry; see :meth:`Registry.launch`.

    ``args`` follow ``spec(name).params``; ``kwargs`` are scalar parameters by name or
    compile-time key values that pin the variant.  Everything is validated before any GPU
    work; raises :class:`NoVariantError` (:class:`UnknownKernelError` for an unknown name),
    :class:`ArgumentError`, :class:`ArtifactError` or :class:`DeviceError`.  Asynchronous on
    ``stream`` (default: torch's current stream for torch tensors, else stream 0); thread-safe;
    capturable in CUDA graphs.
    """
    reg = _DEFAULT[0] or default_registry()
    (reg._entries.get(name) or reg._entry(name)).launch(args, kwargs, stream)


def _launch_front() -> Any:
    """What ``launch`` is: the ``launch`` method of the compiled front (``_hot.Front``,
    csrc/_hot_dispatch.h: a plan-cache hit with no Python frame and no argument tuple, everything
    else handed to :func:`_launch_python`) when the compiled hot path is chosen, else
    :func:`_launch_python` itself.  Same behaviour either way."""
    try:
        hot = hot_module()
    except TilebinError:  # TILEBIN_HOT_PATH=c without a loadable extension: the first Launcher says so
        hot = None
    front = getattr(hot, "Front", None)
    return _launch_python if front is None else front(_DEFAULT, _launch_python).launch


launch = _launch_front()


def prepare(name: str, *args: Any, **kwargs: Any) -> PreparedCall:
    """Validate a call once; the returned :class:`PreparedCall` re-launches it (``call(stream=None)``).

    For loops that launch the same kernel on the same (static) buffers: each call skips the
    per-call signature lookup of :func:`launch`.  See :meth:`Registry.prepare`.
    """
    return default_registry().prepare(name, *args, **kwargs)


def unchecked_launcher(name: str, **key: Any) -> Launcher:
    """A launcher of one variant (key given in full) that skips all argument validation.

    For op layers (``tilebin.ops``) that validate their own arguments and allocate their own
    outputs: ``launcher(*args)`` reads sizes, strides and pointers and launches, whatever the
    shape, with no per-shape plan.  A wrong call reads or writes out of bounds.  See
    :meth:`Registry.unchecked_launcher`.
    """
    return default_registry().unchecked_launcher(name, **key)


def add_artifacts(artifacts: Any) -> Registry:
    """Put a :class:`Registry` (or an artifacts folder) on the search path of :func:`launch`,
    :func:`prepare`, :func:`spec` and :func:`kernel_names`, after tilebin's own artifacts and
    ``$TILEBIN_KERNEL_PATH``'s folders; returns the registry.  A package that ships its own
    kernels calls ``runtime.add_artifacts(Registry.for_package("mypkg"))`` once.  A kernel name
    already on the path raises :class:`ArtifactError`; ``tilebin.ops`` never launches from it."""
    return _search.add(default_registry(), artifacts)


def hot_path() -> str:
    """``"c"`` when Launchers use the compiled hot path (``tilebin.runtime._hot``), ``"python"`` when
    they use the pure-Python twin (the extension did not load, or ``TILEBIN_HOT_PATH=python``)."""
    return "python" if hot_module() is None else "c"


def kernel_names(*, internal: bool = False) -> list[str]:
    """The production kernels of the default registry, sorted: what ``launch`` is for.

    Internal kernels -- the ``testing`` family (runtime feature tests) and the demo
    ``testing.gemm_nt`` (see :func:`is_internal`) -- are left out unless ``internal=True``;
    they stay launchable by name.
    """
    return default_registry().kernel_names(internal=internal)


def spec(name: str) -> KernelSpec:
    """The :class:`KernelSpec` of ``name`` in the default registry.

    Raises :class:`UnknownKernelError` (a :class:`NoVariantError`) naming close names if unknown.
    """
    return default_registry().spec(name)
