"""Float64 reference of the mHC pre-norm function and its gradients (``mhc_pre_norm_fn``).

Definition (tile_kernels 1.0.0 semantics), with ``x`` the residual ``[..., M, H]`` flattened to
``K = M * H`` values and ``fn_eff = tf32(fn * w)`` (``w`` the optional norm weight, the product
rounded to fp32 first, as the kernel forms it)::

    out[..., j] = (sum_k x[k] * fn_eff[j, k]) * (sum_k x[k]**2 / K + eps) ** -0.5

The TF32 rounding is part of the forward (the kernels multiply on TF32 tensor cores); for the
gradients it counts as the identity (``d fn_eff / d fn = w``), as in tile_kernels.  Everything
else is evaluated in float64 here.
"""

from __future__ import annotations

import torch


def tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 ``t`` rounded to TF32 as the kernels do: ``bits + 0x1000``, low 13 bits cleared."""
    bits = t.to(torch.float32).contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32)


def fn_eff(fn: torch.Tensor, norm_weight: torch.Tensor | None) -> torch.Tensor:
    """The fp32 projection the kernels read: ``tf32(fn * w)`` (or ``tf32(fn)``)."""
    f = fn.to(torch.float32)
    if norm_weight is not None:
        f = f * norm_weight.to(torch.float32)
    return tf32(f)


def _forward64(x64: torch.Tensor, f64: torch.Tensor, eps: float) -> torch.Tensor:
    k = x64.shape[-1]
    mul = x64 @ f64.transpose(0, 1)
    rms = ((x64 * x64).sum(-1, keepdim=True) / k + eps).rsqrt()
    return mul * rms


def pre_norm_fn(residual: torch.Tensor, fn: torch.Tensor, norm_weight: torch.Tensor | None,
                eps: float) -> torch.Tensor:
    """float64 ``[..., M * (M + 2)]``."""
    *outer, m, h = residual.shape
    x64 = residual.reshape(-1, m * h).to(torch.float64)
    out = _forward64(x64, fn_eff(fn, norm_weight).to(torch.float64), eps)
    return out.reshape(*outer, fn.shape[0])


def pre_norm_fn_grads(residual: torch.Tensor, fn: torch.Tensor, norm_weight: torch.Tensor | None,
                      eps: float, out_grad: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """float64 ``(d residual, d fn, d norm_weight or None)`` for the incoming gradient ``out_grad``.

    Autograd in float64 through the definition, with the TF32 rounding of ``fn_eff`` as a
    constant offset (straight-through).
    """
    *outer, m, h = residual.shape
    k = m * h
    x64 = residual.reshape(-1, k).to(torch.float64).requires_grad_(True)
    f64 = fn.to(torch.float64).requires_grad_(True)
    w64 = None if norm_weight is None else norm_weight.to(torch.float64).requires_grad_(True)
    with torch.no_grad():
        exact = fn.to(torch.float64) * (1.0 if w64 is None else w64)
        offset = fn_eff(fn, norm_weight).to(torch.float64) - exact
    f_eff = (f64 if w64 is None else f64 * w64) + offset
    out = _forward64(x64, f_eff, eps)
    grads = torch.autograd.grad(out, [x64, f64] + ([w64] if w64 is not None else []),
                                out_grad.reshape(out.shape).to(torch.float64))
    dx = grads[0].reshape(residual.shape)
    return dx, grads[1], (grads[2] if w64 is not None else None)


def pre_norm_fn_grads_closed(residual: torch.Tensor, fn: torch.Tensor, norm_weight: torch.Tensor | None,
                             eps: float, out_grad: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The same gradients in closed form (the kernels' formulas, in float64), for cross-checking.

    ``g_mul = g * rms``, ``g_sq = (g . mul) * rms / (sq + eps K) / -2``,
    ``dx = g_mul @ fn_eff + 2 x g_sq``, ``d fn_eff = g_mul.T @ x``, ``d fn = d fn_eff * w``,
    ``d w = sum_j d fn_eff[j] * fn[j]``.
    """
    *outer, m, h = residual.shape
    k = m * h
    x = residual.reshape(-1, k).to(torch.float64)
    f = fn_eff(fn, norm_weight).to(torch.float64)
    g = out_grad.reshape(-1, fn.shape[0]).to(torch.float64)
    sq = (x * x).sum(-1)
    rms = (sq / k + eps).rsqrt()
    mul = x @ f.transpose(0, 1)
    g_mul = g * rms[:, None]
    g_sq = (g * mul).sum(-1) * rms / (sq + eps * k) / -2
    dx = g_mul @ f + 2 * x * g_sq[:, None]
    dfe = g_mul.transpose(0, 1) @ x
    if norm_weight is None:
        return dx.reshape(residual.shape), dfe, None
    w = norm_weight.to(torch.float64)
    return dx.reshape(residual.shape), dfe * w, (dfe * fn.to(torch.float64)).sum(0)


__all__ = ["fn_eff", "pre_norm_fn", "pre_norm_fn_grads", "pre_norm_fn_grads_closed", "tf32"]
