"""The compiled hot path reading torch tensors through torch's stable C shim (csrc/_hot_tensor.h).

The shim must read exactly what torch's Python accessors read, turn itself off when its
self-check disagrees, serve only exact tensors of its type, and leave every launch byte and
every error the same as the Python twin's.  CPU tensors stand in for CUDA ones: ``GpuLike``
answers ``device``/``is_cuda``/``get_device`` as a tensor on cuda:0 would, and the shim is told
that the CPU device type is the GPU (``gpu_type=0``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # CI installs torch (CPU); the shim reads torch's tensors

import rt_fakes as F  # noqa: E402
from test_runtime_unchecked import streams  # noqa: E402,F401  (fixture)

from tilebin.runtime import _launcher, _tensors  # noqa: E402


READS: list = []  # the accessors GpuLike answered (the shim's path reads none of them)


class GpuLike(torch.Tensor):
    """A CPU tensor the runtime takes for one on cuda:0 (the fake driver launches nothing)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self):
        return torch.device("cuda", 0)

    @property
    def is_cuda(self):
        READS.append("is_cuda")
        return True

    def get_device(self):
        READS.append("get_device")
        return 0

    @property
    def shape(self):
        READS.append("shape")
        return super().shape

    def stride(self, *dim):
        READS.append("stride")
        return super().stride(*dim)

    def data_ptr(self):
        READS.append("data_ptr")
        return super().data_ptr()


def _tensors_of_every_kind() -> list:
    base = torch.arange(4 * 6 * 10, dtype=torch.float32).reshape(4, 6, 10)
    out = [base, base.transpose(0, 2), base[1:, ::3, 2:], base[2], torch.empty(0, 5), torch.tensor(1.5),
           torch.empty(5, 1).expand(5, 8), torch.empty(1, 2, 3, 1, 2, 1, 2), torch.empty(2, 3, 4, 5).to(
               memory_format=torch.channels_last), torch.empty(4, 7168, dtype=torch.bfloat16)[:, 16:]]
    for name in ("float64", "float16", "bfloat16", "float8_e4m3fn", "int8", "uint8", "int32", "int64", "bool"):
        out.append(torch.zeros(3, 2, dtype=getattr(torch, name)))
    return out


@pytest.fixture
def shim(hot_module):
    why = _tensors.enable_shim(hot_module, torch)
    assert why is None, f"the shim stays off with torch {torch.__version__}: {why}"
    yield hot_module
    hot_module.tensor_abi(None)


def test_the_shim_reads_what_the_accessors_read(shim):
    for t in _tensors_of_every_kind():
        assert shim.tensor_facts(t) == (t.dim(), tuple(t.shape), tuple(t.stride()), t.data_ptr(), t.dtype, -1)


def test_only_exact_tensors_of_its_type_are_read_through_it(shim):
    class Sub(torch.Tensor):
        pass

    assert shim.tensor_facts(torch.empty(3)) is not None
    for other in (torch.nn.Parameter(torch.empty(3)), torch.empty(3).as_subclass(Sub), 3, None,
                  F.tensor((4,)), object()):
        assert shim.tensor_facts(other) is None


def test_it_stays_off_when_its_self_check_disagrees(hot_module):
    t = torch.empty(4, 8)
    good = _tensors._probe(t)
    for bad, why in (((t, good[1] + 8, *good[2:]), "no one place"),
                     ((*good[:3], (4, 9), *good[4:]), "sizes or strides differ"),
                     ((*good[:5], good[5] + 4, *good[6:]), "data pointer differs"),
                     ((*good[:7], 1, good[8]), "device differs"),
                     ((*good[:6], torch.int8, *good[7:]), "two dtypes share")):
        entries = _entries()
        assert why in hot_module.tensor_abi(entries, torch.Tensor, (good, bad), 1)
        assert hot_module.tensor_facts(t) is None
    assert "seven non-zero" in hot_module.tensor_abi((0,) * 7, torch.Tensor, (good,), 1)
    assert hot_module.tensor_abi(_entries(), torch.Tensor, (good,), 1) is None
    assert hot_module.tensor_facts(t) is not None
    assert hot_module.tensor_abi(None) is None and hot_module.tensor_facts(t) is None


def test_the_setting_and_a_stand_in_torch_keep_the_accessors(hot_module, monkeypatch):
    monkeypatch.setattr(_tensors, "_SHIM", {})
    monkeypatch.setenv("TILEBIN_TENSOR_SHIM", "off")
    assert _tensors.tensor_shim(hot_module) == "TILEBIN_TENSOR_SHIM=off"
    assert hot_module.tensor_facts(torch.empty(2)) is None
    assert "not usable" in _tensors.enable_shim(hot_module, object())


def _entries() -> tuple:
    import ctypes
    import os

    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"),
                      mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    return tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in _tensors.SHIM_ENTRIES)


def _gpu(*shape, dtype=torch.bfloat16):
    return torch.zeros(*shape, dtype=dtype).as_subclass(GpuLike)


def _calls(reg, t: dict) -> list:
    fn = reg.unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    q = reg.unchecked_launcher("toy.quant", dtype="float32")
    return [
        lambda: fn(t["x"], t["out"], 1.5),
        lambda: fn(t["odd"], t["odd_out"], 2),
        lambda: fn(t["empty"], t["empty"], 1.0),
        lambda: fn(t["col"], t["odd_out"], 1.0),  # a strided view: the unchecked path reads its sizes
        lambda: q(t["q"], t["qs"], 128, 0.5),
        lambda: reg.launch("toy.scale", t["x"], t["out"], 2.5),
        lambda: reg.launch("toy.scale", t["x"], t["out"], 2.5),  # the recent signature
        lambda: reg.launch("toy.scale", t["odd"], t["odd_out"], 1.0),
        lambda: reg.launch("toy.scale", t["x"][:, 1:], t["out"][:, 1:], 1.0),  # strided and misaligned: refused
        lambda: reg.launch("toy.scale", t["f32"], t["f32"], 1.0),  # no float32 variant
        lambda: reg.launch("toy.gemm", t["a"], t["b"], t["c"]),
        lambda: reg.launch("toy.gemm", t["a"], t["b"], t["c"]),
        lambda: reg.prepare("toy.scale", t["x"], t["out"], 0.25)(),
    ]


@pytest.mark.parametrize("hot_path", ["c"], indirect=True)
def test_launches_and_errors_equal_the_twins(make_registry, fake_gpu, streams, hot_module, monkeypatch):
    """The compiled path reading through the shim launches the twin's bytes and raises its errors."""
    cell, before = _tensors.TORCH_TENSOR, _tensors.TORCH_TENSOR[0]
    cell[0] = GpuLike  # runtime.launch's fast path takes GpuLike tensors (the cell is shared: set in place)
    try:
        results = _both_paths(make_registry, fake_gpu, hot_module, monkeypatch)
    finally:
        cell[0] = before
        hot_module.tensor_abi(None)
    (c_errors, c_launches, c_reads), (py_errors, py_launches, py_reads) = results["c"], results["python"]
    assert c_reads == [] and {"data_ptr", "shape", "get_device"} <= set(py_reads)
    assert c_errors == py_errors
    assert sum(e is not None for e in c_errors) >= 2, c_errors
    assert len(c_launches) == len(py_launches) >= 9
    for c, p in zip(c_launches, py_launches):
        assert c == p


def _both_paths(make_registry, fake_gpu, hot_module, monkeypatch) -> dict:
    t = {"x": _gpu(300, 64), "out": _gpu(300, 64), "odd": _gpu(7, 64), "odd_out": _gpu(7, 64),
         "empty": _gpu(0, 64), "col": _gpu(64, 7).T, "q": _gpu(1000, dtype=torch.float32),
         "qs": _gpu(8, dtype=torch.float32), "f32": _gpu(4, 64, dtype=torch.float32),
         "a": _gpu(70, 1024), "b": _gpu(1024, 1024), "c": _gpu(70, 1024)}
    results = {}
    for path, mod in (("c", hot_module), ("python", None)):
        if mod is not None:
            assert _tensors.enable_shim(mod, torch, GpuLike, gpu_type=0) is None
            assert mod.tensor_facts(t["x"])[5] == 0  # read through the shim, on "GPU" 0
        monkeypatch.setattr(_launcher, "_HOT", [mod])
        monkeypatch.setattr(_tensors, "_SHIM", {hot_module: None})  # make_launcher keeps this setup
        fake_gpu.launches.clear()
        reg = make_registry()
        seen = []
        for call in _calls(reg, t):
            try:
                call()
                seen.append(None)
            except Exception as exc:  # compared between the paths
                seen.append((type(exc).__name__, str(exc)))
        READS.clear()  # a repeated unchecked launch and runtime.launch hit: no accessor through the shim
        _calls(reg, t)[0]()
        reg.launch("toy.scale", t["x"], t["out"], 2.5)
        results[path] = (seen, list(fake_gpu.launches), list(READS))
    return results
