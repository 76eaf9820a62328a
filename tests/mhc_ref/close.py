"""Error bounds the mHC stream tests hold kernels to (tight enough to catch a wrong index, a
wrong stream or a lost term; loose enough for fp32 rounding and one bf16 rounding).

``bf16_bound``: a bf16 result of fp32 arithmetic over a few terms: at most half a bf16 ulp
(relative 2**-8) of the exact value plus fp32 rounding of the terms (``2**-20`` of their
absolute sum).  ``fp32_sum_bound``: an fp32 sum of up to ~10^5 products in any order:
``2**-16`` of the absolute sum of the terms.
"""

from __future__ import annotations

import torch


def _excess(out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> tuple[float, int]:
    err = (out.to(torch.float64) - ref).abs()
    bad = ~(err <= bound)  # NaN counts as bad
    return (float((err - bound).max()) if err.numel() else 0.0), int(bad.sum())


def assert_bf16_close(out: torch.Tensor, ref: torch.Tensor, terms_abs: torch.Tensor, what: str = "") -> None:
    """``out`` (bf16) against the float64 ``ref``; ``terms_abs`` the absolute sum of the terms."""
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape, (what, out.dtype, out.shape, ref.shape)
    dev = out.device  # compared where the result lives (GPU-sized tensors stay on the GPU)
    out, ref, terms_abs = out.detach(), ref.detach().to(dev, torch.float64), terms_abs.detach().to(dev, torch.float64)
    bound = ref.abs() * 2.0**-8 + terms_abs * 2.0**-20 + 2.0**-130
    worst, nbad = _excess(out, ref, bound)
    assert nbad == 0, f"{what}: {nbad} of {out.numel()} values off the float64 reference (worst excess {worst:.3g})"


def assert_fp32_close(out: torch.Tensor, ref: torch.Tensor, terms_abs: torch.Tensor, what: str = "",
                      rel: float = 2.0**-16) -> None:
    """``out`` (fp32) against the float64 ``ref`` within ``rel`` of the terms' absolute sum."""
    assert out.dtype == torch.float32 and out.shape == ref.shape, (what, out.dtype, out.shape, ref.shape)
    dev = out.device  # compared where the result lives (GPU-sized tensors stay on the GPU)
    out, ref, terms_abs = out.detach(), ref.detach().to(dev, torch.float64), terms_abs.detach().to(dev, torch.float64)
    bound = terms_abs * rel + ref.abs() * 2.0**-23 + 2.0**-130
    worst, nbad = _excess(out, ref, bound)
    assert nbad == 0, f"{what}: {nbad} of {out.numel()} values off the float64 reference (worst excess {worst:.3g})"


def assert_bitwise(out: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """Same dtype, shape and bits."""
    assert out.dtype == ref.dtype and out.shape == ref.shape, (what, out.dtype, ref.dtype, out.shape, ref.shape)
    a, b = out.detach().contiguous(), ref.detach().to(out.device).contiguous()
    if a.dtype.is_floating_point:
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(bits), b.view(bits)
    diff = int((a != b).sum())
    assert diff == 0, f"{what}: {diff} of {a.numel()} values differ in their bits"
