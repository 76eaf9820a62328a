"""GPU-free stand-ins for the runtime's tests: CUDA-array-interface tensors, toy manifests, a fake driver.

Nothing here can reach a real GPU: fake tensors carry made-up pointers, and :class:`FakeDriver`
replaces every driver entry point the launch path calls while borrowing cuda-python's enums
and launch-config structs (constructible without a driver).
"""

from __future__ import annotations

import copy
import ctypes
import json
import math
from pathlib import Path
from typing import Any

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint8": 1, "int8": 1,
            "float8_e4m3fn": 1, "float64": 8, "bool": 1}
TYPESTR = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int64": "<i8", "uint8": "|u1", "int8": "|i1",
           "float64": "<f8", "bool": "|b1", "bfloat16": "<V2", "float8_e4m3fn": "|V1"}

_NEXT = [0x7F0000000000]


class FakeTensor:
    """A device tensor as seen through ``__cuda_array_interface__`` (v3) and ``__dlpack_device__``."""

    def __init__(self, shape, dtype="float32", strides=None, ptr=None, device=0, dl_kind=2):
        self.shape, self.dtype_name = tuple(shape), dtype
        self.itemsize = ITEMSIZE[dtype]
        self.strides = None if strides is None else tuple(strides)  # elements
        if ptr is None:
            ptr = _NEXT[0]
            _NEXT[0] += (self.extent() // 4096 + 2) * 4096
        self.ptr, self.device, self.dl_kind = ptr, device, dl_kind

    @property
    def dtype(self) -> str:  # lets the runtime name void typestrs (bfloat16, fp8)
        return self.dtype_name

    def extent(self) -> int:
        return max(math.prod(self.shape), 1) * self.itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        strides = None if self.strides is None else tuple(s * self.itemsize for s in self.strides)
        return {"shape": self.shape, "typestr": TYPESTR[self.dtype_name], "data": (self.ptr, False),
                "strides": strides, "version": 3}

    def __dlpack_device__(self):
        return (self.dl_kind, self.device)


def tensor(name_or_shape, **kw) -> FakeTensor:
    return FakeTensor(name_or_shape, **kw)


# ----------------------------------------------------------------------------- manifests
def scale_kernel() -> dict:
    """toy.scale(x[m, n], out[m, n], alpha): bf16/f16 variants, a second bf16 one to test first-wins."""
    def variant(dtype, block):
        return {
            "key": {"dtype": dtype, "block": block},
            "cubin": f"cubins/scale_{dtype}_{block}.cubin", "sha256": "0" * 64,
            "tensors": [
                {"name": "x", "dtype": dtype, "shape": ["m", "n"], "strides": ["n", 1], "align": 16,
                 "max_elements": 2**31 - 1},
                {"name": "out", "dtype": dtype, "shape": ["m", "n"], "strides": ["n", 1], "align": 16,
                 "output": True},
            ],
            "scalars": [{"name": "alpha", "dtype": "float32"}],
            "launches": [{
                "entry": f"scale_{dtype}_{block}", "grid": [["floordiv", ["add", "m", block - 1], block], 1, 1],
                "block": [block, 1, 1], "smem": 0,
                "args": [{"kind": "ptr", "param": "x"}, {"kind": "ptr", "param": "out"},
                         {"kind": "scalar", "dtype": "int32", "value": "m"},
                         {"kind": "scalar", "dtype": "int32", "value": "n"},
                         {"kind": "scalar", "dtype": "float32", "value": "alpha"}],
            }],
        }
    return {
        "params": [{"name": "x", "kind": "tensor", "rank": 2}, {"name": "out", "kind": "tensor", "rank": 2},
                   {"name": "alpha", "kind": "scalar"}],
        "variants": [variant("bfloat16", 128), variant("float16", 128), variant("bfloat16", 256)],
    }


def gemm_kernel() -> dict:
    """toy.gemm(a[m, k], b[n, k], c[m, n]) with static (n, k) variants and a TMA descriptor on a."""
    def variant(n, k):
        return {
            "key": {"n": n, "k": k},
            "cubin": f"cubins/gemm_{n}_{k}.cubin", "sha256": "1" * 64,
            "tensors": [
                {"name": "a", "dtype": "bfloat16", "shape": ["m", k], "strides": [k, 1]},
                {"name": "b", "dtype": "bfloat16", "shape": [n, k], "strides": [k, 1]},
                {"name": "c", "dtype": "bfloat16", "shape": ["m", n], "strides": [n, 1], "output": True},
            ],
            "tma": [{"param": "a", "dtype": 9, "rank": 2, "dims": [k, "m"], "strides": [k * 2],
                     "box": [64, 64], "elem_strides": [1, 1], "interleave": 0, "swizzle": 3,
                     "l2_promotion": 2, "oob_fill": 0}],
            "launches": [{
                "entry": f"gemm_{n}_{k}", "grid": [n // 128, ["floordiv", ["add", "m", 63], 64], 1],
                "block": [256, 1, 1], "smem": 98304, "cluster": [2, 1, 1], "pdl": True,
                "args": [{"kind": "tma", "tma": 0}, {"kind": "ptr", "param": "b"}, {"kind": "ptr", "param": "c"},
                         {"kind": "scalar", "dtype": "int32", "value": "m"}],
            }],
        }
    return {
        "params": [{"name": "a", "kind": "tensor", "rank": 2}, {"name": "b", "kind": "tensor", "rank": 2},
                   {"name": "c", "kind": "tensor", "rank": 2}],
        "variants": [variant(1024, 1024), variant(4096, 7168)],
    }


def quant_kernel() -> dict:
    """toy.quant(x[n], scale[ceil(n/128)], group) : an expression dim, a keyed scalar in the grid,
    two launches, a cooperative one, and an fp16 scalar argument."""
    return {
        "params": [{"name": "x", "kind": "tensor", "rank": 1}, {"name": "scale", "kind": "tensor", "rank": 1},
                   {"name": "group", "kind": "scalar"}, {"name": "eps", "kind": "scalar"}],
        "variants": [{
            "key": {"dtype": "float32"},
            "cubin": "cubins/quant.cubin", "sha256": "2" * 64,
            "tensors": [
                {"name": "x", "dtype": "float32", "shape": ["n"], "strides": [1]},
                {"name": "scale", "dtype": "float32", "shape": [["floordiv", ["add", "n", 127], 128]],
                 "strides": [1], "output": True, "align": 4},
            ],
            "scalars": [{"name": "group", "dtype": "int32"}, {"name": "eps", "dtype": "float32"}],
            "launches": [
                {"entry": "quant_a", "grid": [["floordiv", ["add", "n", ["sub", "group", 1]], "group"], 1, 1],
                 "block": [128, 1, 1], "smem": 0,
                 "args": [{"kind": "ptr", "param": "x"}, {"kind": "scalar", "dtype": "float16", "value": "eps"},
                          {"kind": "scalar", "dtype": "int64", "value": ["mul", "n", 2]}]},
                {"entry": "quant_b", "grid": [1, 1, 1], "block": [32, 1, 1], "smem": 0, "cooperative": True,
                 "args": [{"kind": "ptr", "param": "scale"}, {"kind": "ptr", "param": "x"},
                          {"kind": "scalar", "dtype": "int32", "value": "n"}]},
            ],
        }],
    }


def manifest(**kernels: dict) -> dict:
    kernels = copy.deepcopy(kernels)
    for name, k in kernels.items():
        k.setdefault("name", name)
    return {"schema_version": 1, "build": {"arch": "sm_90a", "min_driver_cuda": 13000}, "kernels": kernels}


def standard_manifest() -> dict:
    return manifest(**{"toy.scale": scale_kernel(), "toy.gemm": gemm_kernel(), "toy.quant": quant_kernel()})


def write_artifacts(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(data))
    return folder


# ----------------------------------------------------------------------------- fake driver
_FN_NAMES: dict[int, str] = {}


class FakeFn:
    """A fake CUfunction: ``int()`` gives a made-up handle, the recorder names launches by entry."""

    def __init__(self, name: str):
        self.name, self.id = name, 0x5000 + 0x10 * len(_FN_NAMES)
        _FN_NAMES[self.id] = name

    def __int__(self):
        return self.id


def fn_name(fn) -> str:
    """The entry name of a FakeFn or of its int handle (as the compiled path passes it)."""
    if isinstance(fn, FakeFn):
        return fn.name
    return _FN_NAMES.get(int(fn or 0), str(fn))


class _Config(ctypes.Structure):
    """The C ``CUlaunchConfig`` the compiled path hands to cuLaunchKernelEx."""

    _fields_ = [("g", ctypes.c_uint * 3), ("b", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("nattrs", ctypes.c_uint)]


_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p)
_LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_CTX_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
_CTX_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class FakeDriver:
    """Stands in for ``cuda.bindings.driver`` on the launch path; records what each launch saw.

    A recorded launch holds the grid/block/smem/stream and, per kernel argument, the 8 bytes
    (128 for ``tma_args``) its ``void**`` entry points at, read at the moment of the call.
    """

    def __init__(self, real: Any, arg_counts: dict[str, int], tma_args: dict[str, set[int]] | None = None):
        self._real, self.arg_counts, self.tma_args = real, arg_counts, tma_args or {}
        self.launches: list[dict] = []
        self.fail_next: list[int] = []  # CUresult codes to return from the next launches
        self.current = 0
        self.set_calls = 0
        # C entry points for the compiled hot path (cuGetProcAddress hands out their addresses)
        self._c = {b"cuLaunchKernel": _LAUNCH(self._c_launch), b"cuLaunchKernelEx": _LAUNCH_EX(self._c_launch_ex),
                   b"cuCtxGetCurrent": _CTX_GET(self._c_ctx_get), b"cuCtxSetCurrent": _CTX_SET(self._c_ctx_set)}

    def __getattr__(self, name):  # enums, structs: the real ones
        return getattr(self._real, name)

    def _record(self, fn, dims, smem, stream, addr, config=None):
        fn = fn_name(fn)
        stream = int(stream or 0)
        n = self.arg_counts[fn]
        params = (ctypes.c_void_p * n).from_address(addr) if n else []
        args = []
        for j in range(n):
            size = 128 if j in self.tma_args.get(fn, ()) else 8
            args.append(ctypes.string_at(params[j], size))
        self.launches.append({"fn": fn, "dims": dims, "smem": smem, "stream": stream, "args": args,
                              "config": config})
        code = self.fail_next.pop(0) if self.fail_next else 0
        return (self._real.CUresult(code),)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, addr, extra):
        return self._record(fn, ((gx, gy, gz), (bx, by, bz)), smem, stream, addr)

    def cuLaunchKernelEx(self, cfg, fn, addr, extra):
        dims = ((cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ), (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ))
        attrs = [(int(a.id), bytes(a.value.pad[:16])) for a in cfg.attrs[: cfg.numAttrs]]
        return self._record(fn, dims, cfg.sharedMemBytes, int(cfg.hStream), addr, config=attrs)

    def cuGetProcAddress(self, name, version, flags):
        addr = ctypes.cast(self._c[name], ctypes.c_void_p).value
        return (self._real.CUresult(0), addr, 0)

    def _c_launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, addr, extra):
        return int(self._record(fn, ((gx, gy, gz), (bx, by, bz)), smem, stream, addr)[0])

    def _c_launch_ex(self, cfg_addr, fn, addr, extra):
        cfg = _Config.from_address(cfg_addr)
        attrs = [(int.from_bytes(ctypes.string_at(cfg.attrs + 72 * i, 4), "little"),
                  ctypes.string_at(cfg.attrs + 72 * i + 8, 16)) for i in range(cfg.nattrs)]
        dims = (tuple(cfg.g), tuple(cfg.b))
        return int(self._record(fn, dims, cfg.smem, cfg.stream, addr, config=attrs)[0])

    def _c_ctx_get(self, out):
        out[0] = self.current or None
        return 0

    def _c_ctx_set(self, ctx):
        self.set_calls += 1
        self.current = int(ctx or 0)
        return 0

    def cuCtxGetCurrent(self):
        return (self._real.CUresult(0), self._real.CUcontext(self.current))

    def cuCtxSetCurrent(self, ctx):
        self.set_calls += 1
        self.current = int(ctx)
        return (self._real.CUresult(0),)

    # module loading (used when a test keeps the real Loader)
    def cuModuleLoadData(self, data):
        self.loaded = getattr(self, "loaded", []) + [bytes(data)]
        return (self._real.CUresult(0), f"module{len(self.loaded)}")

    def cuModuleGetFunction(self, module, name):
        return (self._real.CUresult(0), FakeFn(name.decode()))

    def cuFuncGetAttribute(self, attr, fn):
        return (self._real.CUresult(0), 1024)

    def cuFuncSetAttribute(self, fn, attr, value):
        self.smem_set = getattr(self, "smem_set", []) + [(fn_name(fn), int(attr), value)]
        return (self._real.CUresult(0),)

    def cuThreadExchangeStreamCaptureMode(self, mode):
        return (self._real.CUresult(0), mode)


def unpack(raw: bytes, fmt: str):
    import struct

    return struct.unpack_from(fmt, raw)[0]


class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


class FakeDevice:
    def __init__(self, type_, index):
        self.type, self.index = type_, index

    def __str__(self):
        return f"{self.type}:{self.index}"


_DTYPES = {n: FakeDtype(n) for n in ITEMSIZE}
_DEVICES = {(t, i): FakeDevice(t, i) for t in ("cuda", "cpu") for i in range(4)}


class FakeTorchTensor:
    """Quacks like the parts of torch.Tensor the runtime reads (install it as the runtime's torch.Tensor)."""

    def __init__(self, shape, dtype="bfloat16", device=("cuda", 0)):
        inner = FakeTensor(shape, dtype=dtype)
        self.shape, self.dtype, self._ptr = tuple(shape), _DTYPES[dtype], inner.ptr
        self.device, self._itemsize = _DEVICES[device], inner.itemsize
        strides, acc = [], 1
        for d in reversed(self.shape):
            strides.append(acc)
            acc *= max(d, 1)
        self._strides = tuple(reversed(strides))

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def size(self):
        return self.shape

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self._ptr

    def get_device(self):
        return self.device.index if self.device.type == "cuda" else -1

    def element_size(self):
        return self._itemsize


def build_hot(folder: Path) -> Any:
    """Compile csrc/_hot.c (the compiled hot path) with the system C compiler into ``folder`` and
    import it as ``tilebin.runtime._hot``; raises RuntimeError with the compiler's output on failure."""
    import importlib.util
    import shutil
    import subprocess
    import sysconfig

    root = Path(__file__).resolve().parents[2]
    cc = shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc") \
        or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) to build csrc/_hot.c")
    out = folder / "_hot.abi3.so"
    cmd = [cc, "-std=gnu11", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall",
           "-Wno-unused-parameter", f"-I{sysconfig.get_paths()['include']}", str(root / "csrc" / "_hot.c"),
           "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    spec = importlib.util.spec_from_file_location("tilebin.runtime._hot", out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def hot_or_skip(folder: Path) -> Any:
    """:func:`build_hot` for a test fixture: a build failure fails the test under CI (env CI set), else skips it."""
    import os

    import pytest

    try:
        return build_hot(folder)
    except RuntimeError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"cannot build the compiled hot path: {exc}")
        pytest.skip(f"cannot build the compiled hot path: {exc}")
