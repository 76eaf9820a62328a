"""The prepared-launch hot path against a fake driver: argument packing, plan reuse, TMA reuse,
launch attributes, streams, contexts, retries and thread-safety."""

from __future__ import annotations

import struct
import threading

import pytest
import rt_fakes as F

from tilebin.runtime import _tma

T = F.tensor


def u64(raw):
    return struct.unpack_from("<Q", raw)[0]


def i32(raw):
    return struct.unpack_from("<i", raw)[0]


def bf16(*shape, **kw):
    return T(shape, dtype="bfloat16", **kw)


def test_arguments_are_packed(make_registry, fake_gpu):
    reg = make_registry()
    x, out = bf16(300, 64), bf16(300, 64)
    reg.launch("toy.scale", x, out, 2.5)
    ln = fake_gpu.launches[-1]
    assert ln["dims"] == ((3, 1, 1), (128, 1, 1)) and ln["smem"] == 0 and ln["config"] is None
    a = ln["args"]
    assert (u64(a[0]), u64(a[1]), i32(a[2]), i32(a[3])) == (x.ptr, out.ptr, 300, 64)
    assert struct.unpack_from("<f", a[4])[0] == 2.5


def test_plan_is_reused_and_pointers_repatched(make_registry, fake_gpu, monkeypatch):
    from tilebin.runtime import _registry

    reg = make_registry()
    built = []
    real = _registry.bind_call
    monkeypatch.setattr(_registry, "bind_call", lambda *a: built.append(1) or real(*a))
    for i in range(5):
        x, out = bf16(300, 64), bf16(300, 64)
        reg.launch("toy.scale", x, out, float(i))
        a = fake_gpu.launches[-1]["args"]
        assert (u64(a[0]), u64(a[1])) == (x.ptr, out.ptr)
        assert struct.unpack_from("<f", a[4])[0] == float(i)  # pass-through scalar: patched, not keyed
    assert len(built) == 1
    reg.launch("toy.scale", bf16(301, 64), bf16(301, 64), 1.0)  # new shape: new plan
    assert len(built) == 2 and i32(fake_gpu.launches[-1]["args"][2]) == 301


def test_keyed_scalar_makes_a_new_plan(make_registry, fake_gpu):
    reg = make_registry()
    x, s = T((1000,)), T((8,))
    reg.launch("toy.quant", x, s, 128, 0.5)
    reg.launch("toy.quant", x, s, 256, 0.5)
    grids = [ln["dims"][0][0] for ln in fake_gpu.launches if ln["fn"] == "quant_a"]
    assert grids == [8, 4]
    assert len(reg._entries["toy.quant"].plans) == 2


def test_two_launches_in_order_with_attributes(make_registry, fake_gpu):
    reg = make_registry()
    x, s = T((1000,)), T((8,))
    reg.launch("toy.quant", x, s, 128, 0.5)
    a, b = fake_gpu.launches
    assert (a["fn"], b["fn"]) == ("quant_a", "quant_b")
    assert struct.unpack_from("<H", a["args"][1])[0] == 0x3800  # 0.5 as float16 bits
    assert struct.unpack_from("<q", a["args"][2])[0] == 2000  # int64 n * 2
    assert (u64(b["args"][0]), u64(b["args"][1]), i32(b["args"][2])) == (s.ptr, x.ptr, 1000)
    coop = fake_gpu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    assert a["config"] is None and b["config"] == [(int(coop), (1).to_bytes(4, "little") + bytes(12))]


def test_pdl_cluster_tma(make_registry, fake_gpu):
    reg = make_registry()
    a, b, c = bf16(70, 1024), bf16(1024, 1024), bf16(70, 1024)
    reg.launch("toy.gemm", a, b, c)
    ln = fake_gpu.launches[-1]
    ids = fake_gpu.CUlaunchAttributeID
    attrs = dict(ln["config"])
    assert attrs[int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)][:4] == (1).to_bytes(4, "little")
    assert attrs[int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)][:12] == struct.pack("<III", 2, 1, 1)
    assert ln["dims"] == ((8, 2, 1), (256, 1, 1)) and ln["smem"] == 98304
    assert u64(ln["args"][0]) == a.ptr  # the fake encoder writes the global address first
    assert (u64(ln["args"][1]), u64(ln["args"][2]), i32(ln["args"][3])) == (b.ptr, c.ptr, 70)


def test_tma_reencoded_only_when_pointer_changes(make_registry, fake_gpu):
    reg = make_registry()
    b, c = bf16(1024, 1024), bf16(70, 1024)
    a1, a2 = bf16(70, 1024), bf16(70, 1024)
    for a in (a1, a1, a1, a2, a1, a2, a2):
        reg.launch("toy.gemm", a, b, c)
        assert u64(fake_gpu.launches[-1]["args"][0]) == a.ptr
    assert fake_gpu.encodes == [a1.ptr, a2.ptr]  # ping-pong served from the recent descriptors
    many = [bf16(70, 1024) for _ in range(_tma.RECENT + 1)]
    for a in many:
        reg.launch("toy.gemm", a, b, c)
    reg.launch("toy.gemm", a1, b, c)  # evicted by then: encoded again
    assert fake_gpu.encodes[-1] == a1.ptr and len(fake_gpu.encodes) == 2 + len(many) + 1
    assert u64(fake_gpu.launches[-1]["args"][0]) == a1.ptr


@pytest.mark.parametrize("form", ["int", "cuda_stream", "protocol", "custream"])
def test_explicit_streams(make_registry, fake_gpu, form):
    from cuda.bindings import driver

    class TorchLike:
        cuda_stream = 0xABC

    class Proto:
        def __cuda_stream__(self):
            return (0, 0xABC)

    stream = {"int": 0xABC, "cuda_stream": TorchLike(), "protocol": Proto(), "custream": driver.CUstream(0xABC)}[form]
    reg = make_registry()
    reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0, stream=stream)
    assert fake_gpu.launches[-1]["stream"] == 0xABC
    reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0)
    assert fake_gpu.launches[-1]["stream"] == 0  # no torch tensors: the default stream


@pytest.mark.parametrize("stream, match", [(True, "not a stream"), (-1, ">= 0"), ("s", "expected an int handle")])
def test_bad_streams(make_registry, fake_gpu, rt, stream, match):
    reg = make_registry()
    with pytest.raises(rt.ArgumentError, match=match):
        reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0, stream=stream)
    assert not fake_gpu.launches


def test_stream_of_another_device(make_registry, fake_gpu, rt):
    class Dev:
        type, index = "cuda", 3

    class S:
        device, cuda_stream = Dev(), 5

    with pytest.raises(rt.ArgumentError, match="stream is on cuda:3 but the tensors are on cuda:0"):
        make_registry().launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0, stream=S())


def test_context_made_current_once(make_registry, fake_gpu):
    reg = make_registry()
    for _ in range(3):
        reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0)
    assert fake_gpu.current == 0x1234 and fake_gpu.set_calls == 1


def test_foreign_context_is_restored(make_registry, fake_gpu):
    from tilebin.runtime import _driver

    reg = make_registry()
    reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0)
    fake_gpu.current = 0x999  # someone else's context became current in this thread
    _driver.forget_current()
    reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0)
    assert fake_gpu.current == 0x999  # launched in ours, then put theirs back


def test_invalid_context_is_retried_once(make_registry, fake_gpu):
    reg = make_registry()
    reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0)
    fake_gpu.fail_next = [201]  # CUDA_ERROR_INVALID_CONTEXT
    reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0)
    assert len(fake_gpu.launches) == 3


def test_launch_failure_names_everything(make_registry, fake_gpu, rt):
    reg = make_registry()
    fake_gpu.fail_next = [400, 400]
    with pytest.raises(rt.DeviceError) as info:
        reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0)
    msg = str(info.value)
    for part in ("cuLaunchKernel", "CUDA_ERROR_INVALID_HANDLE", "toy.scale", "dtype='bfloat16', block=128",
                 "scale_bfloat16_128", "NVIDIA H200 (fake)", "grid=(1, 1, 1)"):
        assert part in msg, (part, msg)
    fake_gpu.fail_next = [701]
    with pytest.raises(rt.DeviceError, match="CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.*fewer threads"):
        reg.launch("toy.scale", bf16(10, 64), bf16(10, 64), 1.0)


def test_plan_cache_is_bounded(make_registry, fake_gpu):
    reg = make_registry(plan_cache_size=4)
    for m in range(1, 11):
        reg.launch("toy.scale", bf16(m, 64), bf16(m, 64), 1.0)
    plans = reg._entries["toy.scale"].plans
    assert 1 <= len(plans) <= 4
    assert i32(fake_gpu.launches[-1]["args"][2]) == 10


def test_threads_share_a_plan_safely(make_registry, fake_gpu):
    """8 threads, one signature, distinct tensors: every launch sees its own caller's pointers."""
    reg = make_registry()
    pairs = [(bf16(300, 64), bf16(300, 64)) for _ in range(8)]
    owner = {x.ptr: out.ptr for x, out in pairs}
    errors, barrier = [], threading.Barrier(8)

    def work(x, out, k):
        barrier.wait()
        try:
            for i in range(300):
                reg.launch("toy.scale", x, out, float(k))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(*p, k)) for k, p in enumerate(pairs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(fake_gpu.launches) == 8 * 300
    for ln in fake_gpu.launches:
        x_ptr, out_ptr = u64(ln["args"][0]), u64(ln["args"][1])
        assert owner[x_ptr] == out_ptr
        k = struct.unpack_from("<f", ln["args"][4])[0]
        assert pairs[int(k)][0].ptr == x_ptr


@pytest.fixture
def torch_like(monkeypatch):
    """Make the runtime treat rt_fakes.FakeTorchTensor as torch.Tensor, torch's current stream 0x77."""
    from tilebin.runtime import _launcher, _tensors

    monkeypatch.setattr(_tensors, "TORCH_TENSOR", [F.FakeTorchTensor])
    monkeypatch.setattr(_launcher, "torch_stream_getter", lambda: (lambda index: 0x77))
    from tilebin.runtime import _registry

    monkeypatch.setattr(_registry, "TORCH_TENSOR", _tensors.TORCH_TENSOR)
    return F.FakeTorchTensor


def test_torch_tensors_default_to_torchs_current_stream(make_registry, fake_gpu, torch_like):
    x, out = torch_like((300, 64)), torch_like((300, 64))
    make_registry().launch("toy.scale", x, out, 1.0)
    ln = fake_gpu.launches[-1]
    assert ln["stream"] == 0x77 and (u64(ln["args"][0]), u64(ln["args"][1])) == (x.data_ptr(), out.data_ptr())
