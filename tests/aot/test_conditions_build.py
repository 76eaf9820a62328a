"""Variant conditions and optional tensors reach the manifest: the kernel's T.assume, the
declaration's ``conditions`` (with variant keys substituted) and ``optional`` parameters."""

from __future__ import annotations

import pathlib
import sys

import pytest

from tilebin.aot import AotError

HERE = pathlib.Path(__file__).resolve().parent


def _declared(text, key=None, symbols=("n", "m", "alpha")):
    from tilebin.aot._conditions import declared_condition

    return declared_condition(text, key or {}, symbols, "kernel toy.k variant {}")


def test_declared_condition_text_becomes_a_tree():
    assert _declared("n % 128 == 0") == ["eq", ["floormod", "n", 128], 0]
    assert _declared("n % block == 0 and m <= 4 * block", {"block": 64}) == \
        ["and", ["eq", ["floormod", "n", 64], 0], ["le", "m", ["mul", 4, 64]]]
    assert _declared("0 < n <= 8192") == ["and", ["lt", 0, "n"], ["le", "n", 8192]]
    assert _declared("not (n == 0 or -m > 1)") == ["not", ["or", ["eq", "n", 0], ["gt", ["neg", "m"], 1]]]
    assert _declared("flag", {"flag": True}) == 1


@pytest.mark.parametrize("text, needle", [
    ("n % x == 0", "'x' is neither a runtime symbol"),
    ("n / 2 == 3", "is not allowed"),
    ("n ==", "is not an expression"),
    ("f(n)", "is not allowed"),
    ("n == dtype", "only int and bool keys"),
    ("", "non-empty string"),
])
def test_declared_condition_mistakes_name_the_condition(text, needle):
    with pytest.raises(AotError) as info:
        _declared(text, {"dtype": "float32"})
    assert needle in str(info.value) and "toy.k" in str(info.value)


def test_the_runtime_evaluates_what_the_build_writes():
    from tilebin.runtime._expr import evaluate, to_text

    tree = _declared("n % block == 0 and 0 < m <= 8", {"block": 16})
    assert to_text(tree) == "n % 16 == 0 and 0 < m and m <= 8"
    assert evaluate(tree, {"n": 32, "m": 8}) and not evaluate(tree, {"n": 40, "m": 8})
    assert not evaluate(tree, {"n": 32, "m": 0})


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("tilelang")
    from tilebin.aot import BuildOptions, build

    sys.path.insert(0, str(HERE))
    try:
        out = tmp_path_factory.mktemp("artifacts")
        return build(["toy_conditions"], BuildOptions(out_dir=out, jobs=1), log=lambda *_: None)
    finally:
        sys.path.remove(str(HERE))


def test_assume_and_declared_conditions_reach_the_manifest(built):
    spec = built.kernels["toy.add_bias"]
    first, second = spec.variants
    assert [(c.source, c.expr) for c in first.conditions] == [
        ("assume", ["eq", ["floormod", "n", 64], 0]),
        ("declared", ["le", "n", 1024]),
        ("declared", ["or", ["eq", "use_bias", 0], ["eq", "use_bias", 1]]),
    ]
    assert [c.expr for c in second.conditions][:2] == [["eq", ["floormod", "n", 32], 0], ["le", "n", 4096]]


def test_optional_tensor_reaches_the_manifest(built):
    params = {p.name: p for p in built.kernels["toy.add_bias"].params}
    assert params["bias"].optional and not params["X"].optional and not params["use_bias"].optional


def test_optional_must_name_a_tensor(tmp_path, monkeypatch):
    pytest.importorskip("tilelang")
    from tilebin.aot import BuildOptions, build
    from tilebin.kernels import KernelDecl

    sys.path.insert(0, str(HERE))
    try:
        import toy_conditions

        bad = KernelDecl("toy.add_bias", toy_conditions.add_bias, ({},), outputs=("Y",), optional=("use_bias",))
        monkeypatch.setattr(toy_conditions, "KERNELS", (bad,))
        with pytest.raises(AotError, match=r"optional=\['use_bias'\] names \['use_bias'\], which are not tensor"):
            build(["toy_conditions"], BuildOptions(out_dir=tmp_path, jobs=1), log=lambda *_: None)
    finally:
        sys.path.remove(str(HERE))
