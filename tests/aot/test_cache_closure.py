"""The --cache key covers a kernel module's whole import closure: a kernel body imported from another
package, or from a sibling top-level module, rebuilds when its code changes and stays cached when
only its comments do (issue 14, item 1: the cache used to ship the old cubin)."""

from __future__ import annotations

import importlib
import pathlib
import sys
import textwrap

import pytest

from tilebin.aot import _cache

BODY = textwrap.dedent('''
    """A kernel body another package imports."""
    import tilelang.language as T


    def scale(factor=2.0, block=128):
        N = T.dynamic("n")

        @T.prim_func
        def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
            with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
                for i in T.Parallel(block):
                    if bx * block + i < N:
                        Y[bx * block + i] = X[bx * block + i] * FACTOR
        return main


    FACTOR = 2.0  # what the edits change
''')
FILES = {
    "pkg_b/__init__.py": "",
    "pkg_b/body.py": BODY,
    "pkg_a/__init__.py": "",
    "pkg_a/kern.py": textwrap.dedent('''
        from pkg_b.body import scale
        from tilebin.kernels import KernelDecl

        KERNELS = (KernelDecl("closure.cross_package", scale, ({},), outputs=("Y",)),)
    '''),
    "sibling_body.py": BODY,
    "sibling_kernels.py": textwrap.dedent('''
        import sibling_body
        from tilebin.kernels import KernelDecl

        KERNELS = (KernelDecl("closure.sibling", sibling_body.scale, ({},), outputs=("Y",)),)
    '''),
}
OURS = ("pkg_a", "pkg_b", "sibling_body", "sibling_kernels")


@pytest.fixture
def project(tmp_path, monkeypatch):
    for rel, text in FILES.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # an edit within the same second is still seen
    yield tmp_path
    _forget_modules()


def _forget_modules() -> None:
    """Drop the test's modules, as a fresh `python -m tilebin.aot build` process would not have them."""
    for name in [m for m in sys.modules if m.split(".")[0] in OURS]:
        del sys.modules[name]
    importlib.invalidate_caches()


def _build(modules, out, cache):
    from tilebin.aot import BuildOptions, build

    _forget_modules()
    logs: list[str] = []
    manifest = build(modules, BuildOptions(out_dir=out, cache_dir=cache, jobs=1), log=logs.append)
    return {name: k.variants[0].sha256 for name, k in manifest.kernels.items()}, logs[0]


@pytest.mark.parametrize("module, kernel, body", [
    ("pkg_a.kern", "closure.cross_package", "pkg_b/body.py"),
    ("sibling_kernels", "closure.sibling", "sibling_body.py"),
])
def test_an_edit_of_an_imported_kernel_body_rebuilds_and_a_comment_does_not(project, module, kernel, body):
    pytest.importorskip("tilelang")
    cache = project / "cache"
    first, log = _build([module], project / "out1", cache)
    assert "0 cached, 1 to build" in log

    path = project / body
    path.write_text(path.read_text().replace("FACTOR = 2.0  # what the edits change", "FACTOR = 3.0"))
    edited, log = _build([module], project / "out2", cache)
    assert "0 cached, 1 to build" in log, "an edit of the imported body must rebuild"
    assert edited[kernel] != first[kernel], "the rebuilt cubin must differ"

    path.write_text("# a new comment\n" + path.read_text().replace("A kernel body", "The kernel body") + "# end\n")
    again, log = _build([module], project / "out3", cache)
    assert "1 cached, 0 to build" in log, "a comment or docstring edit must not rebuild"
    assert again == edited


def test_closure_crosses_packages_and_stops_at_site_packages(project):
    closure = _cache.import_closure("pkg_a.kern")
    assert {"pkg_a", "pkg_a.kern", "pkg_b", "pkg_b.body", "tilebin.kernels", "tilebin.kernels._declare"} <= set(closure)
    assert not [m for m in closure if m.split(".")[0] in ("tilelang", "tvm", "numpy", "os")]
    assert _cache.import_closure("sibling_kernels").keys() >= {"sibling_kernels", "sibling_body"}


def test_digest_runs_no_module_and_names_modules_not_paths(project, tmp_path_factory, monkeypatch):
    """The digest reads files without importing them, and is the same for a copy of the project
    elsewhere (a cache entry does not depend on the checkout's path)."""
    _forget_modules()
    first = _cache.source_digest("pkg_a.kern")
    assert not [m for m in sys.modules if m.split(".")[0] in OURS]
    other = tmp_path_factory.mktemp("elsewhere")
    for rel, text in FILES.items():
        (other / rel).parent.mkdir(parents=True, exist_ok=True)
        (other / rel).write_text(text)
    monkeypatch.syspath_prepend(str(other))
    importlib.invalidate_caches()
    assert str(other) == sys.path[0] and _cache.import_closure("pkg_a.kern")["pkg_b.body"].is_relative_to(other)
    assert _cache.source_digest("pkg_a.kern") == first


def test_literal_import_module_calls_count_and_computed_ones_are_documented(project):
    (project / "pkg_a" / "dyn.py").write_text("import importlib\nbody = importlib.import_module('pkg_b.body')\n")
    assert "pkg_b.body" in _cache.import_closure("pkg_a.dyn")
    assert "computed name" in _cache.source_digest.__doc__


def test_an_unknown_module_is_module_not_found(project):
    with pytest.raises(ModuleNotFoundError):
        _cache.source_digest("pkg_a.no_such_module")
