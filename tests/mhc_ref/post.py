"""Reference of ``mhc_post``: the sublayer output merged back into the streams.

Definition (output stream ``n`` takes column ``n`` of the token's comb matrix)::

    out[..., n, i] = post[..., n, 0] * x[..., i] + sum_m comb[..., m, n] * residual[..., m, i]

evaluated in float64 here (the kernel: fp32, the post term then fused multiply-adds in stream
order, one bf16 rounding).  Gradients given ``g = grad_out``::

    grad_x[..., i]        = sum_n post_n * g[n, i]
    grad_residual[m, i]   = sum_n comb[m, n] * g[n, i]
    grad_post[n, 0]       = sum_i x_i * g[n, i]
    grad_comb[m, n]       = sum_i residual[m, i] * g[n, i]
"""

from __future__ import annotations

import torch


def _f64(*ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(torch.float64) for t in ts)


def post(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """float64 ``[..., M, H]`` (differentiable in float64 inputs)."""
    x, r, p, c = _f64(x, residual, post_mix, comb)
    return p * x.unsqueeze(-2) + torch.einsum("...mn,...mi->...ni", c, r)


def post_terms_abs(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
                   comb: torch.Tensor) -> torch.Tensor:
    x, r, p, c = _f64(x, residual, post_mix, comb)
    return (p * x.unsqueeze(-2)).abs() + torch.einsum("...mn,...mi->...ni", c.abs(), r.abs())


def post_bwd(grad: torch.Tensor, x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor,
             comb: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """float64 gradients, each with the absolute sum of its terms: ``{name: (value, terms_abs)}``
    for ``x``, ``residual``, ``post_mix``, ``comb``."""
    g, x, r, p, c = _f64(grad, x, residual, post_mix, comb)
    ga, xa, ra, pa, ca = g.abs(), x.abs(), r.abs(), p.abs(), c.abs()
    return {
        "x": ((p * g).sum(-2), (pa * ga).sum(-2)),
        "residual": (torch.einsum("...mn,...ni->...mi", c, g), torch.einsum("...mn,...ni->...mi", ca, ga)),
        "post_mix": ((g * x.unsqueeze(-2)).sum(-1, keepdim=True), (ga * xa.unsqueeze(-2)).sum(-1, keepdim=True)),
        "comb": (torch.einsum("...mi,...ni->...mn", r, g), torch.einsum("...mi,...ni->...mn", ra, ga)),
    }


def post_emulated(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """The forward kernel's bits: per output stream ``n``, ``acc = post_n * x`` (fp32), then
    ``acc = fma(comb[m, n], residual[m], acc)`` for ``m`` in order, ``bf16(acc)``."""
    from .apply_mix import fma32

    m = residual.shape[-2]
    xf, p, c = x.to(torch.float32), post_mix.to(torch.float32), comb.to(torch.float32)
    outs = []
    for n in range(m):
        acc = p[..., n, :] * xf
        for k in range(m):
            acc = fma32(c[..., k, n:n + 1], residual[..., k, :], acc)
        outs.append(acc.to(torch.bfloat16))
    return torch.stack(outs, dim=-2)


def post_bwd_emulated(grad: torch.Tensor, post_mix: torch.Tensor, comb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward kernel's bf16 bits ``(grad_x, grad_residual)``: fp32 chains over the output
    streams ``n`` in order (a product, then fused multiply-adds), one bf16 rounding."""
    from .apply_mix import fma32

    m = grad.shape[-2]
    g, p, c = grad, post_mix.to(torch.float32), comb.to(torch.float32)
    gx = p[..., 0, :] * g[..., 0, :].to(torch.float32)
    for n in range(1, m):
        gx = fma32(p[..., n, :], g[..., n, :], gx)
    rows = []
    for k in range(m):
        acc = c[..., k, 0:1] * g[..., 0, :].to(torch.float32)
        for n in range(1, m):
            acc = fma32(c[..., k, n:n + 1], g[..., n, :], acc)
        rows.append(acc.to(torch.bfloat16))
    return gx.to(torch.bfloat16), torch.stack(rows, dim=-2)
