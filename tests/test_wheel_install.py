"""The built wheel in a clean virtual environment that has cuda-bindings and nothing else.

Proves the one rule of DESIGN.md on the artifact users get: importing and using
``tilebin.runtime`` pulls in none of tilelang, TVM, torch, ``tilebin.aot`` or
``tilebin.kernels``; the runtime lists exactly the packaged kernels; and a launch on a
machine without a usable GPU raises ``tilebin.runtime.DeviceError`` (CUDA_VISIBLE_DEVICES
is emptied, so this holds on GPU machines too).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile

import pytest

BANNED = ("tilelang", "tvm", "tvm_ffi", "torch", "tilebin.aot", "tilebin.kernels")

_CHECK = textwrap.dedent(
    """
    import importlib.resources, json, sys

    BANNED = {banned!r}

    def banned_loaded():
        return sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BANNED))

    import tilebin.runtime as rt
    print("RUNTIME", rt.__file__)
    assert "site-packages" in rt.__file__, f"imported {{rt.__file__}}, not the installed wheel"
    assert not banned_loaded(), f"import tilebin.runtime loaded {{banned_loaded()}}"
    assert rt.hot_path() == "c", "the compiled hot path (tilebin.runtime._hot) does not load from the wheel"
    import tilebin.runtime._hot as hot
    print("HOT", hot.__file__)

    manifest = json.loads((importlib.resources.files("tilebin") / "_artifacts" / "manifest.json").read_text())
    packaged = sorted(manifest["kernels"])
    names = sorted(rt.kernel_names(internal=True))
    assert names == packaged, f"kernel_names() {{names}} != manifest {{packaged}}"
    print("KERNELS", len(names))

    class DeviceArray:
        # A framework-free device tensor: __cuda_array_interface__ v3, C-contiguous, fake pointer.
        TYPESTR = {{"float64": "<f8", "float32": "<f4", "float16": "<f2", "int64": "<i8", "int32": "<i4",
                   "int16": "<i2", "int8": "|i1", "uint8": "|u1", "bool": "|b1"}}

        def __init__(self, shape, dtype, ptr):
            self.__cuda_array_interface__ = {{"shape": tuple(shape), "typestr": self.TYPESTR[dtype],
                                              "data": (ptr, False), "strides": None, "version": 3}}

    def call_for(name):
        # Positional args (in the kernel's params order) and key kwargs for one of its variants
        # whose tensors __cuda_array_interface__ can describe; None if it has none.
        from tilebin.runtime._expr import evaluate
        kernel = manifest["kernels"][name]
        for variant in kernel["variants"]:
            tensors = {{t["name"]: t for t in variant["tensors"]}}
            if not all(t["dtype"] in DeviceArray.TYPESTR for t in tensors.values()):
                continue
            env, args = {{}}, []
            for i, p in enumerate(kernel["params"]):
                if p["kind"] != "tensor":
                    args.append(1)
                    continue
                t = tensors[p["name"]]
                shape = [d if isinstance(d, int) else env.setdefault(d, 64) if isinstance(d, str)
                         else evaluate(d, env) for d in t["shape"]]
                args.append(DeviceArray(shape, t["dtype"], 0x7F0000000000 + (i << 32)))
            return args, dict(variant["key"])
        return None

    preferred = ["transpose.batched_transpose"] + packaged
    name, (args, key) = next((n, c) for n in preferred if n in packaged for c in [call_for(n)] if c)
    try:
        rt.launch(name, *args, **key)
    except rt.DeviceError as exc:
        print("DEVICE_ERROR", name, exc)
    else:
        raise AssertionError(f"launch({{name!r}}) succeeded with no GPU visible")
    assert not banned_loaded(), f"a launch loaded {{banned_loaded()}}"
    print("OK")
    """
)


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _cuda_bindings_requirement(wheel) -> str:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = re.findall(r"^Requires-Dist: (.+)$", zf.read(meta).decode(), re.M)
    req = next((r for r in requires if re.match(r"cuda[-_]bindings\b", r)), None)
    assert req, f"the wheel does not require cuda-bindings: {requires}"
    return req.split(";")[0].strip()


@pytest.fixture(scope="module")
def clean_venv(built_wheel, tmp_path_factory):
    """A fresh venv with the wheel (--no-deps) and the cuda-bindings its metadata asks for."""
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "--quiet", _cuda_bindings_requirement(built_wheel)], timeout=600)
    _run([py, "-m", "pip", "install", "--quiet", "--no-deps", built_wheel], timeout=300)
    return py


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TILEBIN_"))}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no usable GPU, even on a GPU machine
    return env


def test_venv_has_only_the_runtime_dependencies(clean_venv):
    listed = _run([clean_venv, "-m", "pip", "list", "--format=json"]).stdout
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
    heavy = sorted(names & {"tilelang", "torch", "apache-tvm-ffi", "triton"})
    assert not heavy, f"the clean venv unexpectedly has {heavy}"
    assert {"tilebin", "cuda-bindings"} <= names


def test_runtime_imports_lists_kernels_and_fails_cleanly_without_gpu(clean_venv, tmp_path):
    script = _CHECK.format(banned=BANNED)
    proc = subprocess.run([str(clean_venv), "-c", script], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    out = f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, out
    assert "DEVICE_ERROR" in proc.stdout and proc.stdout.rstrip().endswith("OK"), out
