"""Registries that compose: tilebin's own artifacts first, then $TILEBIN_KERNEL_PATH, then added ones.

A package ships its own kernels in its own folder (``Registry.for_package``), ``runtime.launch``
finds them through the search path, names never collide, and tilebin's own kernels cannot be
shadowed.  Launches go to the fake driver (``fake_gpu``).
"""

from __future__ import annotations

import sys

import pytest
import rt_fakes as F
from test_runtime_conditions import _bias_kernel


@pytest.fixture(autouse=True)
def _fresh_path(monkeypatch):
    from tilebin.runtime import _search

    monkeypatch.delenv("TILEBIN_KERNEL_PATH", raising=False)
    _search.reset()
    yield
    _search.reset()


@pytest.fixture
def own(tmp_path, rt):
    """A registry standing for tilebin's own (searches the path), over the standard toy manifest."""
    return rt.Registry(F.write_artifacts(tmp_path / "own", F.standard_manifest()), search_path=True)


def _user_folder(tmp_path, name="user"):
    return F.write_artifacts(tmp_path / name, _bias_kernel())


def test_added_registry_serves_names_the_own_one_lacks(own, tmp_path, fake_gpu, rt):
    from tilebin.runtime import _search

    user = rt.Registry(_user_folder(tmp_path))
    assert _search.add(own, user) is user
    x, out = F.tensor((4, 64)), F.tensor((4, 64))
    own.launch("toy.bias", x, None, out)
    assert fake_gpu.launches[-1]["fn"] == "quant_a"
    assert own.spec("toy.bias") is user.spec("toy.bias")
    assert "toy.bias" in own.kernel_names() and "toy.scale" in own.kernel_names()
    assert "toy.bias" not in user.kernel_names() or user.kernel_names() == ["toy.bias"]
    own.prepare("toy.bias", x, None, out)()
    assert len(fake_gpu.launches) == 2
    assert _search.add(own, user) is user  # adding again is a no-op
    assert _search.add(own, user.artifacts_dir) is user


def test_unknown_name_lists_the_whole_path(own, tmp_path, rt):
    from tilebin.runtime import _search

    _search.add(own, _user_folder(tmp_path))
    with pytest.raises(rt.UnknownKernelError, match="toy.bias"):
        own.spec("toy.biass")


def test_a_name_already_on_the_path_is_refused(own, tmp_path, rt):
    from tilebin.runtime import _search

    clash = F.write_artifacts(tmp_path / "clash", F.manifest(**{"toy.scale": F.scale_kernel()}))
    with pytest.raises(rt.ArtifactError, match=r"toy\.scale, already provided by .*own"):
        _search.add(own, clash)
    assert "toy.scale" in own.kernel_names()


def test_own_kernels_are_never_shadowed(own, tmp_path, fake_gpu, rt):
    """A registry that does not search (a package's own) never sees the path, and tilebin's own
    names resolve to tilebin's own artifacts first."""
    from tilebin.runtime import _search

    _search.add(own, _user_folder(tmp_path))
    user = rt.Registry(_user_folder(tmp_path, "user2"))
    with pytest.raises(rt.UnknownKernelError):
        user.spec("toy.scale")
    assert own.spec("toy.scale") is own.manifest.kernels["toy.scale"]


def test_kernel_path_variable(own, tmp_path, monkeypatch, fake_gpu, rt):
    import os

    first = _user_folder(tmp_path)
    other = F.write_artifacts(tmp_path / "other", F.manifest(**{"toy.gemm2": F.gemm_kernel()}))
    monkeypatch.setenv("TILEBIN_KERNEL_PATH", f"{first}{os.pathsep}{other}")
    own.launch("toy.bias", F.tensor((2, 8)), None, F.tensor((2, 8)))
    assert fake_gpu.launches[-1]["fn"] == "quant_a"
    assert {"toy.bias", "toy.gemm2"} <= set(own.kernel_names())


def test_kernel_path_with_a_clash_names_the_variable(own, tmp_path, monkeypatch, rt):
    clash = F.write_artifacts(tmp_path / "clash", F.manifest(**{"toy.scale": F.scale_kernel()}))
    monkeypatch.setenv("TILEBIN_KERNEL_PATH", str(clash))
    with pytest.raises(rt.ArtifactError, match="TILEBIN_KERNEL_PATH entry"):
        own.spec("toy.nothing")


def test_unchecked_launcher_of_a_path_kernel_is_its_registry(own, tmp_path, fake_gpu, rt):
    pytest.importorskip("torch", reason="unchecked launchers read torch's current stream")
    from tilebin.runtime import _search

    user = _search.add(own, F.write_artifacts(tmp_path / "u", F.manifest(**{"toy.scale2": F.scale_kernel()})))
    launcher = own.unchecked_launcher("toy.scale2", dtype="bfloat16", block=128)
    assert launcher is user.unchecked_launcher("toy.scale2", dtype="bfloat16", block=128)


def test_for_package_loads_a_packages_own_artifacts_once(tmp_path, monkeypatch, rt):
    pkg = tmp_path / "site" / "my_kernels_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    F.write_artifacts(pkg / "_artifacts", _bias_kernel())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    reg = rt.Registry.for_package("my_kernels_pkg")
    assert reg is rt.Registry.for_package("my_kernels_pkg")
    assert reg.kernel_names() == ["toy.bias"]
    with pytest.raises(rt.ArtifactError, match="cannot import package 'no_such_pkg_xyz'"):
        rt.Registry.for_package("no_such_pkg_xyz")
    sys.modules.pop("my_kernels_pkg", None)


def test_add_artifacts_uses_the_default_registry(own, tmp_path, monkeypatch, rt):
    from tilebin.runtime import _registry

    monkeypatch.setattr(_registry, "_DEFAULT", [own])
    reg = rt.add_artifacts(_user_folder(tmp_path))
    assert rt.default_registry().spec("toy.bias") is reg.spec("toy.bias")
