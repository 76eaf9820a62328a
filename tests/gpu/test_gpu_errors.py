"""Typed errors, raised before anything reaches the GPU: the poisoned outputs stay poisoned."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _cases import GEMM, PDL_CHAIN, TRANSPOSE  # noqa: E402
from _gpu_util import DTYPES, assert_poisoned, poison_  # noqa: E402

pytestmark = pytest.mark.gpu
B, R, C = 3, 17, 40  # R != C


def _bf16(*shape):
    return torch.randn(shape, device="cuda").to(torch.bfloat16)


def _out(*shape, dtype=torch.bfloat16, device="cuda"):
    return poison_(torch.empty(shape, dtype=dtype, device=device))


def refused(rt, exc, kernel, *args, poisoned=(), **kwargs):
    """Call launch, expect ``exc`` (a TilebinError subclass or a tuple of them), check the poison."""
    with pytest.raises(exc) as info:
        rt.launch(kernel, *args, **kwargs)
    assert isinstance(info.value, rt.TilebinError), f"{type(info.value).__mro__} is not a TilebinError"
    for i, t in enumerate(poisoned):
        assert_poisoned(t, f"{kernel} refused with {type(info.value).__name__}: {info.value}; output {i}")
    return info.value


# ---------------------------------------------------------------- no variant
@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=str)
def test_transpose_unsupported_dtype(rt, require, dtype):
    require(TRANSPOSE)
    x = torch.randn(B, R, C, device="cuda").to(dtype)
    out = _out(B, C, R, dtype=dtype)
    err = refused(rt, rt.NoVariantError, TRANSPOSE, x, out, poisoned=[out])
    msg = str(err)
    missing = [d for d in DTYPES if d not in msg]
    assert not missing, f"the no-variant message does not list available dtypes {missing}: {msg!r}"


def test_transpose_mixed_dtypes(rt, require):
    require(TRANSPOSE)
    out = _out(B, C, R, dtype=torch.float32)
    refused(rt, (rt.NoVariantError, rt.ArgumentError), TRANSPOSE, _bf16(B, R, C), out, poisoned=[out])


def test_transpose_pinned_dtype_mismatch(rt, require):
    require(TRANSPOSE)
    out = _out(B, C, R)
    refused(rt, rt.NoVariantError, TRANSPOSE, _bf16(B, R, C), out, dtype="float32", poisoned=[out])


def test_unknown_kernel(rt):
    out = _out(B, C, R)
    err = refused(rt, rt.NoVariantError, "transpose.batched_transpos", _bf16(B, R, C), out, poisoned=[out])
    assert "batched_transpos" in str(err), f"the message does not repeat the asked name: {err}"


def test_gemm_unsupported_k_lists_variants(rt, require):
    require(GEMM)
    c = _out(16, 1024)
    err = refused(rt, rt.NoVariantError, GEMM, _bf16(16, 2048), _bf16(1024, 2048), c, poisoned=[c])
    missing = [v for v in ("1024", "4096", "7168") if v not in str(err)]
    assert not missing, f"the no-variant message lacks the available n/k values {missing}: {err}"


def test_gemm_fp16(rt, require):
    require(GEMM)
    a, b = (torch.randn(s, device="cuda", dtype=torch.float16) for s in ((16, 1024), (1024, 1024)))
    c = _out(16, 1024, dtype=torch.float16)
    refused(rt, rt.NoVariantError, GEMM, a, b, c, poisoned=[c])


def test_gemm_pinned_mismatch(rt, require):
    require(GEMM)
    c = _out(16, 1024)
    refused(rt, rt.NoVariantError, GEMM, _bf16(16, 1024), _bf16(1024, 1024), c, n=4096, k=7168, poisoned=[c])


# ---------------------------------------------------------------- bad arguments
def test_transpose_wrong_rank(rt, require):
    require(TRANSPOSE)
    out = _out(C, R)
    refused(rt, rt.ArgumentError, TRANSPOSE, _bf16(R, C), out, poisoned=[out])
    out4 = _out(1, B, C, R)
    refused(rt, rt.ArgumentError, TRANSPOSE, _bf16(1, B, R, C), out4, poisoned=[out4])


@pytest.mark.parametrize("out_shape", [(B, R, C), (B + 1, C, R), (B, C, R + 1)], ids=str)
def test_transpose_wrong_shape(rt, require, out_shape):
    require(TRANSPOSE)
    out = _out(*out_shape)
    refused(rt, rt.ArgumentError, TRANSPOSE, _bf16(B, R, C), out, poisoned=[out])


def test_transpose_non_contiguous(rt, require):
    require(TRANSPOSE)
    x_t = _bf16(B, C, R).transpose(1, 2)  # shape (B, R, C), strides swapped
    out = _out(B, C, R)
    refused(rt, rt.ArgumentError, TRANSPOSE, x_t, out, poisoned=[out])
    x_s = _bf16(B, R, 2 * C)[:, :, ::2]  # strided last dim
    refused(rt, rt.ArgumentError, TRANSPOSE, x_s, out, poisoned=[out])
    out_t = _out(B, R, C).transpose(1, 2)  # (B, C, R), not contiguous
    refused(rt, rt.ArgumentError, TRANSPOSE, _bf16(B, R, C), out_t, poisoned=[out_t])


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("which", ["x", "out"])
def test_transpose_misaligned(rt, require, dtype, which):
    """A slice one element in: the pointer is not 16-byte aligned."""
    require(TRANSPOSE)
    dt, n = DTYPES[dtype], B * R * C
    x = torch.randn(B, R, C, device="cuda").to(dt)
    out = _out(B, C, R, dtype=dt)
    if which == "x":
        base = torch.zeros(n + 16, device="cuda").to(dt)
        x = base[1:1 + n].view(B, R, C)
        bad = x
    else:
        base = _out(n + 16, dtype=dt)
        out = base[1:1 + n].view(B, C, R)
        bad = out
    assert bad.data_ptr() % 16, "test setup: the slice happens to be aligned"
    refused(rt, rt.ArgumentError, TRANSPOSE, x, out, poisoned=[out])


def test_transpose_cpu_tensors(rt, require):
    require(TRANSPOSE)
    out = _out(B, C, R)
    refused(rt, rt.ArgumentError, TRANSPOSE, _bf16(B, R, C).cpu(), out, poisoned=[out])
    out_cpu = _out(B, C, R, device="cpu")
    refused(rt, rt.ArgumentError, TRANSPOSE, _bf16(B, R, C), out_cpu, poisoned=[out_cpu])


def test_transpose_output_overlaps_input(rt, require):
    require(TRANSPOSE)
    sq = _out(2, 64, 64)
    refused(rt, rt.ArgumentError, TRANSPOSE, sq, sq, poisoned=[sq])  # in place: out is x
    n = 2 * 64 * 96
    buf = _out(2 * n)
    x, out = buf[:n].view(2, 64, 96), buf[n // 2:n // 2 + n].view(2, 96, 64)  # offset: 16-byte aligned
    refused(rt, rt.ArgumentError, TRANSPOSE, x, out, poisoned=[buf])


def test_transpose_wrong_arg_count(rt, require):
    require(TRANSPOSE)
    out = _out(B, C, R)
    with pytest.raises((rt.ArgumentError, TypeError)):
        rt.launch(TRANSPOSE, _bf16(B, R, C))
    with pytest.raises((rt.ArgumentError, TypeError)):
        rt.launch(TRANSPOSE, _bf16(B, R, C), out, out)
    assert_poisoned(out, "wrong argument count")


def test_gemm_bad_arguments(rt, require):
    require(GEMM)
    a, b = _bf16(16, 1024), _bf16(1024, 1024)
    c17 = _out(17, 1024)
    refused(rt, rt.ArgumentError, GEMM, a, b, c17, poisoned=[c17])  # m of c != m of a
    c_wide = _out(16, 1025)
    refused(rt, (rt.ArgumentError, rt.NoVariantError), GEMM, a, b, c_wide, poisoned=[c_wide])
    base = _bf16(16 * 1024 + 8)
    c = _out(16, 1024)
    refused(rt, rt.ArgumentError, GEMM, base[1:1 + 16 * 1024].view(16, 1024), b, c, poisoned=[c])
    a_before = a.clone()
    refused(rt, rt.ArgumentError, GEMM, a, b, a)  # c is a
    assert torch.equal(a, a_before), "gemm with c aliasing a was refused but a changed"


def test_pdl_chain_overlapping_outputs(rt, require):
    require(PDL_CHAIN)
    x = torch.randn(4096, device="cuda")
    y, z = _out(4096, dtype=torch.float32), _out(4096, dtype=torch.float32)
    refused(rt, rt.ArgumentError, PDL_CHAIN, x, x, z, poisoned=[z])
    refused(rt, rt.ArgumentError, PDL_CHAIN, x, y, y, poisoned=[y])


def test_error_messages_name_the_kernel(rt, require):
    """DESIGN: every failure names the kernel (and, for bad arguments, the parameter)."""
    require(TRANSPOSE)
    msgs = []
    for args in [(_bf16(B, R, C), _out(B, R, C)), (_bf16(R, C), _out(C, R)),
                 (torch.randn(B, R, C, device="cuda", dtype=torch.float16), _out(B, C, R, dtype=torch.float16))]:
        with pytest.raises(rt.TilebinError) as info:
            rt.launch(TRANSPOSE, *args)
        msgs.append(str(info.value))
    unnamed = [m for m in msgs if TRANSPOSE not in m]
    assert not unnamed, f"messages that do not name {TRANSPOSE!r}: {unnamed}"
