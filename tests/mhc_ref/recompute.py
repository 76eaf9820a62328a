"""Torch reference of mHC's multilayer recompute (semantics of tile_kernels 1.0.0
``mhc_multilayer_recompute``), test-only.

``recompute`` returns ``(layer_inputs, residuals)``: starting from ``r = initial_residual``
(bf16 ``[..., M, hidden]``), for each completed layer ``i < len(layer_outputs)``::

    layer_inputs[i] = bf16(sum_j pre[i][..., j] * r[..., j, :])
    residuals[i]    = bf16(post[i][..., o] * layer_outputs[i] + sum_j comb[i][..., j, o] * r[..., j, :])
    r = residuals[i]

then one more layer input when ``len(pre) == len(layer_outputs) + 1``.  With ``dtype=float32``
every product and sum is rounded on its own in the kernel's order (j ascending, the post term
first): bit-exact against the kernel.  ``dtype=float64`` gives the exact sums (then one bf16
rounding), to bound the fp32 version.
"""

from __future__ import annotations

import torch


def recompute(initial_residual: torch.Tensor, pre: list, layer_outputs: list, post: list, comb: list,
              dtype: torch.dtype = torch.float32) -> tuple[list, list]:
    m, hidden = initial_residual.shape[-2:]
    r = initial_residual.reshape(-1, m, hidden).to(dtype)
    n = r.shape[0]
    inputs, residuals = [], []

    def layer_input(p):
        p = p.reshape(n, m).to(dtype)
        acc = p[:, 0:1] * r[:, 0]
        for j in range(1, m):
            acc = acc + p[:, j:j + 1] * r[:, j]
        return acc.to(torch.bfloat16)

    for i in range(len(layer_outputs)):
        inputs.append(layer_input(pre[i]))
        out = layer_outputs[i].reshape(n, hidden).to(dtype)
        q = post[i].reshape(n, m).to(dtype)
        c = comb[i].reshape(n, m, m).to(dtype)
        new = []
        for o in range(m):
            acc = q[:, o:o + 1] * out
            for j in range(m):
                acc = acc + c[:, j, o:o + 1] * r[:, j]
            new.append(acc)
        res = torch.stack(new, dim=1).to(torch.bfloat16)
        residuals.append(res)
        r = res.to(dtype)
    if len(pre) > len(layer_outputs):
        inputs.append(layer_input(pre[len(layer_outputs)]))
    return inputs, residuals
