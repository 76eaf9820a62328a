"""The kernel search path of ``runtime.launch``: where a name not in tilebin's own artifacts is looked up.

In order:

1. tilebin's own artifacts (the default registry: the wheel's, or ``$TILEBIN_ARTIFACTS_DIR``);
   ``tilebin.ops`` only ever launches these, so nothing added below can change an op;
2. the artifacts folders listed in ``$TILEBIN_KERNEL_PATH`` (``os.pathsep``-separated), in
   order, read at the first lookup of a name that (1) does not have;
3. registries added with :func:`add_artifacts` (a package that ships its own kernels adds its
   :meth:`Registry.for_package` registry), in the order added.

A kernel name may live in one place only: a folder or registry that repeats a name already on
the path is refused (:class:`ArtifactError` naming both), so which cubin runs never depends on
the order of imports.  A library may also skip the path entirely and launch from its own
registry (``Registry.for_package("mypkg").launch(...)``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _settings
from ._errors import ArtifactError

if TYPE_CHECKING:
    from ._registry import Registry

_LOCK = threading.RLock()
_ADDED: list[Registry] = []
_FROM_ENV: list[list[Registry] | None] = [None]


def _env_registries(own: Registry) -> list[Registry]:
    """The registries of ``$TILEBIN_KERNEL_PATH``'s folders, created once."""
    if _FROM_ENV[0] is None:
        from ._registry import Registry

        regs: list[Registry] = []
        raw = _settings.KERNEL_PATH.raw() or ""
        for folder in (p for p in raw.split(os.pathsep) if p.strip()):
            reg = Registry(Path(folder).expanduser())
            _check_new(reg, [own, *regs], f"{_settings.KERNEL_PATH.name} entry {folder!r}")
            regs.append(reg)
        _FROM_ENV[0] = regs
    return _FROM_ENV[0]


def registries(own: Registry) -> list[Registry]:
    """The search path after ``own``: ``$TILEBIN_KERNEL_PATH``'s registries, then the added ones."""
    with _LOCK:
        return [*_env_registries(own), *_ADDED]


def find(own: Registry, name: str) -> Registry | None:
    """The registry on the path after ``own`` whose manifest has kernel ``name``, else None."""
    for reg in registries(own):
        if name in reg.manifest.kernels:
            return reg
    return None


def names(own: Registry) -> list[str]:
    """Every kernel name on the path after ``own``."""
    return [n for reg in registries(own) for n in reg.manifest.kernels]


def add(own: Registry, artifacts: Any) -> Registry:
    """Put a registry (or an artifacts folder) on the path; returns the registry.  Adding the same
    registry or folder twice is a no-op; a kernel name already on the path is an ArtifactError."""
    from ._registry import Registry

    reg = artifacts if isinstance(artifacts, Registry) else Registry(artifacts)
    with _LOCK:
        on_path = [own, *_env_registries(own), *_ADDED]
        for r in on_path:
            if r is reg or _same_folder(r, reg):
                return r
        _check_new(reg, on_path, f"artifacts {reg.artifacts_dir}")
        _ADDED.append(reg)
    return reg


def _same_folder(a: Registry, b: Registry) -> bool:
    return str(a.artifacts_dir) == str(b.artifacts_dir)


def _check_new(reg: Registry, on_path: list[Registry], what: str) -> None:
    for other in on_path:
        clash = sorted(set(reg.manifest.kernels) & set(other.manifest.kernels))
        if clash:
            shown = ", ".join(clash[:5]) + (f" (+{len(clash) - 5} more)" if len(clash) > 5 else "")
            raise ArtifactError(
                f"{what} declares kernel(s) {shown}, already provided by {other.artifacts_dir}; a kernel name "
                "may come from one place only: rename the kernels (use your own family prefix, e.g. "
                "'mypkg_quant.cast') or launch them from their own Registry"
            )


def reset() -> None:
    """Forget the path (tests): ``$TILEBIN_KERNEL_PATH`` is read again at the next lookup."""
    with _LOCK:
        _ADDED.clear()
        _FROM_ENV[0] = None
