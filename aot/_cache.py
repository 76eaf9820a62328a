"""The incremental build cache: one entry per job, keyed by everything that changes its bytes."""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import shutil
import site
import sys
import sysconfig
import tempfile
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from ._lower import Job, JobResult

_AOT_DIR = pathlib.Path(__file__).resolve().parent
_MANIFEST_PY = _AOT_DIR.parent / "runtime" / "_manifest.py"
_DECLARE_PY = _AOT_DIR.parent / "kernels" / "_declare.py"  # KernelDecl.from_jit's factory runs in every job


def code_bytes(path: pathlib.Path) -> bytes:
    """What of a Python file can change a cubin: its AST with docstrings removed (comments, blank
    lines, formatting and line numbers are not in it).  A file that does not parse: its raw bytes."""
    return _parsed(path)[0]


# (path, mtime_ns, size) -> (code bytes, import statements): every kernel module's closure shares
# files (the declaration module, package __init__s, helpers), each parsed once per version
_PARSED: dict[tuple[str, int, int], tuple[bytes, tuple[tuple[str, int, tuple[str, ...]], ...]]] = {}


def _parsed(path: pathlib.Path) -> tuple[bytes, tuple[tuple[str, int, tuple[str, ...]], ...]]:
    """The file's code bytes and its import statements as (module, level, names): ``import a.b`` is
    ("a.b", 0, ()), ``from ..x import y`` ("x", 2, ("y",)), ``import_module("a.b")`` ("a.b", 0, ())."""
    st = path.stat()
    memo = (str(path), st.st_mtime_ns, st.st_size)
    if memo not in _PARSED:
        raw = path.read_bytes()
        try:
            tree = ast.parse(raw, filename=str(path))
        except (SyntaxError, ValueError):
            _PARSED[memo] = (raw, ())  # importing it will report it; the file counts by its bytes
        else:
            imports = _strip_docstrings_and_list_imports(tree)
            _PARSED[memo] = (ast.dump(tree).encode(), imports)
    return _PARSED[memo]


def _strip_docstrings_and_list_imports(tree: ast.AST) -> tuple[tuple[str, int, tuple[str, ...]], ...]:
    imports = []
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
        if _is_declaration(node):  # doc= goes to the manifest from the declaration, never into a cubin
            node.keywords = [k for k in node.keywords if k.arg != "doc"]
        if isinstance(node, ast.Import):
            imports += [(alias.name, 0, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            imports.append((node.module or "", node.level, tuple(alias.name for alias in node.names)))
        elif _is_literal_import_call(node):
            imports.append((node.args[0].value, 0, ()))
    return tuple(imports)


def _is_declaration(node: ast.AST) -> bool:
    """A ``KernelDecl(...)`` or ``KernelDecl.from_jit(...)`` call (however KernelDecl was imported)."""
    if not isinstance(node, ast.Call):
        return False
    fn = node.func
    if isinstance(fn, ast.Attribute) and fn.attr == "from_jit":
        fn = fn.value
    name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
    return name == "KernelDecl"


def _tree_digest(root: pathlib.Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode() + b"\0" + code_bytes(path) + b"\0")
    return h.hexdigest()


def source_digest(module: str) -> str:
    """Digest of the module's import closure: its own code and that of every module it imports.

    The closure follows static ``import``/``from ... import`` statements (absolute and relative,
    at any depth of the file, plus ``importlib.import_module("literal")`` calls), across
    packages and sibling top-level modules, transitively, with the ``__init__.py`` of every
    package on the way (they run on import).  It stops at modules of the Python installation
    and of site-packages: TileLang's code counts by its version (in the key's tool facts), and
    a pip-installed helper package by nothing, so install your own kernel helpers editable
    (``pip install -e``) or keep them on sys.path.  Each file counts by its code (see
    :func:`code_bytes`): an edit of comments or docstrings only rebuilds nothing.  Files are
    named by module name, not path, so the key is the same in every checkout.

    Not seen: a module imported dynamically with a computed name (``import_module(f"...")``,
    ``__import__(name)``) or by exec; import it statically, or clear the cache after editing it.
    """
    h = hashlib.sha256()
    for name, path in sorted(import_closure(module).items()):
        h.update(name.encode() + b"\0" + code_bytes(path) + b"\0")
    return h.hexdigest()


def import_closure(module: str) -> dict[str, pathlib.Path]:
    """``{module name: source file}`` of ``module`` and everything it imports statically, outside
    the Python installation and site-packages (see :func:`source_digest`)."""
    if _source_file(module) is None:
        raise ModuleNotFoundError(f"no Python source found for module {module!r}", name=module)
    found: dict[str, pathlib.Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = _source_file(name)
        if path is None:
            continue
        found[name] = path
        todo += _parents(name)
        todo += _imported_names(path, _package_of(name, path))
    return found


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _package_of(name: str, path: pathlib.Path) -> str:
    """The package a module's relative imports start from (a package's ``__init__`` is its own)."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imported_names(path: pathlib.Path, package: str) -> list[str]:
    """Module names ``path``'s import statements name: ``import a.b`` gives a.b; ``from x import
    y`` gives x and x.y (y may be a submodule; a name that is not one resolves to nothing)."""
    names: list[str] = []
    for module, level, imported in _parsed(path)[1]:
        base = _absolute(module, level, package)
        if base is not None:
            names += [base] + [f"{base}.{name}" if base else name for name in imported if name != "*"]
    return [n for n in names if n and not n.startswith(".")]


def _absolute(module: str, level: int, package: str) -> str | None:
    if not level:
        return module
    parts = package.split(".") if package else []
    if level - 1 > len(parts) or (level - 1 == len(parts) and not module):
        return None  # beyond the top-level package: Python refuses it too
    base = parts[:len(parts) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _is_literal_import_call(node: ast.AST) -> bool:
    """``importlib.import_module("a.b")`` / ``import_module("a.b")`` / ``__import__("a.b")``."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("import_module", "__import__")


def _source_file(name: str) -> pathlib.Path | None:
    """The ``.py`` file of module ``name`` when it is the project's code (not the Python
    installation's, not site-packages'), found without running any module."""
    spec = _find_spec(name)
    origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py"):
        return None  # built-in, frozen, extension, namespace package or not found
    path = pathlib.Path(origin).resolve()
    if not path.is_file() or any(path.is_relative_to(root) for root in _installed_roots()):
        return None
    return path


def _find_spec(name: str):
    """A module's spec without executing it or any package not imported yet: modules imported
    already answer from sys.modules; a submodule of a package not imported yet is looked up in
    the package's folders."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None)  # None when blocked (sys.modules[x] = None)
    parent = name.rpartition(".")[0]
    if parent and parent not in sys.modules:
        parent_spec = _find_spec(parent)
        folders = getattr(parent_spec, "submodule_search_locations", None)
        return importlib.machinery.PathFinder.find_spec(name, list(folders)) if folders else None
    try:
        return importlib.util.find_spec(name)  # its parent package is imported already: runs nothing
    except (ImportError, ValueError, AttributeError):
        return None


@lru_cache(maxsize=None)
def _installed_roots() -> tuple[pathlib.Path, ...]:
    """Folders of the Python installation and of installed packages (site-packages, dist-packages)."""
    roots = set()
    for paths in (sysconfig.get_paths(), sysconfig.get_paths(vars={"base": sys.base_prefix,
                                                                    "platbase": sys.base_exec_prefix})):
        roots.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k))
    roots.update(getattr(site, "getsitepackages", list)())
    roots.add(site.getusersitepackages())
    roots.update(p for p in sys.path if pathlib.Path(p).name in ("site-packages", "dist-packages"))
    return tuple(sorted({pathlib.Path(r).resolve() for r in roots if r}))


@lru_cache(maxsize=None)
def _builder_digest() -> str:
    """This build tool's own code, the manifest schema it writes and the declaration class (read
    once per process; they count even when tilebin is installed in site-packages)."""
    extra = b"".join(code_bytes(p) for p in (_MANIFEST_PY, _DECLARE_PY) if p.exists())
    return hashlib.sha256(_tree_digest(_AOT_DIR).encode() + extra).hexdigest()


def job_key(job: Job, source: str, tool_facts: dict[str, Any], pass_configs: Mapping[str, Any] | None = None) -> str:
    """The cache key of one job: the variant, the source closure's digest, the tool facts (TileLang
    and nvcc versions, nvcc flags, arch), the declaration's pass configs and this tool's code."""
    payload = {
        "job": [job.module, job.kernel, sorted(job.variant)] + ([sorted(job.specialised)] if job.specialised else []),
        "source": source,
        "tools": tool_facts,
        "pass_configs": sorted((str(k), v) for k, v in (pass_configs or {}).items()),
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
    tmp.chmod(0o755)  # mkdtemp makes it 0700
    (tmp / "kernel.cubin").write_bytes(result.cubin)
    (tmp / "result.json").write_text(json.dumps({"variant": result.variant, "params": result.params}, sort_keys=True))
    try:
        os.replace(tmp, entry)
    except OSError:  # another build stored the same entry first
        shutil.rmtree(tmp, ignore_errors=True)
