"""Compile TileLang's CUDA source to a cubin with the project's pinned nvcc.

The default nvcc is NVIDIA's PyPI toolchain in the build's own Python environment (``PIP_TOOLCHAIN``,
installed by ./wheels/build.sh), so every builder compiles with the same bytes of nvcc, cicc, ptxas
and headers.  A system CUDA toolkit is used only when asked for (``--nvcc PATH`` or
``$TILEBIN_NVCC``), or as a fallback when the pip toolchain is not installed.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache

from ._errors import AotError

PINNED_NVCC = "13.0"  # the CUDA release whose nvcc builds the shipped cubins
ARCH = "sm_90a"
# cuDriverGetVersion() value a cubin from each CUDA major needs (13.x -> driver 580+, 12.x -> 525+)
MIN_DRIVER_CUDA = {13: 13000, 12: 12000}
# NVIDIA's PyPI wheels of CUDA 13.0's compiler, exactly the versions of /usr/local/cuda 13.0's nvcc:
# nvcc + ptxas + fatbinary, nvvm (cicc, libdevice), crt and runtime headers (cuda_runtime.h), and
# cccl (<cuda/std/...>, which CUTLASS/CuTe include). nvidia-cuda-nvcc alone pulls the newest
# nvvm/crt/runtime (13.5 today), a different cicc: hence every one is pinned.
PIP_TOOLCHAIN = {
    "nvidia-cuda-nvcc": "13.0.88",
    "nvidia-nvvm": "13.0.88",
    "nvidia-cuda-crt": "13.0.88",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cuda-cccl": "13.0.85",
}
PIP_NVCC_SUBPATH = os.path.join("cu13", "bin", "nvcc")  # under the `nvidia` namespace package
NVCC_ENV = "TILEBIN_NVCC"  # an explicit nvcc for the build (e.g. /usr/local/cuda/bin/nvcc), or "pip"


@dataclass(frozen=True)
class Nvcc:
    path: str
    release: str  # "13.0"
    version: str  # "13.0.88"
    source: str = "explicit"  # where find_nvcc found it: explicit, $TILEBIN_NVCC, pip, system

    @property
    def min_driver_cuda(self) -> int:
        return MIN_DRIVER_CUDA.get(int(self.release.split(".")[0]), int(self.release.split(".")[0]) * 1000)


def pip_nvcc() -> str | None:
    """nvcc of the pip toolchain (``nvidia/cu13/bin/nvcc``) importable by this Python, or None."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, PIP_NVCC_SUBPATH)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def check_pip_toolchain() -> None:
    """Every PIP_TOOLCHAIN wheel is installed at its pinned version, else AotError naming the fix."""
    wrong = []
    for dist, want in PIP_TOOLCHAIN.items():
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            have = "missing"
        if have != want:
            wrong.append(f"{dist} is {have}, want {want}")
    if wrong:
        pins = " ".join(f"'{d}=={v}'" for d, v in PIP_TOOLCHAIN.items())
        raise AotError(f"the pip CUDA toolchain at {pip_nvcc()} is not the pinned set ({'; '.join(wrong)}); "
                       f"fix: pip install {pins} (./wheels/build.sh does), or pass --nvcc PATH")


def _candidates(explicit: str | None) -> list[tuple[str, str]]:
    """(path, source) to try in order: explicit, $TILEBIN_NVCC, the pip toolchain, then a system CUDA.
    ``pip`` as the explicit or $TILEBIN_NVCC value means the pip toolchain only."""
    chosen = explicit or os.environ.get(NVCC_ENV)
    if chosen == "pip":  # the pip toolchain and nothing else (.ci/run)
        return [(pip_nvcc() or "", "pip")]
    if chosen:
        return [(chosen, "explicit" if explicit else f"${NVCC_ENV}")]
    found = [(pip_nvcc() or "", "pip")]
    found += [(os.path.join(os.environ[v], "bin", "nvcc"), f"${v}") for v in ("CUDA_HOME", "CUDA_PATH")
              if os.environ.get(v)]
    return found + [("/usr/local/cuda/bin/nvcc", "system"), (shutil.which("nvcc") or "", "PATH")]


def find_nvcc(explicit: str | None = None, allow_other_version: bool = False) -> Nvcc:
    """The nvcc to use: ``explicit``, else $TILEBIN_NVCC, else the pip toolchain, else $CUDA_HOME,
    $CUDA_PATH, /usr/local/cuda, PATH.  An explicit path that is not an executable is an error;
    ``"pip"`` (explicit or $TILEBIN_NVCC) accepts only the pinned pip toolchain."""
    candidates = _candidates(explicit)
    for path, source in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            nvcc = _probe(path, source)
            if nvcc.release != PINNED_NVCC and not allow_other_version:
                raise AotError(
                    f"nvcc at {path} ({source}) is CUDA {nvcc.version}; tilebin pins CUDA {PINNED_NVCC} for its "
                    f"cubins. Install CUDA {PINNED_NVCC} (or pass --nvcc PATH), or --allow-nvcc-mismatch to build anyway"
                )
            if source == "pip" and not allow_other_version:
                check_pip_toolchain()
            return nvcc
        if source in ("explicit", f"${NVCC_ENV}"):
            raise AotError(f"nvcc {path!r} ({source}) is not an executable file; fix: give the path of a CUDA "
                           f"{PINNED_NVCC} nvcc (e.g. /usr/local/cuda/bin/nvcc), or unset it to use the pip toolchain")
    looked = [p for p, _ in candidates if p]
    pins = " ".join(f"'{d}=={v}'" for d, v in PIP_TOOLCHAIN.items())
    raise AotError(f"nvcc not found (no pip CUDA toolchain; looked at {looked}); fix: pip install {pins} "
                   f"(./wheels/build.sh does), or install CUDA {PINNED_NVCC} and pass --nvcc PATH")


@lru_cache(maxsize=None)
def _probe(path: str, source: str = "explicit") -> Nvcc:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", out)
    if not m:
        raise AotError(f"cannot read the version of {path} (`nvcc --version` printed: {out.strip()!r})")
    return Nvcc(path, m.group(1), m.group(2), source)


def nvcc_flags(include_dirs: list[str], lineinfo: bool, extra: list[str]) -> list[str]:
    flags = ["--cubin", "-O3", "-std=c++20", f"-arch={ARCH}", "-w"]
    flags += [f"-I{d}" for d in include_dirs]
    if lineinfo:
        flags.append("-lineinfo")
    return flags + list(extra)


def compile_cubin(nvcc: Nvcc, source: str, flags: list[str], where: str) -> bytes:
    """nvcc the source as ``/tmp/tilebin-nvcc/<sha256 of source>/kernel.cu`` (reproducible bytes).

    nvcc names internal-linkage symbols (anonymous namespaces, e.g. in the CuTe headers that
    ``T.gemm`` kernels include) after the source file's absolute path: a random temp dir made
    those cubins differ from build to build.  The path depends on the source only; a lock file
    serializes two jobs with the same source, and each writes its own output file.
    """
    folder = os.path.join(_STABLE_TMP, hashlib.sha256(source.encode()).hexdigest()[:32])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        src = os.path.join(folder, "kernel.cu")
        with open(src, "w") as f:
            f.write(source)
        fd, out = tempfile.mkstemp(suffix=".cubin", dir=folder)
        os.close(fd)
        try:
            proc = subprocess.run([nvcc.path, *flags, "-o", out, src], capture_output=True, text=True, cwd=folder)
            if proc.returncode != 0:
                raise AotError(f"{where}: nvcc failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
            with open(out, "rb") as f:
                return f.read()
        finally:
            os.unlink(out)


_STABLE_TMP = "/tmp/tilebin-nvcc"  # the same absolute path on every build machine (see compile_cubin)