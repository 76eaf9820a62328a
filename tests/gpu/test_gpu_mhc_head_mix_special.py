"""GPU test of ``mhc.head_compute_mix_fwd`` on values that saturate the sigmoid or leave the
reciprocal's fast path (issue 9; the kernel writes ``1 / (1 + expf(0 - z))`` with nvcc's fast
path branch-free and the full IEEE division only where its range test fails, so these inputs take
both paths): +-inf, NaN, +-1e30, -88..-87 (``1 + expf`` near the float range's top), denormals and
+-0 planted among normal values; scales 0.8 and -25; tokens {0, 1, 13, 1111, 8192} x mhc
{1, 2, 3, 4, 5, 7, 8}; the input 16-byte aligned or 4 bytes off.  Launched as the op launches it,
into a NaN-poisoned output; held to a float64 reference within 2 ulp-scale bounds (``expf`` is not
correctly rounded), NaN exactly where the input is NaN."""

from __future__ import annotations

import pytest
import torch

from _moe_util import seed

SPECIAL = [float("inf"), float("-inf"), float("nan"), 1e30, -1e30, -200.0, -88.8, -88.0, -87.5, -87.0, 88.0,
           200.0, 1e-40, -1e-40, 1e-45, 0.0, -0.0, 3.0]
CASES = ([(n, m, sc, off) for n in (0, 1, 13, 8192) for m in (1, 2, 4, 8) for sc in (0.8, -25.0) for off in (0, 1)]
         + [(n, m, 0.8, off) for n in (1, 13, 1111) for m in (3, 5, 7) for off in (0, 1)])
IDS = [f"n{n}-m{m}-s{sc}-off{off}" for n, m, sc, off in CASES]


def _f32_view(numel: int, off: int) -> torch.Tensor:
    """``numel`` fp32 ``off`` floats into a fresh NaN-filled buffer."""
    return torch.full((numel + off,), float("nan"), device="cuda")[off:]


@pytest.mark.parametrize("n, m, sc, off", CASES, ids=IDS)
def test_head_compute_mix_fwd_special_values(rt, require, n, m, sc, off):
    require("mhc.head_compute_mix_fwd")
    seed("mhc_head_mix_special", n, m, sc, off)
    inp = _f32_view(n * m, off)
    inp.copy_(torch.randn(n * m, device="cuda") * 4)
    if n * m:
        vals = torch.tensor(SPECIAL, device="cuda")
        where = torch.randint(0, n * m, (max(n * m // 5, 1),), device="cuda")
        inp[where] = vals[torch.randint(0, len(SPECIAL), where.shape, device="cuda")]
    inp = inp.view(n, m)
    scale, base, eps = torch.tensor([sc], device="cuda"), torch.randn(m, device="cuda"), 1e-6
    out = _f32_view(n * m, 0).view(n, m)
    rt.unchecked_launcher("mhc.head_compute_mix_fwd")(inp, scale, base, out, eps)
    z = torch.addcmul(base.double(), inp.double(), scale.double())  # x * s + b (fp32's fma, in float64)
    want = (torch.sigmoid(z) + eps).float()
    assert torch.equal(out.isnan(), inp.isnan()), "NaN where the input is not NaN (or the reverse)"
    torch.testing.assert_close(out, want, rtol=2e-6, atol=1e-7, equal_nan=True)
