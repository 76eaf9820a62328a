"""Build-time errors, and how a kernel module's mistakes become one: each names the module, the
file:line and the fix, so the CLI prints one ``tilebin.aot: error:`` line, never a traceback."""

from __future__ import annotations

import importlib
import pathlib
import sys
import traceback
from typing import Any

from tilebin.kernels._declare import DeclarationError, KernelDecl, is_tilelang_jit

_DECLARE_PY = pathlib.Path(sys.modules[KernelDecl.__module__].__file__ or "").resolve()


class AotError(Exception):
    """The AOT build cannot produce a correct artifact; the message says why and what to change."""


def kernel_declarations(module: str) -> list:
    """The module's KERNELS, each checked to be a valid declaration (see :func:`check_declaration`)."""
    decls = getattr(_import_kernel_module(module), "KERNELS", None)
    if decls is None or (isinstance(decls, (list, tuple)) and not decls):
        raise AotError(f"{module}: declares no kernels (KERNELS is missing or empty); "
                       f"export KERNELS = (KernelDecl(...), ...)")
    if not isinstance(decls, (list, tuple)):
        raise AotError(f"{module}: KERNELS must be a list or tuple of KernelDecl (got {type(decls).__name__}); "
                       f"write KERNELS = (KernelDecl(...), ...)")
    return [check_declaration(d, f"{module}: KERNELS[{i}]") for i, d in enumerate(decls)]


def _import_kernel_module(module: str):
    """Import a kernel module; any failure (a syntax error too) is one AotError naming its file:line."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise AotError(_missing_module_message(module, exc)) from exc
    except SyntaxError as exc:
        raise AotError(f"{exc.filename}:{exc.lineno}: syntax error while importing kernel module {module}: "
                       f"{exc.msg}") from exc
    except DeclarationError as exc:
        raise AotError(f"{module}: {_raise_site(exc, module)}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 -- whatever the module raises while it runs
        raise AotError(f"{_raise_site(exc, module)}: importing kernel module {module} raised "
                       f"{type(exc).__name__}: {exc}") from exc


def _missing_module_message(module: str, exc: ModuleNotFoundError) -> str:
    """Either the kernel module is not found, or it is and one of its own imports is not."""
    missing = exc.name or ""
    if not missing or missing == module or module.startswith(missing + "."):
        return f"cannot import kernel module {module!r}: {exc}; is it on sys.path / PYTHONPATH?"
    fix = ('install TileLang: pip install "tilebin[aot]"' if missing.split(".")[0] in ("tilelang", "tvm")
           else f"install {missing.split('.')[0]!r} or make it importable")
    return (f"{module}: {_raise_site(exc, module)}: kernel module {module} was found, but importing it failed: "
            f"its import of {missing!r} raised {exc}; {fix}")


def _raise_site(exc: BaseException, module: str) -> str:
    """``file:line`` of the deepest frame in the user's code (not importlib's, not KernelDecl's checks)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not frame.filename.startswith("<") and pathlib.Path(frame.filename).resolve() != _DECLARE_PY:
            return f"{frame.filename}:{frame.lineno}"
    return getattr(sys.modules.get(module), "__file__", None) or module


def check_declaration(decl: Any, where: str) -> Any:
    """``decl`` when it is a KernelDecl, or an object with the same attributes that passes the same
    checks; else an AotError naming ``where`` and the fix."""
    if isinstance(decl, KernelDecl):
        return decl
    if is_tilelang_jit(decl):
        raise AotError(f"{where} is a @tilelang.jit kernel, not a KernelDecl; declare it with "
                       f"KernelDecl.from_jit(name, jit_fn, grid=...)")
    missing = [a for a in ("name", "factory", "grid") if not hasattr(decl, a)]
    if missing:
        raise AotError(f"{where} is a {type(decl).__name__}, not a KernelDecl (it has no {', '.join(missing)}); "
                       f"declare it with KernelDecl(name, factory, grid)")
    try:
        KernelDecl(decl.name, decl.factory, tuple(decl.grid), outputs=tuple(getattr(decl, "outputs", ())),
                   align=getattr(decl, "align", 16), pass_configs=dict(getattr(decl, "pass_configs", {})))
    except (TypeError, ValueError) as exc:
        raise AotError(f"{where}: {exc}") from None
    return decl
