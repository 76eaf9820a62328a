"""The unchecked launcher (the op layer's fast path) against the fake driver: symbols read from
sizes, strides and scalars; grids and scalar arguments evaluated per call with no per-shape plan;
empty problems skipped; int32 overflow, wrong arity, unknown keys and TMA variants refused."""

from __future__ import annotations

import struct
import sys
import types

import pytest
import rt_fakes as F


class TorchLike:
    """The torch.Tensor attributes the unchecked path reads (shape, stride, data_ptr, get_device)."""

    _next = [0x7E0000000000]

    def __init__(self, *shape, device=0):
        self.shape, self.device = shape, device
        self._strides, acc = [], 1
        for d in reversed(shape):
            self._strides.insert(0, acc)
            acc *= max(d, 1)
        self.ptr = TorchLike._next[0]
        TorchLike._next[0] += 1 << 20

    def size(self, d):
        return self.shape[d]

    def stride(self, d=None):
        return tuple(self._strides) if d is None else self._strides[d]

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return self.device


@pytest.fixture
def streams(monkeypatch):
    """torch's raw current-stream getter, faked: stream 0x50 + device ordinal."""
    fake_c = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda i: 0x50 + i)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=fake_c, Tensor=TorchLike))


def i32(raw):
    return struct.unpack_from("<i", raw)[0]


def u64(raw):
    return struct.unpack_from("<Q", raw)[0]


def test_every_shape_uses_one_launcher(make_registry, fake_gpu, streams):
    reg = make_registry()
    fn = reg.unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    assert reg.unchecked_launcher("toy.scale", block=128, dtype="bfloat16") is fn
    for m in (1, 129, 300, 4001):
        x, out = TorchLike(m, 64), TorchLike(m, 64)
        fn(x, out, 1.5)
        ln = fake_gpu.launches[-1]
        assert ln["dims"] == ((-(-m // 128), 1, 1), (128, 1, 1)) and ln["stream"] == 0x50
        a = ln["args"]
        assert (u64(a[0]), u64(a[1]), i32(a[2]), i32(a[3])) == (x.ptr, out.ptr, m, 64)
        assert struct.unpack_from("<f", a[4])[0] == 1.5


def test_empty_problem_launches_nothing(make_registry, fake_gpu, streams):
    fn = make_registry().unchecked_launcher("toy.scale", dtype="bfloat16", block=256)
    fn(TorchLike(0, 64), TorchLike(0, 64), 1.0)
    assert fake_gpu.launches == []


def test_two_launches_scalar_expressions_and_cooperative(make_registry, fake_gpu, streams):
    fn = make_registry().unchecked_launcher("toy.quant", dtype="float32")
    x, s = TorchLike(1000), TorchLike(8)
    fn(x, s, 128, 0.5)
    a, b = fake_gpu.launches[-2:]
    assert a["dims"][0] == (8, 1, 1) and struct.unpack_from("<q", a["args"][2])[0] == 2000
    assert struct.unpack_from("<H", a["args"][1])[0] == 0x3800  # 0.5 as float16 bits
    assert b["config"] is not None and i32(b["args"][2]) == 1000 and u64(b["args"][0]) == s.ptr


def test_int32_overflow_is_refused(make_registry, fake_gpu, streams):
    fn = make_registry().unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    with pytest.raises(F_rt().ArgumentError, match="int32 kernel argument = 2147483648 does not fit int32"):
        fn(TorchLike(2**31, 1), TorchLike(2**31, 1), 1.0)


def test_wrong_arity_and_cpu_tensors(make_registry, fake_gpu, streams):
    fn = make_registry().unchecked_launcher("toy.scale", dtype="bfloat16", block=128)
    with pytest.raises(F_rt().ArgumentError, match="takes 3 arguments"):
        fn(TorchLike(4, 4), TorchLike(4, 4))
    with pytest.raises(F_rt().ArgumentError, match="not on a CUDA device"):
        fn(TorchLike(4, 4, device=-1), TorchLike(4, 4, device=-1), 1.0)


def test_unknown_key_and_tma_variants_are_refused(make_registry, fake_gpu, streams):
    rt = F_rt()
    reg = make_registry()
    with pytest.raises(rt.NoVariantError, match="no prebuilt variant has key .*available"):
        reg.unchecked_launcher("toy.scale", dtype="float32", block=128)
    with pytest.raises(rt.NoVariantError, match="no prebuilt variant"):
        reg.unchecked_launcher("toy.scale", dtype="bfloat16")  # partial keys do not match
    with pytest.raises(rt.NoVariantError, match="TMA"):
        reg.unchecked_launcher("toy.gemm", n=1024, k=1024)
    with pytest.raises(rt.NoVariantError, match="toy.nope"):
        reg.unchecked_launcher("toy.nope")


def F_rt():
    from tilebin import runtime

    return runtime


def test_stride_symbols_and_scalar_sources(make_registry, fake_gpu, streams, tmp_path):
    """A row stride bound from a tensor's stride(), a grid over a scalar parameter, mixed slot types."""
    data = F.manifest(**{"toy.rows": {
        "params": [{"name": "x", "kind": "tensor", "rank": 2}, {"name": "y", "kind": "tensor", "rank": 2},
                   {"name": "k", "kind": "scalar"}],
        "variants": [{
            "key": {}, "cubin": "cubins/rows.cubin", "sha256": "3" * 64,
            "tensors": [{"name": "x", "dtype": "float32", "shape": ["m", "n"], "strides": ["ld", 1]},
                        {"name": "y", "dtype": "float32", "shape": ["m", "n"], "strides": ["n", 1], "output": True}],
            "scalars": [{"name": "k", "dtype": "int32"}],
            "launches": [{"entry": "scale_bfloat16_128", "grid": [["floordiv", ["add", "m", "k"], "k"], "n", 1],
                          "block": [32, 1, 1], "smem": 0,
                          "args": [{"kind": "scalar", "dtype": "int64", "value": "ld"},
                                   {"kind": "ptr", "param": "y"},
                                   {"kind": "scalar", "dtype": "float32", "value": "k"},
                                   {"kind": "ptr", "param": "x"},
                                   {"kind": "scalar", "dtype": "int32", "value": ["mul", "m", "n"]}]}],
        }]}})
    fn = make_registry(data).unchecked_launcher("toy.rows")
    x, y = TorchLike(10, 4), TorchLike(10, 4)
    x._strides = [9, 1]  # rows 9 elements apart
    fn(x, y, 3)
    ln = fake_gpu.launches[-1]
    a = ln["args"]
    assert ln["dims"][0] == (4, 4, 1)
    assert struct.unpack_from("<q", a[0])[0] == 9 and u64(a[1]) == y.ptr and u64(a[3]) == x.ptr
    assert struct.unpack_from("<f", a[2])[0] == 3.0 and i32(a[4]) == 40
