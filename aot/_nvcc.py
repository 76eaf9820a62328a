"""Compile TileLang's CUDA source to a cubin with the project's pinned nvcc."""

from __future__ import annotations

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


@dataclass(frozen=True)
class Nvcc:
    path: str
    release: str  # "13.0"
    version: str  # "13.0.88"

    @property
    def min_driver_cuda(self) -> int:
        return MIN_DRIVER_CUDA.get(int(self.release.split(".")[0]), int(self.release.split(".")[0]) * 1000)


def find_nvcc(explicit: str | None = None, allow_other_version: bool = False) -> Nvcc:
    """The nvcc to use: ``explicit``, else $CUDA_HOME/bin/nvcc, else /usr/local/cuda, else PATH."""
    candidates = [explicit] if explicit else [
        os.path.join(os.environ[v], "bin", "nvcc") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)
    ] + ["/usr/local/cuda/bin/nvcc", shutil.which("nvcc") or ""]
    for path in filter(None, candidates):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            nvcc = _probe(path)
            if nvcc.release != PINNED_NVCC and not allow_other_version:
                raise AotError(
                    f"nvcc at {path} is CUDA {nvcc.version}; tilebin pins CUDA {PINNED_NVCC} for its cubins. "
                    f"Install CUDA {PINNED_NVCC} (or pass --nvcc PATH), or --allow-nvcc-mismatch to build anyway"
                )
            return nvcc
    raise AotError(f"nvcc not found (looked at {candidates}); install CUDA {PINNED_NVCC} or pass --nvcc PATH")


@lru_cache(maxsize=None)
def _probe(path: str) -> Nvcc:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", out)
    if not m:
        raise AotError(f"cannot read the version of {path} (`nvcc --version` printed: {out.strip()!r})")
    return Nvcc(path, m.group(1), m.group(2))


def nvcc_flags(include_dirs: list[str], lineinfo: bool, extra: list[str]) -> list[str]:
    flags = ["--cubin", "-O3", "-std=c++20", f"-arch={ARCH}", "-w"]
    flags += [f"-I{d}" for d in include_dirs]
    if lineinfo:
        flags.append("-lineinfo")
    return flags + list(extra)


def compile_cubin(nvcc: Nvcc, source: str, flags: list[str], where: str) -> bytes:
    """nvcc the source in a private temp dir with a fixed file name (reproducible bytes)."""
    with tempfile.TemporaryDirectory(prefix="tilebin-nvcc-") as tmp:
        src, out = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w") as f:
            f.write(source)
        proc = subprocess.run([nvcc.path, *flags, "-o", out, src], capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            raise AotError(f"{where}: nvcc failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        with open(out, "rb") as f:
            return f.read()
