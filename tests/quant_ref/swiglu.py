"""References for the SwiGLU ops fused with e4m3 casts (``swiglu_forward_and_per_token_cast``,
``swiglu_backward_and_per_token_cast``, ``swiglu_forward_and_per_channel_cast_and_transpose``).

The SwiGLU math is ``tile_kernels.torch.swiglu_forward`` / ``swiglu_backward`` 1.0.0 step for
step (fp32, each torch op rounded on its own, tensor / tensor divisions only, so no op is turned
into a multiply by a reciprocal), then :func:`quant_ref.cast.cast`.  One exception to "plain
torch": the backward's ``x * (1 - s) + 1`` is a fused multiply-add in tile_kernels' reference
(``torch.compile``'d, i.e. Triton's fma); :func:`fma_f32` computes the correctly rounded fp32 fma
exactly in float64 with round-to-odd, on any device, without torch.compile.

Device: ``exp`` is the only op whose bits depend on the backend (CUDA's ``expf`` vs the CPU's
vectorized exp); run these references on CUDA tensors to compare with the kernels bit for bit.

Semantics of the ops that go beyond tile_kernels' torch code (as tilebin's ops and tile_kernels'
own tests do): rows with ``pos_to_expert < 0`` are zero rows, and their elements are not counted
in ``clamped_count`` (the kernels never read them); the per-token forward takes ``sf_clamp_min``.
"""

from typing import Optional

import torch

from .cast import QuantPair, _block_amax, _expand_blocks, _format_sf, cast

E4M3_MAX = 448.0


def fma_f32(a: torch.Tensor, b, c) -> torch.Tensor:
    """``fmaf(a, b, c)``: ``a * b + c`` rounded once to fp32 (nearest even); ``b``, ``c`` may be floats.

    ``a * b`` is exact in float64 (24 + 24 bits); the sum is rounded to float64 with round-to-odd
    (``s`` and its exact error ``e`` from TwoSum; an inexact ``s`` with an even last bit moves one
    ulp towards ``e``), which makes the final rounding to fp32 (53 >= 24 + 2 bits) correct."""
    a, b, c = (torch.as_tensor(v, dtype=torch.float32, device=a.device) for v in (a, b, c))
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bp = s - p
    err = (p - (s - bp)) + (cd - bp)
    bits = s.view(torch.int64)
    fix = (err != 0) & ((bits & 1) == 0)
    step = torch.where((err > 0) == (s > 0), 1, -1)
    return torch.where(fix, bits + step, bits).view(torch.float64).float()


def _row_weights(rows: int, pos_to_token_topk: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """fp32 ``[rows]``: ``topk_weights.flat[pos]``, 0.0 where ``pos < 0``."""
    num_topk = topk_weights.shape[1]
    mask = pos_to_token_topk >= 0
    pos = pos_to_token_topk[mask].long()
    w = torch.zeros(rows, dtype=torch.float32, device=topk_weights.device)
    w[mask] = topk_weights[torch.div(pos, num_topk, rounding_mode="floor"), pos % num_topk].float()
    return w


def swiglu_forward(x: torch.Tensor, pos_to_token_topk: Optional[torch.Tensor] = None,
                   topk_weights: Optional[torch.Tensor] = None, swiglu_clamp_value: Optional[float] = None,
                   clamped_count: Optional[torch.Tensor] = None,
                   count_rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp32 ``silu(gate) * up`` (clamped, weighted) of ``x = [gate, up]`` (bf16/fp32 ``[rows, 2h]``),
    as ``tile_kernels.torch.swiglu_forward``.  ``clamped_count`` (int64 ``[3]``) gets ``#gate > c``,
    ``#up > c``, ``#up < -c`` added, over the rows where ``count_rows`` (bool ``[rows]``) is true
    (all rows when None)."""
    hidden = x.shape[1] // 2
    x32 = x.float()
    gate, up = x32[:, :hidden], x32[:, hidden:]
    if swiglu_clamp_value is not None:
        c = swiglu_clamp_value
        if clamped_count is not None:
            g, u = (gate, up) if count_rows is None else (gate[count_rows], up[count_rows])
            clamped_count[0] += (g > c).sum()
            clamped_count[1] += (u > c).sum()
            clamped_count[2] += (u < -c).sum()
        gate = torch.clamp(gate, max=c)
        up = torch.clamp(up, min=-c, max=c)
    out = gate / (1.0 + torch.exp(-gate)) * up
    if pos_to_token_topk is not None:
        out = out * _row_weights(x.shape[0], pos_to_token_topk, topk_weights).unsqueeze(1)
    return out


def _cast_custom_min(act: torch.Tensor, block: tuple[int, int], round_sf: bool, col: bool, packed: bool,
                     clamp_min: float) -> QuantPair:
    """:func:`cast` to e4m3 with ``clamp_min`` in place of the default 1e-4 (the same steps)."""
    bits_amax = _block_amax(act, block)
    clamped = torch.clamp(bits_amax, min=clamp_min)
    fmax = torch.full_like(clamped, E4M3_MAX)
    bits = (clamped / fmax).view(torch.int32)
    zero = torch.zeros_like(clamped)
    if round_sf:
        bits = (bits + 0x007FFFFF) & 0x7F800000
        inv = torch.where(bits == 0, zero, torch.reciprocal(bits.view(torch.float32)))
    else:
        inv = torch.where(bits == 0, zero, fmax / clamped)
    scaled = act * _expand_blocks(inv, block, act.shape[0], act.shape[1])
    data = torch.clamp(scaled, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return data, _format_sf(bits, col, packed)


def swiglu_forward_and_per_token_cast(
    x: torch.Tensor, fmt: str, num_per_channels: int, pos_to_token_topk: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None, pos_to_expert: Optional[torch.Tensor] = None,
    use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False, use_packed_ue8m0: bool = False,
    swiglu_clamp_value: Optional[float] = None, clamped_count: Optional[torch.Tensor] = None,
    sf_clamp_min: Optional[float] = None,
) -> QuantPair:
    """What ``tilebin.ops.quant.swiglu_forward_and_per_token_cast`` returns (same arguments)."""
    assert fmt == "e4m3"
    kept = None if pos_to_expert is None else pos_to_expert >= 0
    weights = topk_weights if pos_to_token_topk is not None else None
    act = swiglu_forward(x, pos_to_token_topk, weights, swiglu_clamp_value, clamped_count, kept)
    if kept is not None:
        act = act.masked_fill(~kept.unsqueeze(1), 0.0)
    block = (1, num_per_channels)
    if sf_clamp_min is None or act.shape[0] == 0:
        return cast(act, "e4m3", block, round_sf=round_sf, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
                    use_packed_ue8m0=use_packed_ue8m0)
    return _cast_custom_min(act, block, round_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0, sf_clamp_min)


def swiglu_forward_and_per_channel_cast_and_transpose(
    x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False, without_transpose: bool = False,
    swiglu_clamp_value: Optional[float] = None,
) -> QuantPair:
    """The bf16 activation cast with ``(num_per_tokens, 1)`` blocks; data transposed (contiguous)
    unless ``without_transpose`` (tile_kernels' test reference)."""
    assert fmt == "e4m3"
    act = swiglu_forward(x, swiglu_clamp_value=swiglu_clamp_value).bfloat16()
    data, sf = cast(act, "e4m3", (num_per_tokens, 1), round_sf=round_sf)
    if not without_transpose:
        data = data.T.contiguous()
    return data, sf


def swiglu_backward(x: QuantPair, grad_out: torch.Tensor, weight: torch.Tensor, pos_to_token_topk: torch.Tensor,
                    num_per_channels: int, swiglu_clamp_value: Optional[float] = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, x_grad, weight_grad)`` in fp32, as ``tile_kernels.torch.swiglu_backward`` (the fma
    exact, see :func:`fma_f32`); ``weight_grad`` entries no row maps to are 0."""
    data, sf = x
    hidden = data.shape[-1] // 2
    data = data.reshape(-1, 2 * hidden)
    rows = data.shape[0]
    x32 = data.float() * sf.repeat_interleave(num_per_channels, dim=1)
    xp, yp = x32[:, :hidden].clone(), x32[:, hidden:].clone()
    if swiglu_clamp_value is not None:
        c = swiglu_clamp_value
        x_cl = xp > c
        xp[x_cl] = c
        y_up, y_lo = yp > c, yp < -c
        y_cl = y_up | y_lo
        yp[y_up] = c
        yp[y_lo] = -c
    t = 1.0 + torch.exp(-xp)
    s = torch.ones_like(xp) / t
    w = _row_weights(rows, pos_to_token_topk, weight)
    g = grad_out.reshape(rows, hidden).float()
    gws = g * w.unsqueeze(1) * s
    dx = gws * yp * fma_f32(xp, 1.0 - s, torch.ones_like(xp))
    dy = gws * xp
    if swiglu_clamp_value is not None:
        dx[x_cl] = 0.0
        dy[y_cl] = 0.0
    act = xp / t * yp
    out = act * w.unsqueeze(1)
    weight_grad = torch.zeros_like(weight)
    mask = pos_to_token_topk >= 0
    pos = pos_to_token_topk[mask].long()
    num_topk = weight.shape[1]
    weight_grad[torch.div(pos, num_topk, rounding_mode="floor"), pos % num_topk] = (g * act).sum(dim=1)[mask]
    return out, torch.cat([dx, dy], dim=1), weight_grad


def swiglu_backward_and_per_token_cast(
    x: QuantPair, grad_out: torch.Tensor, weight: torch.Tensor, pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor, num_per_channels: int, round_sf: bool = False,
    swiglu_clamp_value: Optional[float] = None,
) -> tuple[torch.Tensor, QuantPair, torch.Tensor, torch.Tensor]:
    """What ``tilebin.ops.quant.swiglu_backward_and_per_token_cast`` returns (tile_kernels' test
    reference): bf16 out, the e4m3 cast of the fp32 input gradient, its bf16 rounding, and the
    fp32 weight gradient (compare that one with a tolerance: the row sums' order differs)."""
    del token_topk_to_pos  # the reference derives everything from pos_to_token_topk
    out, x_grad, weight_grad = swiglu_backward(x, grad_out, weight, pos_to_token_topk, num_per_channels,
                                               swiglu_clamp_value)
    fp8 = cast(x_grad, "e4m3", (1, num_per_channels), round_sf=round_sf)
    return out.to(torch.bfloat16), fp8, x_grad.to(torch.bfloat16), weight_grad


__all__ = [
    "fma_f32",
    "swiglu_backward",
    "swiglu_backward_and_per_token_cast",
    "swiglu_forward",
    "swiglu_forward_and_per_channel_cast_and_transpose",
    "swiglu_forward_and_per_token_cast",
]
