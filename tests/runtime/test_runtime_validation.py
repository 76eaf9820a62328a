"""Every argument check, each raised before any GPU work, each naming kernel, parameter and fix.

Launches go to the fake driver (``fake_gpu``); a refused call must record no launch.
"""

from __future__ import annotations

import pytest
import rt_fakes as F

T = F.tensor


def refused(reg, fake, exc, kernel, *args, match=(), **kwargs):
    before = len(fake.launches)
    with pytest.raises(exc) as info:
        reg.launch(kernel, *args, **kwargs)
    msg = str(info.value)
    assert kernel in msg, msg
    for part in (match,) if isinstance(match, str) else match:
        assert part in msg, (part, msg)
    assert len(fake.launches) == before, "a refused call reached the driver"
    return msg


@pytest.fixture
def reg(make_registry):
    return make_registry(F.manifest(**{"toy.scale": F.scale_kernel(), "toy.gemm": F.gemm_kernel(),
                                       "toy.quant": F.quant_kernel(), "toy.rows": _rows_kernel()}))


def _rows_kernel():
    """x[m, n] (row stride n) read through a TMA descriptor whose byte stride is n * 2."""
    k = F.scale_kernel()
    v = k["variants"][0]
    v["tma"] = [{"param": "x", "dtype": 9, "rank": 2, "dims": ["n", "m"], "strides": [["mul", "n", 2]],
                 "box": [64, 8], "elem_strides": [1, 1], "interleave": 0, "swizzle": 0, "l2_promotion": 0,
                 "oob_fill": 0}]
    v["launches"][0]["args"][0] = {"kind": "tma", "tma": 0}
    k["variants"] = [v]
    return k


def bf16(*shape, **kw):
    return T(shape, dtype="bfloat16", **kw)


def test_rank(reg, fake_gpu, rt):
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", bf16(2, 3, 4), bf16(2, 3, 4), 1.0,
            match=("'x' is 3-D", "takes a 2-D tensor", "reshape"))


def test_inconsistent_symbol(reg, fake_gpu, rt):
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", bf16(100, 64), bf16(101, 64), 1.0,
            match=("out.shape[0] is 101", "x.shape[0] is 100", "'m'"))


def test_expression_dim(reg, fake_gpu, rt):
    refused(reg, fake_gpu, rt.ArgumentError, "toy.quant", T((1000,)), T((9,)), 128, 0.5,
            match=("scale.shape[0] is 9 but must be 8", "n=1000 (from x.shape[0])"))


def test_non_contiguous(reg, fake_gpu, rt):
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", bf16(100, 64, strides=(1, 100)), bf16(100, 64), 1.0,
            match=("x has strides (1, 100)", "needs (64, 1)", "x.contiguous()"))
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", bf16(100, 64), bf16(100, 64, strides=(128, 1)), 1.0,
            match=("out has strides (128, 1)", "out.contiguous()"))


def test_size_one_dims_take_any_stride(reg, fake_gpu):
    reg.launch("toy.scale", bf16(1, 64, strides=(12345, 1)), bf16(1, 64), 1.0)
    assert len(fake_gpu.launches) == 1


def test_misaligned(reg, fake_gpu, rt):
    base = bf16(100, 64)
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", bf16(100, 64, ptr=base.ptr + 2), bf16(100, 64), 1.0,
            match=("'x' has data pointer", "not 16-byte aligned", "x.clone()"))


def test_misaligned_after_plan_is_cached(reg, fake_gpu, rt):
    x, out = bf16(100, 64), bf16(100, 64)
    reg.launch("toy.scale", x, out, 1.0)
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", x, bf16(100, 64, ptr=out.ptr + 8), 1.0,
            match="not 16-byte aligned")


def test_tma_raises_alignment(reg, fake_gpu, rt):
    quant_ok = T((1000,)), T((8,), ptr=T((64,)).ptr + 4)  # scale asks align 4: fine
    reg.launch("toy.quant", *quant_ok, 128, 0.5)
    refused(reg, fake_gpu, rt.ArgumentError, "toy.rows", bf16(4, 64, ptr=bf16(8, 64).ptr + 8), bf16(4, 64), 1.0,
            match="not 16-byte aligned")


def test_tma_stride_must_be_16_byte_multiple(reg, fake_gpu, rt):
    refused(reg, fake_gpu, rt.ArgumentError, "toy.rows", bf16(4, 1733), bf16(4, 1733), 1.0,
            match=("byte strides (3466,)", "multiple of 16", "pad the innermost dim"))


def test_max_elements(reg, fake_gpu, rt):
    m, n = 1 << 16, (1 << 15) + 1
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", bf16(m, n), bf16(m, n), 1.0,
            match=(f"x has {m * n} elements", "at most 2147483647", "split"))


def test_int32_symbol_overflow(reg, fake_gpu, rt):
    n = 1 << 31
    refused(reg, fake_gpu, rt.ArgumentError, "toy.quant", T((n,)), T(((n + 127) // 128,)), 128, 0.5,
            match=("x.shape[0] = 2147483648", "int32"))


@pytest.mark.parametrize("case", ["same", "offset", "outputs"])
def test_output_overlap(reg, fake_gpu, rt, case):
    x = bf16(100, 64)
    if case == "same":
        refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", x, x, 1.0, match=("output 'out'", "overlaps 'x'"))
    elif case == "offset":
        out = bf16(100, 64, ptr=x.ptr + 64 * 2 * 50)
        refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", x, out, 1.0, match="separate output tensor")
    else:
        x = T((1000,))
        refused(reg, fake_gpu, rt.ArgumentError, "toy.quant", x, T((8,), ptr=x.ptr + 16), 128, 0.5,
                match=("output 'scale'", "overlaps 'x'"))


def test_adjacent_tensors_do_not_overlap(reg, fake_gpu):
    x = bf16(100, 64)
    reg.launch("toy.scale", x, bf16(100, 64, ptr=x.ptr + 100 * 64 * 2), 1.0)
    assert len(fake_gpu.launches) == 1


def test_wrong_device(reg, fake_gpu, rt):
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", bf16(100, 64, dl_kind=1), bf16(100, 64), 1.0,
            match=("'x' is a tensor in host memory", "x.cuda()"))
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", bf16(100, 64), bf16(100, 64, device=1), 1.0,
            match=("'out' is on cuda:1", "'x' is on cuda:0", "same GPU"))


def test_torch_cpu_tensors(reg, fake_gpu, rt):
    torch = pytest.importorskip("torch")
    x = torch.zeros(100, 64, dtype=torch.bfloat16)
    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", x, bf16(100, 64), 1.0,
            match=("'x' is a tensor on the CPU", "x.cuda()", "run on a CUDA GPU"))


@pytest.mark.parametrize("group, eps, match", [
    (2**40, 0.5, "does not fit int32"),
    (1.5, 0.5, "expected a Python int"),
    (128, "x", "expected a Python float"),
    (128, 1e6, "does not fit float16"),
])
def test_scalar_values(reg, fake_gpu, rt, group, eps, match):
    refused(reg, fake_gpu, rt.ArgumentError, "toy.quant", T((1000,)), T((8,)), group, eps, match=match)


def test_pass_through_scalar_checked_every_call(reg, fake_gpu, rt):
    x, s = T((1000,)), T((8,))
    reg.launch("toy.quant", x, s, 128, 0.5)
    refused(reg, fake_gpu, rt.ArgumentError, "toy.quant", x, s, 128, 1e6, match="does not fit float16")


def test_empty_problem_launches_nothing(reg, fake_gpu):
    reg.launch("toy.scale", bf16(0, 64), bf16(0, 64), 1.0)
    assert fake_gpu.launches == []


def test_cai_dtype_cannot_be_named(reg, fake_gpu, rt):
    class Opaque(F.FakeTensor):
        dtype = "mystery"

    refused(reg, fake_gpu, rt.ArgumentError, "toy.scale", Opaque((100, 64), dtype="bfloat16"), bf16(100, 64), 1.0,
            match="cannot map __cuda_array_interface__ typestr '<V2'")
