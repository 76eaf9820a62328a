"""The pip CUDA toolchain (the build's default nvcc) and a system nvcc 13.0 build the same bytes.

The end-to-end test lowers two small real kernels with ``python -m tilebin.aot build --nvcc X``
once per toolchain (no cache) and compares every output file's sha256 (cubins and manifest).
It skips only when one of the two toolchains is absent.  The rest checks find_nvcc's choice.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

from tilebin.aot import AotError
from tilebin.aot import _nvcc
from tilebin.aot._nvcc import PIP_TOOLCHAIN, find_nvcc, pip_nvcc

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ("tilebin.kernels.engram.fused_weight", "tilebin.kernels.transpose.batched_transpose")
SYSTEM_NVCC = os.environ.get("TILEBIN_SYSTEM_NVCC", "/usr/local/cuda/bin/nvcc")


def _aot_build(nvcc: str, out: pathlib.Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TILEBIN_NVCC", None)
    cmd = [sys.executable, "-m", "tilebin.aot", "build", *MODULES, "--out", str(out), "--nvcc", nvcc, "--jobs", "2"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def test_pip_and_system_nvcc_build_identical_cubins(tmp_path):
    pytest.importorskip("tilelang")
    pip = pip_nvcc()
    if pip is None:
        pytest.skip(f"the pip CUDA toolchain is absent from {sys.executable} (./wheels/build.sh installs it)")
    if not os.access(SYSTEM_NVCC, os.X_OK):
        pytest.skip(f"the system nvcc is absent: no {SYSTEM_NVCC} (set TILEBIN_SYSTEM_NVCC)")
    system_version = _nvcc._probe(SYSTEM_NVCC).version
    if system_version != PIP_TOOLCHAIN["nvidia-cuda-nvcc"]:
        pytest.skip(f"the system nvcc {SYSTEM_NVCC} is {system_version}, not {PIP_TOOLCHAIN['nvidia-cuda-nvcc']}")
    from_pip = _aot_build(pip, tmp_path / "pip")
    from_system = _aot_build(SYSTEM_NVCC, tmp_path / "system")
    cubins = [f for f in from_pip if f.endswith(".cubin")]
    assert len(cubins) >= 4 and "manifest.json" in from_pip, f"too little built: {sorted(from_pip)}"
    assert from_pip == from_system, f"pip nvcc {pip} and {SYSTEM_NVCC} differ:\n{from_pip}\n{from_system}"


def _fake_nvcc(folder: pathlib.Path, version: str = "13.0.88") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nvcc"
    release = version.rsplit(".", 1)[0]
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{version}'\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """A fake pip toolchain nvcc; find_nvcc's other candidates point at nothing."""
    path = _fake_nvcc(tmp_path / "pip")
    monkeypatch.setattr(_nvcc, "pip_nvcc", lambda: path)
    monkeypatch.setattr(_nvcc, "check_pip_toolchain", lambda: None)
    for var in ("TILEBIN_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    return path


def test_pip_toolchain_is_the_default_over_cuda_home(fake_pip, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "home"))
    _fake_nvcc(tmp_path / "home" / "bin")
    nvcc = find_nvcc()
    assert (nvcc.path, nvcc.source) == (fake_pip, "pip")


def test_explicit_and_env_nvcc_win_over_pip(fake_pip, tmp_path, monkeypatch):
    system = _fake_nvcc(tmp_path / "system")
    assert find_nvcc(system).path == system
    monkeypatch.setenv("TILEBIN_NVCC", system)
    assert (find_nvcc().path, find_nvcc().source) == (system, "$TILEBIN_NVCC")
    monkeypatch.setenv("TILEBIN_NVCC", str(tmp_path / "nowhere" / "nvcc"))
    with pytest.raises(AotError, match="nowhere/nvcc.*not an executable"):
        find_nvcc()


def test_nvcc_pip_accepts_only_the_pip_toolchain(fake_pip, monkeypatch):
    monkeypatch.setenv("TILEBIN_NVCC", "pip")
    assert find_nvcc().path == fake_pip
    monkeypatch.setattr(_nvcc, "pip_nvcc", lambda: None)
    with pytest.raises(AotError, match="no pip CUDA toolchain.*nvidia-cuda-nvcc==13.0.88"):
        find_nvcc()


def test_a_pip_toolchain_off_its_pins_is_refused(monkeypatch):
    versions = {**PIP_TOOLCHAIN, "nvidia-nvvm": "13.5.37"}
    monkeypatch.setattr(_nvcc.importlib.metadata, "version", lambda dist: versions[dist])
    with pytest.raises(AotError, match="nvidia-nvvm is 13.5.37, want 13.0.88"):
        _nvcc.check_pip_toolchain()


def test_build_sh_installs_exactly_the_pinned_toolchain():
    text = (ROOT / "wheels" / "build.sh").read_text()
    pins = dict(re.findall(r'^\s*"(nvidia-[a-z-]+)==([0-9.]+)"', text, re.M))
    assert pins == PIP_TOOLCHAIN, f"wheels/build.sh REQUIREMENTS pin {pins}, aot/_nvcc.py PIP_TOOLCHAIN {PIP_TOOLCHAIN}"
