"""Cache keys ignore edits that cannot change a cubin (comments, docstrings, formatting) in the
kernel modules, aot/ and runtime/_manifest.py, and change on any code edit."""

from __future__ import annotations

import importlib
import pathlib
import shutil
import sys
import textwrap

import pytest

from tilebin.aot import _cache
from tilebin.aot._lower import Job

ROOT = pathlib.Path(__file__).resolve().parents[2]

KERNEL = textwrap.dedent('''
    """Module docstring."""
    from .helpers import BLOCK


    def factory(n):
        """Factory docstring."""
        return n * BLOCK  # a comment


    class Decl:
        """Class docstring."""
        name = "toy.k"
        doc = "the doc= text is data, not a docstring"


    KERNELS = (Decl(), KernelDecl("toy.k3", factory, ({},), doc="what toy.k3 computes"),
               KernelDecl.from_jit("toy.k4", factory, grid=({},), doc="what toy.k4 computes"))
''')


def _package(tmp_path, monkeypatch, kernel: str = KERNEL, helpers: str = "BLOCK = 128\n") -> pathlib.Path:
    pkg = tmp_path / "keypkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text(helpers)
    (pkg / "kern.py").write_text(kernel)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "keypkg"]:  # find_spec imports the package:
        monkeypatch.delitem(sys.modules, name)  # drop an earlier test's, found in its own tmp_path
    importlib.invalidate_caches()
    return pkg


def _key(source: str) -> str:
    return _cache.job_key(Job("keypkg.kern", "toy.k", 0, (("n", 1),)), source, {"nvcc": "x"})


EDITS_KEEPING = {
    "comment": lambda s: s.replace("# a comment", "# another comment, longer"),
    "new comment line": lambda s: "# header comment\n" + s,
    "blank lines": lambda s: s.replace("\n\n\n", "\n\n\n\n\n"),
    "module docstring": lambda s: s.replace("Module docstring.", "Module docstring, reworded\n\nat length."),
    "function docstring": lambda s: s.replace("Factory docstring.", "Says more."),
    "class docstring": lambda s: s.replace('"""Class docstring."""', "'''Other words.'''"),
    "docstring removed": lambda s: s.replace('    """Factory docstring."""\n', ""),
    "KernelDecl doc=": lambda s: s.replace("what toy.k3 computes", "what toy.k3 computes, said better"),
    "from_jit doc=": lambda s: s.replace('doc="what toy.k4 computes"', 'doc="reworded"'),
}
EDITS_CHANGING = {
    "expression": lambda s: s.replace("n * BLOCK", "n * BLOCK + 1"),
    "string data": lambda s: s.replace("not a docstring", "still not a docstring"),
    "name": lambda s: s.replace('"toy.k"', '"toy.k2"'),
}


@pytest.mark.parametrize("edit", sorted(EDITS_KEEPING))
def test_a_comment_or_docstring_edit_keeps_the_key(tmp_path, monkeypatch, edit):
    pkg = _package(tmp_path, monkeypatch)
    before = _key(_cache.source_digest("keypkg.kern"))
    edited = EDITS_KEEPING[edit](KERNEL)
    assert edited != KERNEL
    (pkg / "kern.py").write_text(edited)
    assert _key(_cache.source_digest("keypkg.kern")) == before


@pytest.mark.parametrize("edit", sorted(EDITS_CHANGING))
def test_a_code_edit_changes_the_key(tmp_path, monkeypatch, edit):
    pkg = _package(tmp_path, monkeypatch)
    before = _key(_cache.source_digest("keypkg.kern"))
    (pkg / "kern.py").write_text(EDITS_CHANGING[edit](KERNEL))
    assert _key(_cache.source_digest("keypkg.kern")) != before


def test_an_imported_helper_counts_by_its_code(tmp_path, monkeypatch):
    pkg = _package(tmp_path, monkeypatch)
    before = _cache.source_digest("keypkg.kern")
    (pkg / "helpers.py").write_text('"""Doc."""\nBLOCK = 128  # threads\n')
    assert _cache.source_digest("keypkg.kern") == before
    (pkg / "helpers.py").write_text("BLOCK = 256\n")
    assert _cache.source_digest("keypkg.kern") != before


def test_a_file_that_does_not_parse_counts_by_its_bytes(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def f(:\n")
    assert _cache.code_bytes(path) == b"def f(:\n"


def test_the_builder_digest_ignores_comments_in_aot_and_the_manifest_schema(tmp_path):
    aot = tmp_path / "aot"
    shutil.copytree(ROOT / "aot", aot, ignore=shutil.ignore_patterns("__pycache__"))
    before = _cache._tree_digest(aot)
    lower = aot / "_lower.py"
    lower.write_text("# a comment at the top\n" + lower.read_text().replace('"""', '"""Reworded. ', 1))
    assert _cache._tree_digest(aot) == before
    lower.write_text(lower.read_text() + "\nX = 1\n")
    assert _cache._tree_digest(aot) != before

    schema = tmp_path / "_manifest.py"
    text = (ROOT / "runtime" / "_manifest.py").read_text()
    schema.write_text(text)
    code = _cache.code_bytes(schema)
    schema.write_text(text.replace("\n", "\n# note\n", 3))
    assert _cache.code_bytes(schema) == code
    schema.write_text(text + "\nSCHEMA_EXTRA = 2\n")
    assert _cache.code_bytes(schema) != code
