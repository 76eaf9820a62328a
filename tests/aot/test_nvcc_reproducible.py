"""nvcc names internal-linkage symbols after the source file's absolute path: the AOT build compiles
every source at a path that depends on the source only, so the bytes do not depend on the build's
temp dir (kernels that include the CuTe headers -- T.gemm -- have such symbols)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tilebin.aot._nvcc import ARCH, compile_cubin, find_nvcc

SOURCE = """#include <cuda/std/utility>
namespace { __device__ int helper(int x) { return x * 3; } }
extern "C" __global__ void main_kernel(int* p) { auto q = cuda::std::make_pair(helper(p[0]), 1); p[1] = q.first; }
"""


@pytest.fixture(scope="module")
def nvcc():
    try:
        return find_nvcc(None, False)
    except Exception as exc:  # noqa: BLE001 - no toolchain on this machine
        pytest.skip(f"no nvcc 13.0: {exc}")


def test_same_source_same_cubin_from_any_temp_dir(nvcc, tmp_path, monkeypatch):
    flags = [f"-arch={ARCH}", "-cubin"]
    first = compile_cubin(nvcc, SOURCE, flags, "toy")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert compile_cubin(nvcc, SOURCE, flags, "toy") == first


def test_the_path_matters_to_nvcc(nvcc, tmp_path):
    """The fact the build relies on: one source compiled in two folders gives two cubins."""
    outs = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "kernel.cu").write_text(SOURCE)
        subprocess.run([nvcc.path, f"-arch={ARCH}", "-cubin", "-o", "k.cubin", "kernel.cu"], cwd=folder, check=True)
        outs.append((folder / "k.cubin").read_bytes())
    assert outs[0] != outs[1]
