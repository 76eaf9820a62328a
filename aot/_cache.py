"""The incremental build cache: one entry per job, keyed by everything that changes its bytes."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile
from functools import lru_cache
from typing import Any

from ._lower import Job, JobResult

_AOT_DIR = pathlib.Path(__file__).resolve().parent
_MANIFEST_PY = _AOT_DIR.parent / "runtime" / "_manifest.py"


def code_bytes(path: pathlib.Path) -> bytes:
    """What of a Python file can change a cubin: its AST with docstrings removed (comments, blank
    lines, formatting and line numbers are not in it).  A file that does not parse: its raw bytes."""
    raw = path.read_bytes()
    try:
        tree = ast.parse(raw, filename=str(path))
    except (SyntaxError, ValueError):
        return raw
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def _tree_digest(root: pathlib.Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode() + b"\0" + code_bytes(path) + b"\0")
    return h.hexdigest()


def source_digest(module: str) -> str:
    """Digest of the module's source and of every file of its top-level package it imports.

    The closure follows ``import``/``from ... import`` statements (relative ones, and absolute
    ones into the same top-level package, including ``tilebin.kernels`` as the checkout maps it),
    transitively, plus the ``__init__.py`` of every package on the way (they run on import).
    Editing one kernel file so rebuilds that kernel and the kernels importing it, not every
    kernel of the package; an edit of comments or docstrings only rebuilds nothing (see
    :func:`code_bytes`).  A module imported dynamically (importlib) is not seen: import it
    statically.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module)
    origin = pathlib.Path(spec.origin).resolve()
    root = origin.parent
    while (root.parent / "__init__.py").exists():
        root = root.parent
    files = sorted(_import_closure(origin, root))
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0" + code_bytes(path) + b"\0")
    return h.hexdigest()


def _import_closure(start: pathlib.Path, root: pathlib.Path) -> set[pathlib.Path]:
    """``start`` and the files under ``root`` it imports, transitively, with their packages' __init__s."""
    seen: set[pathlib.Path] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        todo += _package_inits(path, root)
        todo += _imported_files(path, root)
    return seen


def _package_inits(path: pathlib.Path, root: pathlib.Path) -> list[pathlib.Path]:
    inits, folder = [], path.parent
    while folder == root or root in folder.parents:
        inits.append(folder / "__init__.py")
        folder = folder.parent
    return inits


def _imported_files(path: pathlib.Path, root: pathlib.Path) -> list[pathlib.Path]:
    """Files under ``root`` that ``path``'s import statements name (modules and ``from pkg import mod``)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError:
        return []  # lowering will report it; the file itself is in the digest
    package = path.parent
    found: list[pathlib.Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.parent
            else:
                base = _absolute_base(node.module or "", root)
                if base is None:
                    continue
            parts = (node.module or "").split(".") if node.level and node.module else []
            target = base.joinpath(*parts) if parts else base
            found += _module_files(target)
            for alias in node.names:  # `from pkg import mod` may name a submodule
                found += _module_files(target / alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                base = _absolute_base(alias.name, root)
                if base is not None:
                    found += _module_files(base)
    return found


def _absolute_base(dotted: str, root: pathlib.Path) -> pathlib.Path | None:
    """The path an absolute module name maps to under ``root`` (``tilebin.kernels.x`` in the checkout
    maps ``kernels/x``), or None when it lies outside the package."""
    parts = dotted.split(".")
    if parts[:2] == ["tilebin", root.name]:
        parts = parts[2:]
    elif parts[:1] == [root.name]:
        parts = parts[1:]
    else:
        return None
    return root.joinpath(*parts)


def _module_files(target: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in (target.with_suffix(".py"), target / "__init__.py") if p.is_file()]


@lru_cache(maxsize=None)
def _builder_digest() -> str:
    """This build tool's own code and the manifest schema it writes (read once per process)."""
    schema = code_bytes(_MANIFEST_PY) if _MANIFEST_PY.exists() else b""
    return hashlib.sha256(_tree_digest(_AOT_DIR).encode() + schema).hexdigest()


def job_key(job: Job, source: str, tool_facts: dict[str, Any]) -> str:
    payload = {
        "job": [job.module, job.kernel, sorted(job.variant)],
        "source": source,
        "tools": tool_facts,
        "builder": _builder_digest(),
        "python": sys.version_info[:2],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def load(cache_dir: pathlib.Path, key: str, job: Job) -> JobResult | None:
    entry = cache_dir / key[:2] / key
    try:
        meta = json.loads((entry / "result.json").read_text())
        cubin = (entry / "kernel.cubin").read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(cubin).hexdigest() != meta["variant"]["sha256"]:
        return None  # a damaged entry is rebuilt, never trusted
    return JobResult(job, meta["variant"], meta["params"], cubin, 0.0, 0.0)


def store(cache_dir: pathlib.Path, key: str, result: JobResult) -> None:
    """Write the entry into a temp dir and rename it into place (atomic for readers)."""
    entry = cache_dir / key[:2] / key
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
    (tmp / "kernel.cubin").write_bytes(result.cubin)
    (tmp / "result.json").write_text(json.dumps({"variant": result.variant, "params": result.params}, sort_keys=True))
    try:
        os.replace(tmp, entry)
    except OSError:  # another build stored the same entry first
        shutil.rmtree(tmp, ignore_errors=True)
