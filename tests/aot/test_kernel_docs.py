"""Every production kernel the wheel builds says what it computes: a one-line ``doc=`` in its
KernelDecl, which the build writes into the manifest (``runtime.spec(name).doc``).

Internal kernels (``runtime.is_internal``: the ``testing`` family) are held
to the same rule when they have a doc, but may go without one.
"""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("tilelang")

from tilebin.aot._build import declared_facts  # noqa: E402
from tilebin.kernels.modules import ALL_MODULES  # noqa: E402
from tilebin.runtime import is_internal  # noqa: E402


def _decls() -> list[tuple[str, object]]:
    return [(module, decl) for module in ALL_MODULES for decl in importlib.import_module(module).KERNELS]


def test_every_production_kernel_has_a_one_line_doc():
    decls = _decls()
    production = [(m, d) for m, d in decls if not is_internal(d.name)]
    assert len(production) >= 40, f"only {len(production)} production kernels found in ALL_MODULES"
    missing = [f"{d.name} ({m})" for m, d in production if not d.doc.strip()]
    assert not missing, f"KernelDecls without doc=: {missing}; add a one-line doc= saying what each computes"
    multi = [d.name for _, d in decls if d.doc and ("\n" in d.doc or d.doc != d.doc.strip())]
    assert not multi, f"doc= must be one line without surrounding blanks: {multi}"


def test_the_docs_reach_the_manifest_facts():
    facts = declared_facts(ALL_MODULES)
    names = {d.name for _, d in _decls()}
    assert set(facts) == names
    empty = sorted(n for n, f in facts.items() if not is_internal(n) and not f["doc"].strip())
    assert not empty, f"declared_facts() gives these production kernels no doc: {empty}"
