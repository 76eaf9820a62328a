"""Every environment variable tilebin's runtime reads, declared once, typed.

Nothing here is read at import time: each accessor reads the environment when called
(the default registry calls them once, when it is created).  No other module calls
``os.getenv`` / ``os.environ``.
"""

from __future__ import annotations

import os
from importlib.resources import files
try:  # Python 3.11+
    from importlib.resources.abc import Traversable
except ImportError:  # Python 3.10: the same protocol, under its older name
    from importlib.abc import Traversable
from pathlib import Path

from ._errors import TilebinError
from ._record import record


@record
class EnvVar:
    """One environment variable: its name, what it does, and its default (as text)."""

    name: str
    doc: str
    default: str | None = None

    def raw(self) -> str | None:
        value = os.environ.get(self.name)
        return self.default if value is None or value == "" else value


ARTIFACTS_DIR = EnvVar(
    "TILEBIN_ARTIFACTS_DIR",
    "folder holding tilebin's own manifest.json and cubins (a build from a checkout); default: the artifacts "
    "inside the installed wheel; for your own kernels use TILEBIN_KERNEL_PATH or Registry.for_package",
)
KERNEL_PATH = EnvVar(
    "TILEBIN_KERNEL_PATH",
    "more artifacts folders (os.pathsep-separated) that runtime.launch searches, in order, for kernel names "
    "tilebin's own artifacts do not have (your own kernels built with tilebin.aot); tilebin.ops never uses them",
)
PLAN_CACHE_SIZE = EnvVar(
    "TILEBIN_PLAN_CACHE_SIZE",
    "prepared launch plans kept per kernel (one per distinct call signature); older half dropped when full",
    "1024",
)

HOT_PATH = EnvVar(
    "TILEBIN_HOT_PATH",
    "which launch hot path Launchers use: auto (the compiled extension tilebin.runtime._hot when it loads, "
    "else the pure-Python Launcher), c (require the extension), python (force the pure-Python Launcher)",
    "auto",
)

TENSOR_SHIM = EnvVar(
    "TILEBIN_TENSOR_SHIM",
    "how the compiled hot path reads torch tensors: auto (through torch's stable C shim, aoti_torch_get_*, when "
    "torch has it and it passes a self-check against the Python accessors at the first Launcher; else the "
    "accessors), off (always torch's Python accessors)",
    "auto",
)

DRIVER = EnvVar(
    "TILEBIN_DRIVER",
    "how the runtime calls the CUDA driver: auto (ctypes on libcuda.so.1 for its own calls, which spares a cold "
    "start the ~20 ms import of cuda.bindings; cuda-python where libcuda.so.1 cannot be opened that way and for "
    "the pure-Python launch path), cuda-python (cuda.bindings for every call)",
    "auto",
)

ALL = (ARTIFACTS_DIR, KERNEL_PATH, PLAN_CACHE_SIZE, HOT_PATH, TENSOR_SHIM, DRIVER)


def artifacts_dir() -> Traversable:
    """``$TILEBIN_ARTIFACTS_DIR`` if set, else ``tilebin/_artifacts`` inside the installed package."""
    raw = ARTIFACTS_DIR.raw()
    if raw is not None:
        return Path(raw).expanduser()
    return files("tilebin") / "_artifacts"


def plan_cache_size() -> int:
    """``$TILEBIN_PLAN_CACHE_SIZE`` as a positive int; raises :class:`TilebinError` if malformed."""
    raw = PLAN_CACHE_SIZE.raw()
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise TilebinError(
            f"{PLAN_CACHE_SIZE.name}={raw!r} is not a positive integer; "
            f"unset it or give a count such as {PLAN_CACHE_SIZE.default}"
        )
    return value


def hot_path() -> str:
    """``$TILEBIN_HOT_PATH``: ``auto``, ``c`` or ``python``; raises :class:`TilebinError` otherwise."""
    raw = (HOT_PATH.raw() or "auto").strip().lower()
    if raw not in ("auto", "c", "python"):
        raise TilebinError(f"{HOT_PATH.name}={raw!r} is not one of auto, c, python; unset it or pick one of those")
    return raw


def driver() -> str:
    """``$TILEBIN_DRIVER``: ``auto`` or ``cuda-python``; raises :class:`TilebinError` otherwise."""
    raw = (DRIVER.raw() or "auto").strip().lower()
    if raw not in ("auto", "cuda-python"):
        raise TilebinError(f"{DRIVER.name}={raw!r} is not one of auto, cuda-python; unset it or pick one of those")
    return raw


def tensor_shim() -> bool:
    """``$TILEBIN_TENSOR_SHIM``: True for ``auto``, False for ``off``; raises :class:`TilebinError` otherwise."""
    raw = (TENSOR_SHIM.raw() or "auto").strip().lower()
    if raw not in ("auto", "off"):
        raise TilebinError(f"{TENSOR_SHIM.name}={raw!r} is not one of auto, off; unset it or pick one of those")
    return raw == "auto"
