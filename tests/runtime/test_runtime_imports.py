"""The import rule and house rules of runtime/, checked on the source."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime"
FORBIDDEN = ("tilelang", "tvm", "tvm_ffi", "torch", "numpy", "cuda.bindings", "cuda.core",
             "tilebin.aot", "tilebin.kernels")


def test_import_pulls_in_nothing_heavy():
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import tilebin.runtime as rt\n"
        "assert rt.__file__.startswith(sys.path[0]), rt.__file__\n"
        f"bad = sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r}))\n"
        "print('LOADED', bad)\n"
        "raise SystemExit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _sources():
    return sorted(RUNTIME.glob("*.py"))


def _imports(tree):
    """Every module a file imports: import statements, and importlib.import_module("...") calls."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield ("." * node.level) + (node.module or "")
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            yield node.args[0].value


# The CLI's `doctor` (optional torch check, smoke launch) and `bench` (timing tilebin.ops calls) may
# import torch and tilebin.ops lazily, inside those commands; list/info/verify never do
# (tests/runtime/test_cli.py checks), and nothing else in runtime/ may.
ALLOWED_LAZY = {"_cli.py": ("torch", "tilebin.ops")}


@pytest.mark.parametrize("path", _sources(), ids=lambda p: p.name)
def test_no_forbidden_imports_anywhere(path):
    """Lazy imports inside functions count too: only cuda.bindings may be imported lazily."""
    for name in _imports(ast.parse(path.read_text())):
        top = name.lstrip(".")
        if any(top == a or top.startswith(a + ".") for a in ALLOWED_LAZY.get(path.name, ())):
            continue
        if name.startswith(".."):
            pytest.fail(f"{path.name} imports {name!r}: runtime/ may import only itself (relative, one dot)")
        if any(top == f or top.startswith(f + ".") for f in ("tilelang", "tvm", "tvm_ffi", "torch", "numpy",
                                                          "tilebin", "aot", "kernels")):
            pytest.fail(f"{path.name} imports {name!r}")


@pytest.mark.parametrize("path", _sources(), ids=lambda p: p.name)
def test_house_rules(path):
    text = path.read_text()
    tree = ast.parse(text)
    assert len(text.splitlines()) <= 400, f"{path.name} has more than 400 lines"
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Assert), f"{path.name}:{node.lineno}: assert (stripped by python -O)"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            assert n <= 40, f"{path.name}: {node.name} is {n} lines"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("eval", "exec", "compile"), f"{path.name}:{node.lineno}: {node.func.id}()"
    assert "pickle" not in text, f"{path.name} mentions pickle"
    if path.name != "_settings.py":
        assert "os.environ" not in text and "getenv" not in text, f"{path.name} reads the environment"


@pytest.mark.parametrize("path", sorted((ROOT / "csrc").glob("*")), ids=lambda p: p.name)
def test_c_sources_keep_the_house_rules(path):
    """csrc/: files <= 400 lines, functions <= 40 lines, the limited API only, no CUDA or torch headers."""
    lines = path.read_text().splitlines()
    assert len(lines) <= 400, f"{path.name} has {len(lines)} lines"
    start = None
    for i, line in enumerate(lines):
        if start is None and line[:1].isalpha() and line.rstrip().endswith("{") and "(" in line:
            start = i
        elif start is not None and line.startswith("}"):
            assert i - start + 1 <= 40, f"{path.name}:{start + 1}: function of {i - start + 1} lines"
            start = None
    text = "\n".join(lines)
    includes = [ln.split()[1] for ln in lines if ln.startswith("#include")]
    assert all(h in ("<Python.h>", "<stdint.h>", "<string.h>") or h.startswith('"_hot_') for h in includes), includes
    if path.suffix == ".c":
        assert "#define Py_LIMITED_API 0x030A0000" in text  # abi3: CPython 3.10+


def test_hot_path_imports_no_validation_or_planning_module():
    """runtime/_launcher.py sits at the bottom: the layout compiler, validation, dispatch and the
    registry import it, never the other way round."""
    found = {n.lstrip(".") for n in _imports(ast.parse((RUNTIME / "_launcher.py").read_text()))}
    allowed = {"__future__", "ctypes", "functools", "struct", "threading", "typing",
               "", "_driver", "_errors", "_scalars", "_settings", "_tensors", "_tma"}
    assert found <= allowed, sorted(found - allowed)
