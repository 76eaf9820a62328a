"""The AOT pipeline end to end on toy kernels: facts, determinism, cache, errors."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import pytest

pytest.importorskip("tilelang")

from tilebin.aot import AotError, BuildOptions, build  # noqa: E402
from tilebin.runtime._manifest import parse_manifest  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
TOY = "toy_kernels"


@pytest.fixture(scope="module", autouse=True)
def _toy_on_path():
    sys.path.insert(0, str(HERE))
    yield
    sys.path.remove(str(HERE))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("artifacts")
    cache = tmp_path_factory.mktemp("cache")
    manifest = build([TOY], BuildOptions(out_dir=out, cache_dir=cache, jobs=1), log=lambda *_: None)
    return out, cache, manifest


def test_manifest_carries_every_launch_fact(built):
    out, _, _ = built
    m = parse_manifest((out / "manifest.json").read_text())
    assert m.build.arch == "sm_90a" and m.build.min_driver_cuda == 13000 and not m.build.lineinfo
    tr = m.kernels["toy.transpose"]
    assert [p.name for p in tr.params] == ["X", "Y"] and [v.key["dtype"] for v in tr.variants] == ["bfloat16", "float32"]
    ln = tr.variants[0].launches[0]
    assert ln.grid == (["floordiv", ["add", "cols", 63], 64], ["floordiv", ["add", "rows", 63], 64], "batch")
    assert ln.block == (256, 1, 1) and ln.smem == 64 * 64 * 2
    assert [a.kind for a in ln.args] == ["ptr", "ptr", "scalar", "scalar", "scalar"]
    x, y = tr.variants[0].tensors
    assert x.shape == ("batch", "rows", "cols") and x.strides == (["mul", "cols", "rows"], "cols", 1)
    assert y.output and not x.output
    tma = m.kernels["toy.tma_copy"].variants[0]
    assert tma.launches[0].smem > 48 * 1024
    (desc,) = tma.tma
    assert desc.param == "Y" and desc.dims == (4096, "m") and desc.strides == (4096 * 4,)
    assert [a.kind for a in tma.launches[0].args] == ["ptr", "tma", "scalar", "scalar"]
    assert tma.scalars[0].name == "alpha" and tma.scalars[0].dtype == "float32"


def test_cubins_are_content_addressed_and_listed(built):
    out, _, m = built
    import hashlib

    files = sorted(p.name for p in (out / "cubins").iterdir())
    listed = sorted({v.cubin.split("/")[-1] for k in m.kernels.values() for v in k.variants})
    assert files == listed
    for name in files:
        assert hashlib.sha256((out / "cubins" / name).read_bytes()).hexdigest() + ".cubin" == name


def test_rebuild_from_cache_gives_identical_bytes(built, tmp_path):
    out, cache, _ = built
    logs = []
    build([TOY], BuildOptions(out_dir=tmp_path, cache_dir=cache, jobs=1), log=logs.append)
    assert "0 to build" in logs[0]
    assert (tmp_path / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()


def test_clean_builds_are_byte_identical(built, tmp_path):
    out, _, _ = built
    build([TOY], BuildOptions(out_dir=tmp_path, jobs=2), log=lambda *_: None)  # no cache, 2 workers
    for rel in ["manifest.json", *[f"cubins/{p.name}" for p in (out / "cubins").iterdir()]]:
        assert (tmp_path / rel).read_bytes() == (out / rel).read_bytes(), rel


def test_changed_source_invalidates_the_cache(built, tmp_path):
    _, cache, _ = built
    pkg = tmp_path / "src"
    pkg.mkdir()
    shutil.copy(HERE / "toy_kernels.py", pkg / "toy_kernels_copy.py")
    sys.path.insert(0, str(pkg))
    try:
        logs = []
        build(["toy_kernels_copy"], BuildOptions(out_dir=tmp_path / "a", cache_dir=cache, jobs=1), log=logs.append)
        assert "0 cached" in logs[0]
    finally:
        sys.path.remove(str(pkg))


def test_stale_cubins_are_removed_and_manifest_written_last(built, tmp_path):
    out, cache, _ = built
    shutil.copytree(out, tmp_path / "o")
    (tmp_path / "o" / "cubins" / "deadbeef.cubin").write_bytes(b"old")
    build([TOY], BuildOptions(out_dir=tmp_path / "o", cache_dir=cache, jobs=1), log=lambda *_: None)
    assert not (tmp_path / "o" / "cubins" / "deadbeef.cubin").exists()
    assert not list((tmp_path / "o").glob(".tmp-*"))


def test_module_without_kernels_is_an_error(tmp_path):
    with pytest.raises(AotError, match="declares no kernels"):
        build(["json"], BuildOptions(out_dir=tmp_path), log=lambda *_: None)


def test_unimportable_module_is_an_error_naming_it(tmp_path):
    with pytest.raises(AotError, match="cannot import kernel module 'no_such_kernels'"):
        build(["no_such_kernels"], BuildOptions(out_dir=tmp_path), log=lambda *_: None)


def test_unknown_output_name_names_the_kernel(tmp_path):
    from tilebin.aot._facts import signature
    import toy_kernels

    func = toy_kernels.transpose("float32")
    with pytest.raises(AotError, match="outputs \\['Z'\\]"):
        signature(func, "kernel toy.transpose", ("Z",), 16)


def test_manifest_json_is_sorted_and_stable(built):
    """The envelope on line 1, then one kernel per line in name order, each with sorted keys (the
    layout the runtime decodes kernel by kernel); rewriting the parsed manifest gives the same bytes."""
    from tilebin.runtime._manifest import parse_manifest

    out, _, _ = built
    text = (out / "manifest.json").read_text()
    lines = text.splitlines()
    names = [json.loads("{" + line.removesuffix(",") + "}").popitem()[0] for line in lines[1:-1]]
    assert names == sorted(json.loads(text)["kernels"]) and lines[-1] == "}}"
    for line in lines[1:-1]:
        body = json.loads("{" + line.removesuffix(",") + "}").popitem()[1]
        assert line.endswith(json.dumps(body, sort_keys=True, separators=(",", ":")) + ("," if line != lines[-2] else ""))
    assert parse_manifest(text).to_json() == text


def test_cluster_cooperative_and_pdl_flags_reach_the_manifest(tmp_path, monkeypatch):
    """The launch flags of real lowerings: cluster dims (toy), cooperative and PDL (tilebin's test kernels)."""
    import toy_kernels

    monkeypatch.setattr(toy_kernels, "KERNELS", toy_kernels.CLUSTER_KERNELS)
    m = build([TOY, "tilebin.kernels.testing.coop_sum", "tilebin.kernels.testing.pdl_chain"],
              BuildOptions(out_dir=tmp_path, jobs=1), log=lambda *_: None)
    (cl,) = m.kernels["toy.cluster_scale"].variants[0].launches
    assert cl.cluster == (2, 1, 1) and not cl.cooperative and not cl.pdl
    (coop,) = m.kernels["testing.coop_sum"].variants[0].launches
    assert coop.cooperative and coop.cluster == (1, 1, 1)
    first, second = m.kernels["testing.pdl_chain"].variants[0].launches
    assert not first.pdl and second.pdl
    assert [a.param for a in first.args if a.kind == "ptr"] == ["x", "y"]
    assert [a.param for a in second.args if a.kind == "ptr"] == ["y", "z"]
