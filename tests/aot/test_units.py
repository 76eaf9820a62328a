"""GPU-free unit tests of the AOT pieces: expression translation, nvcc pinning, declarations."""

from __future__ import annotations

import os
import stat

import pytest

pytest.importorskip("tilelang")

from tvm import tirx  # noqa: E402

from tilebin.aot import AotError, KernelDecl, product  # noqa: E402
from tilebin.aot._nvcc import find_nvcc  # noqa: E402
from tilebin.aot._tir_expr import to_tree  # noqa: E402


def test_to_tree_translates_integer_arithmetic():
    n, m = tirx.Var("n", "int32"), tirx.Var("m", "int32")
    expr = tirx.FloorDiv(n + 127, 128) * tirx.Max(m, 1)
    assert to_tree(expr, "k") == ["mul", ["floordiv", ["add", "n", 127], 128], ["max", "m", 1]]
    assert to_tree(tirx.Cast("int64", n), "k") == "n"
    assert to_tree(tirx.Var("t", "int32"), "k", lets={"t": n * 2}) == ["mul", "n", 2]


def test_to_tree_refuses_what_the_manifest_cannot_express():
    with pytest.raises(AotError, match="cannot be written into the manifest"):
        to_tree(tirx.FloatImm("float32", 1.5), "kernel k")
    with pytest.raises(AotError, match="cast to float32"):
        to_tree(tirx.Cast("float32", tirx.Var("n", "int32")), "kernel k")


def _fake_nvcc(tmp_path, release):
    path = tmp_path / "nvcc"
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_nvcc_other_than_pinned_is_refused(tmp_path):
    with pytest.raises(AotError, match="pins CUDA 13.0"):
        find_nvcc(_fake_nvcc(tmp_path, "12.4"))
    assert find_nvcc(_fake_nvcc(tmp_path, "12.4"), allow_other_version=True).min_driver_cuda == 12000


@pytest.mark.skipif(not os.path.exists("/usr/local/cuda/bin/nvcc"), reason="no nvcc at /usr/local/cuda")
def test_pinned_nvcc_is_found():
    assert find_nvcc().release == "13.0"


def test_kernel_decl_validates():
    f = lambda dtype: None  # noqa: E731
    with pytest.raises(ValueError, match="family.op"):
        KernelDecl("Transpose", f, ({"dtype": "float32"},))
    with pytest.raises(ValueError, match="empty"):
        KernelDecl("a.b", f, ())
    with pytest.raises(ValueError, match="twice"):
        KernelDecl("a.b", f, ({"dtype": "f"}, {"dtype": "f"}))
    with pytest.raises(TypeError, match="bool/int/float/str"):
        KernelDecl("a.b", f, ({"dtype": ["f"]},))
    with pytest.raises(ValueError, match="power of two"):
        KernelDecl("a.b", f, ({"dtype": "f"},), align=12)
    assert product(a=[1, 2], b=["x"]) == ({"a": 1, "b": "x"}, {"a": 2, "b": "x"})


def test_source_digest_follows_imports_only(tmp_path, monkeypatch):
    """A kernel's cache key covers the files it imports (and its packages' __init__s), not its siblings."""
    from tilebin.aot import _cache

    pkg = tmp_path / "tbdigest"
    (pkg / "fam").mkdir(parents=True)
    for rel, text in {"__init__.py": "from ._decl import X\n", "_decl.py": "X = 1\n", "modules.py": "ALL = ()\n",
                      "fam/__init__.py": "", "fam/_helpers.py": "H = 1\n",
                      "fam/a.py": "from ._helpers import H\nfrom .. import _decl\n", "fam/b.py": "B = 1\n"}.items():
        (pkg / rel).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    a, b = _cache.source_digest("tbdigest.fam.a"), _cache.source_digest("tbdigest.fam.b")
    (pkg / "fam" / "b.py").write_text("B = 2\n")
    (pkg / "modules.py").write_text("ALL = ('tbdigest.fam.a',)\n")
    assert _cache.source_digest("tbdigest.fam.a") == a  # a sibling and the module list do not count
    assert _cache.source_digest("tbdigest.fam.b") != b
    (pkg / "fam" / "_helpers.py").write_text("H = 2\n")
    a2 = _cache.source_digest("tbdigest.fam.a")
    assert a2 != a  # an imported helper does
    (pkg / "_decl.py").write_text("X = 2\n")
    assert _cache.source_digest("tbdigest.fam.a") != a2  # `from .. import _decl` names a module


def test_kernel_meta_is_frozen_and_checked():
    decl = KernelDecl("a.b", lambda: None, grid=({},), meta={"limit": 4, "tiles": [1, 2]})
    assert dict(decl.meta) == {"limit": 4, "tiles": (1, 2)}
    with pytest.raises(TypeError):
        decl.meta["limit"] = 5  # type: ignore[index]
    with pytest.raises(TypeError, match="meta values"):
        KernelDecl("a.b", lambda: None, grid=({},), meta={"bad": {"nested": 1}})


def test_manifest_carries_doc_and_meta():
    from tilebin.runtime._manifest import parse_kernel

    spec = parse_kernel("a.b", {"name": "a.b", "params": [], "variants": [], "doc": "adds",
                                "meta": {"limit": 4, "tiles": [1, 2]}}, "test")
    assert spec.doc == "adds" and dict(spec.meta) == {"limit": 4, "tiles": (1, 2)}
    from tilebin.runtime import ArtifactError

    with pytest.raises(ArtifactError, match="meta must be an object"):
        parse_kernel("a.b", {"name": "a.b", "params": [], "variants": [], "meta": [1]}, "test")
