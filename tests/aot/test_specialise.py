"""``KernelDecl.specialise``: variants built with run-time sizes fixed, ahead of their run-time-size
variant, recorded in the manifest and chosen for the calls whose sizes match (issue 12)."""

from __future__ import annotations

import pathlib
import sys
from types import SimpleNamespace

import pytest

from tilebin.aot import AotError

HERE = pathlib.Path(__file__).resolve().parent


def _decl(**kw):
    from tilebin.kernels import KernelDecl

    return KernelDecl("toy.k", lambda **_: None, ({"block": 64},), **kw)


@pytest.mark.parametrize("entries, needle", [
    ({"k": 8}, "tuple of dicts"),
    (({},), "non-empty dict"),
    (({"k": 0},), "positive ints"),
    (({"k": True},), "positive ints"),
    (({"k": 8.0},), "positive ints"),
    (({"block": 32},), "compile-time key of the grid"),
    (({"k": 8}, {"k": 8}), "twice"),
])
def test_specialise_mistakes_are_declaration_errors(entries, needle):
    from tilebin.kernels._declare import DeclarationError

    with pytest.raises(DeclarationError, match=needle):
        _decl(specialise=entries)


def test_specialise_is_frozen_in_order():
    decl = _decl(specialise=({"k": 8, "a": 2}, {"k": 16}))
    assert [dict(s) for s in decl.specialise] == [{"a": 2, "k": 8}, {"k": 16}]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("tilelang")
    from tilebin.aot import BuildOptions, build

    sys.path.insert(0, str(HERE))
    try:
        out = tmp_path_factory.mktemp("artifacts")
        return out, build(["toy_specialised"], BuildOptions(out_dir=out, jobs=1), log=lambda *_: None)
    finally:
        sys.path.remove(str(HERE))


def test_specialised_variants_come_just_ahead_of_their_grid_variant(built):
    _, manifest = built
    variants = manifest.kernels["toy.row_scale"].variants
    assert [(dict(v.key), v.specialised) for v in variants] == [
        ({"dtype": "float32", "k": 8}, ("k",)), ({"dtype": "float32", "k": 32}, ("k",)), ({"dtype": "float32"}, ()),
        ({"dtype": "float16", "k": 8}, ("k",)), ({"dtype": "float16", "k": 32}, ("k",)), ({"dtype": "float16"}, ()),
    ]


def test_a_specialised_variant_has_static_dims_and_its_own_cubin(built):
    _, manifest = built
    variants = {tuple(sorted(dict(v.key).items())): v for v in manifest.kernels["toy.row_scale"].variants}
    k8 = variants[(("dtype", "float32"), ("k", 8))]
    generic = variants[(("dtype", "float32"),)]
    shapes = {t.name: list(t.shape) for t in k8.tensors}
    assert shapes == {"X": ["rows", 8], "S": ["rows", 2], "Y": ["rows", 8]}  # k // 4 folded too
    assert {t.name: list(t.shape) for t in generic.tensors}["X"] == ["rows", "k"]
    assert len({k8.sha256, generic.sha256, variants[(("dtype", "float32"), ("k", 32))].sha256}) == 3


def test_the_runtime_matches_a_call_to_the_specialised_variant_by_its_static_dims(built):
    from tilebin.runtime._dispatch import matching_variants

    _, manifest = built
    spec = manifest.kernels["toy.row_scale"]

    def first(k):
        shapes = {"X": (5, k), "S": (5, k // 4), "Y": (5, k)}
        infos = {name: SimpleNamespace(dtype="float32", shape=shape) for name, shape in shapes.items()}
        return dict(matching_variants(spec, infos, ())[0][1].key)

    assert first(8) == {"dtype": "float32", "k": 8}
    assert first(32) == {"dtype": "float32", "k": 32}
    assert first(12) == {"dtype": "float32"}


def test_specialised_key_picks_once_from_the_variants(built):
    from tilebin.ops._common import specialised_key

    _, manifest = built
    variants = manifest.kernels["toy.row_scale"].variants
    assert specialised_key(variants, {"k": 32}, {"dtype": "float16"}) == {"dtype": "float16", "k": 32}
    assert specialised_key(variants, {"k": 33}, {"dtype": "float16"}) == {"dtype": "float16"}
    assert specialised_key(variants, {}, {"dtype": "float16"}) == {"dtype": "float16"}
    assert specialised_key(variants, {"k": 8}, {"dtype": "bfloat16"}) == {"dtype": "bfloat16"}  # no such grid variant


def test_a_specialise_symbol_that_is_not_a_size_names_the_sizes(tmp_path, monkeypatch):
    pytest.importorskip("tilelang")
    from tilebin.aot import BuildOptions, build
    from tilebin.kernels import KernelDecl

    sys.path.insert(0, str(HERE))
    try:
        import toy_specialised

        bad = KernelDecl("toy.row_scale", toy_specialised.row_scale, ({},), outputs=("Y",), specialise=({"hidden": 8},))
        monkeypatch.setattr(toy_specialised, "KERNELS", (bad,))
        with pytest.raises(AotError, match=r"specialise names 'hidden', which is not a size symbol .*k, rows"):
            build(["toy_specialised"], BuildOptions(out_dir=tmp_path, jobs=1), log=lambda *_: None)
    finally:
        sys.path.remove(str(HERE))
