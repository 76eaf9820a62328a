"""Helpers of the Engram GPU tests: tile_kernels' ``calc_diff`` and the tolerance check built on it."""

from __future__ import annotations

import torch


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """tile_kernels' similarity measure: 1 - 2<x, y> / (|x|^2 + |y|^2), in float64."""
    x, y = x.double(), y.double()
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0 else 1.0 - 2.0 * float((x * y).sum()) / den


def assert_near(got: torch.Tensor, want: torch.Tensor, what: str, max_diff: float, rtol: float, scale_atol: float):
    """calc_diff below ``max_diff``; |got - want| <= rtol |want| + scale_atol max|want|; no NaN."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    if not got.numel():
        return
    g, w = got.double(), want.double()
    nan = int(torch.isnan(g).sum())
    err = (g - w).abs()
    bound = rtol * w.abs() + scale_atol * float(w.abs().max())
    bad = ~(err <= bound)
    diff = calc_diff(torch.nan_to_num(g, nan=1e30), w)
    if nan or int(bad.sum()) or not diff < max_diff:
        i = int(torch.nan_to_num(err - bound, nan=1e300).argmax())
        at = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), err.shape))
        raise AssertionError(f"{what}: {nan} NaN (unwritten poison?), {int(bad.sum())}/{got.numel()} outside "
                             f"rtol={rtol} + {scale_atol} * max; calc_diff {diff:.3e} (limit {max_diff:.0e}); "
                             f"worst at {at}: got {g[at].item()!r}, want {w[at].item()!r}")


__all__ = ["assert_near", "calc_diff"]
