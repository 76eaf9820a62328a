"""Manifest parsing, registry creation from a folder or the settings, and expressions."""

from __future__ import annotations

import json

import pytest
import rt_fakes as F

from tilebin.runtime import _registry, _settings
from tilebin.runtime._expr import check_expr, evaluate, symbols_of
from tilebin.runtime._manifest import parse_manifest, split_kernel_lines


def _scale_manifest():
    return F.manifest(**{"toy.scale": F.scale_kernel()})


def test_parse_standard_manifest(rt):
    m = parse_manifest(F.standard_manifest())
    assert sorted(m.kernels) == ["toy.gemm", "toy.quant", "toy.scale"]
    assert m.build.arch == "sm_90a" and m.build.min_driver_cuda == 13000
    v = m.kernels["toy.gemm"].variants[1]
    assert dict(v.key) == {"n": 4096, "k": 7168} and v.launches[0].pdl and v.launches[0].cluster == (2, 1, 1)


def test_bad_schema_version(rt):
    data = _scale_manifest()
    data["schema_version"] = 2
    with pytest.raises(rt.ArtifactError, match=r"schema_version 2, this runtime reads 1"):
        parse_manifest(data)


def test_bad_json(rt):
    with pytest.raises(rt.ArtifactError, match="not valid JSON"):
        parse_manifest(b'{"schema_version": 1,')


def test_unbound_symbol(rt):
    data = _scale_manifest()
    data["kernels"]["toy.scale"]["variants"][0]["launches"][0]["grid"][1] = ["add", "q", 1]
    with pytest.raises(rt.ArtifactError, match=r"unbound symbols \['q'\]"):
        parse_manifest(data)


def test_bad_arg_kind(rt):
    data = _scale_manifest()
    data["kernels"]["toy.scale"]["variants"][0]["launches"][0]["args"][0]["kind"] = "pointer"
    with pytest.raises(rt.ArtifactError, match="unknown argument kind 'pointer'"):
        parse_manifest(data)


def test_tma_on_unknown_tensor(rt):
    data = F.manifest(**{"toy.gemm": F.gemm_kernel()})
    data["kernels"]["toy.gemm"]["variants"][0]["tma"][0]["param"] = "zz"
    with pytest.raises(rt.ArtifactError, match="unknown tensor 'zz'"):
        parse_manifest(data)


def test_unknown_operator(rt):
    data = _scale_manifest()
    data["kernels"]["toy.scale"]["variants"][0]["launches"][0]["grid"][0] = ["pow", "m", 2]
    with pytest.raises(rt.ArtifactError, match="unknown operator"):
        parse_manifest(data)


def test_registry_without_manifest(rt, tmp_path):
    with pytest.raises(rt.ArtifactError, match="no readable manifest.json") as info:
        rt.Registry(tmp_path)
    assert "TILEBIN_ARTIFACTS_DIR" in str(info.value)


def test_registry_reads_folder(make_registry):
    reg = make_registry()
    assert reg.kernel_names() == ["toy.gemm", "toy.quant", "toy.scale"]
    assert reg.spec("toy.scale").params[2].name == "alpha"
    assert reg.manifest.schema_version == 1


def test_default_registry_from_env(rt, tmp_path, monkeypatch):
    folder = F.write_artifacts(tmp_path / "a", _scale_manifest())
    monkeypatch.setenv("TILEBIN_ARTIFACTS_DIR", str(folder))
    monkeypatch.setattr(_registry, "_DEFAULT", [None])
    monkeypatch.setattr(rt, "_DEFAULT", _registry._DEFAULT)
    assert rt.kernel_names() == ["toy.scale"]
    assert rt.spec("toy.scale").name == "toy.scale"
    with pytest.raises(rt.NoVariantError, match="did you mean 'toy.scale'"):
        rt.spec("toy.scael")


def test_default_artifacts_dir_is_package_data(monkeypatch):
    monkeypatch.delenv("TILEBIN_ARTIFACTS_DIR", raising=False)
    path = _settings.artifacts_dir()
    assert path.name == "_artifacts" and "tilebin" in str(path)


@pytest.mark.parametrize("raw", ["0", "-3", "many"])
def test_bad_plan_cache_size(rt, monkeypatch, raw):
    monkeypatch.setenv("TILEBIN_PLAN_CACHE_SIZE", raw)
    with pytest.raises(rt.TilebinError, match="TILEBIN_PLAN_CACHE_SIZE"):
        _settings.plan_cache_size()


def test_plan_cache_size_env(monkeypatch):
    monkeypatch.setenv("TILEBIN_PLAN_CACHE_SIZE", "7")
    assert _settings.plan_cache_size() == 7
    monkeypatch.delenv("TILEBIN_PLAN_CACHE_SIZE")
    assert _settings.plan_cache_size() == 1024


def test_manifest_round_trips_through_json(rt):
    m = parse_manifest(F.standard_manifest())
    again = parse_manifest(m.to_json())
    assert json.loads(again.to_json()) == json.loads(m.to_json())


# ---------------------------------------------------------------- expressions
@pytest.mark.parametrize("tree, env, want", [
    (["floordiv", ["add", "n", 127], 128], {"n": 129}, 2),
    (["truncdiv", -7, 2], {}, -3),
    (["floordiv", -7, 2], {}, -4),
    (["truncmod", -7, 2], {}, -1),
    (["floormod", -7, 2], {}, 1),
    (["max", ["min", "a", "b"], 3], {"a": 10, "b": 5}, 5),
    (["neg", ["mul", "a", ["sub", "b", 1]]], {"a": 3, "b": 5}, -12),
    ("n", {"n": 42}, 42),
    (7, {}, 7),
])
def test_expressions(tree, env, want):
    check_expr(tree)
    assert evaluate(tree, env) == want


def test_symbols_of():
    assert symbols_of(["add", "n", ["mul", "m", 2]]) == {"n", "m"}
    assert symbols_of(5) == set()


@pytest.mark.parametrize("tree", [["add", 1], ["nope", 1, 2], True, 1.5, [], {"a": 1}])
def test_malformed_expressions(rt, tree):
    with pytest.raises(rt.ArtifactError):
        check_expr(tree)


def test_registry_checks_each_kernel_at_first_use(rt, tmp_path):
    """A malformed kernel entry does not stop the others: it raises ArtifactError naming it when used."""
    data = F.manifest(**{"toy.scale": F.scale_kernel(), "toy.quant": F.quant_kernel()})
    data["kernels"]["toy.quant"]["variants"][0]["launches"][0]["grid"][0] = ["pow", "n", 2]
    reg = rt.Registry(F.write_artifacts(tmp_path / "a", data))
    assert reg.kernel_names() == ["toy.quant", "toy.scale"]
    assert reg.spec("toy.scale").name == "toy.scale"
    with pytest.raises(rt.ArtifactError, match=r"kernel 'toy.quant'.*unknown operator"):
        reg.spec("toy.quant")
    with pytest.raises(rt.NoVariantError, match="toy.scal"):
        reg.spec("toy.scal")


def test_lazy_and_eager_parse_agree(rt):
    data = F.standard_manifest()
    eager, lazy = parse_manifest(data), parse_manifest(data, lazy=True)
    assert sorted(lazy.kernels) == sorted(eager.kernels) and len(lazy.kernels) == len(eager.kernels)
    assert all(lazy.kernels[n] == eager.kernels[n] for n in eager.kernels)
    assert lazy.to_json() == eager.to_json()


# ---------------------------------------------------------------- the one-kernel-per-line layout
def test_to_json_writes_one_kernel_per_line(rt):
    text = parse_manifest(F.standard_manifest()).to_json()
    lines = text.splitlines()
    names = sorted(F.standard_manifest()["kernels"])
    assert len(lines) == 1 + len(names) + 1 and lines[-1] == "}}"
    assert [json.loads("{" + line.removesuffix(",") + "}").popitem()[0] for line in lines[1:-1]] == names
    assert json.loads(text) == json.loads(parse_manifest(json.loads(text)).to_json())  # plain JSON too


def test_lazy_load_decodes_only_the_kernels_used(rt):
    text = parse_manifest(F.standard_manifest()).to_json()
    split = split_kernel_lines(text)
    assert split is not None and all(isinstance(v, str) for v in split["kernels"].values())
    lazy = parse_manifest(text, lazy=True)
    assert lazy.kernels._parsed == {}
    name = sorted(lazy.kernels)[0]
    assert lazy.kernels[name] == parse_manifest(text).kernels[name]
    assert list(lazy.kernels._parsed) == [name]


@pytest.mark.parametrize("layout", ["pretty", "compact", "empty"])
def test_other_layouts_decode_whole(rt, layout):
    data = F.standard_manifest()
    if layout == "empty":
        data["kernels"] = {}
    text = json.dumps(data, indent=1) if layout == "pretty" else json.dumps(data)
    assert split_kernel_lines(text) is None
    lazy, eager = parse_manifest(text, lazy=True), parse_manifest(data)
    assert sorted(lazy.kernels) == sorted(eager.kernels)
    assert all(lazy.kernels[n] == eager.kernels[n] for n in eager.kernels)
    if layout == "empty":  # written by to_json: the split layout with no kernel lines
        again = parse_manifest(eager.to_json(), lazy=True)
        assert split_kernel_lines(eager.to_json())["kernels"] == {} and list(again.kernels) == []


def test_a_broken_kernel_line_fails_at_its_first_use(rt, tmp_path):
    text = parse_manifest(F.standard_manifest()).to_json()
    lines = text.split("\n")
    name = json.loads("{" + lines[1].removesuffix(",") + "}").popitem()[0]
    lines[1] = lines[1][:len(lines[1]) // 2] + ","  # truncated object
    root = tmp_path / "a"
    root.mkdir()
    (root / "manifest.json").write_text("\n".join(lines))
    reg = rt.Registry(root)
    others = [n for n in reg.manifest.kernels if n != name]
    assert reg.spec(others[0]).name == others[0]
    with pytest.raises(rt.ArtifactError, match=rf"kernel {name!r}: not valid JSON"):
        reg.spec(name)


def test_a_broken_envelope_is_an_artifact_error(rt):
    text = parse_manifest(F.standard_manifest()).to_json()
    with pytest.raises(rt.ArtifactError, match="not valid JSON"):
        parse_manifest("{" + text[2:], lazy=True)
