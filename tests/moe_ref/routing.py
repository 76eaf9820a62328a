"""Torch references of the fused MoE routing ops (semantics of ``tile_kernels.torch`` 1.0.0).

Plain torch on any device, written for clarity.  Where tilebin defines what tile_kernels leaves
open, the references say so:

* ``get_fused_mapping``: within an expert, slots follow the order of the flattened ``topk_idx``
  (tile_kernels' order depends on its SM count; its tests check invariants only, see
  ``check_mapping_invariants``).  Entries outside ``[0, num_experts)`` are ignored.
* ``reduce_fused``: ``fma`` is a correctly rounded fp32 fused multiply-add computed exactly in
  float64 (tile_kernels' reference gets it from ``torch.compile``); e4m3 output saturates at
  +-448 (tile_kernels' kernel does; a plain ``.to(float8_e4m3fn)`` gives NaN past 464).
"""

from __future__ import annotations

from typing import Optional, Union

import torch

E4M3_MAX = 448.0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def get_fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int,
                      force_no_sync: bool = False):
    """The 8-tuple of ``tile_kernels.moe.get_fused_mapping`` with tilebin's slot order."""
    num_tokens, num_topk = topk_idx.shape
    dev = topk_idx.device
    numel = num_tokens * num_topk
    should_sync = num_expanded_tokens == 0 and not force_no_sync
    if should_sync:
        num_expanded_tokens = (numel + (alignment - 1) * num_experts) // alignment * alignment
    flat = topk_idx.reshape(-1)
    valid = (flat >= 0) & (flat < num_experts)
    where = torch.nonzero(valid).reshape(-1)
    experts = flat[where]
    counts = torch.bincount(experts, minlength=num_experts)
    aligned = (counts + alignment - 1) // alignment * alignment
    start = torch.cumsum(aligned, 0) - aligned
    order = torch.argsort(experts, stable=True)
    sorted_e = experts[order]
    first_of = torch.cumsum(counts, 0) - counts  # index of each expert's first entry in sorted order
    rank = torch.arange(sorted_e.numel(), device=dev) - first_of[sorted_e]
    pos = start[sorted_e] + rank
    entry = where[order]
    token_topk_to_pos = torch.full((numel,), -1, dtype=torch.int64, device=dev)
    token_topk_to_pos[entry] = pos
    maps = torch.full((3, num_expanded_tokens), -1, dtype=torch.int64, device=dev)
    keep = pos < num_expanded_tokens
    maps[0, pos[keep]] = sorted_e[keep]
    maps[1, pos[keep]] = entry[keep] // num_topk
    maps[2, pos[keep]] = entry[keep]
    maps = maps.to(torch.int32)
    result = [maps[0], maps[1], maps[2], token_topk_to_pos.to(torch.int32).reshape(num_tokens, num_topk),
              start.to(torch.int32), (start + aligned).to(torch.int32), aligned.to(torch.int32), []]
    if should_sync:
        result[7] = aligned.tolist()
        used = sum(result[7])
        result[0], result[1], result[2] = (m[:used].contiguous() for m in result[:3])
    return tuple(result)


def check_mapping_invariants(result, topk_idx: torch.Tensor, num_experts: int, alignment: int) -> None:
    """tile_kernels' own checks of a get_fused_mapping result (order-free); AssertionError names the failure."""
    p2e, p2t, p2tt, ttp, start, end, per_expert, per_list = result
    num_topk = topk_idx.shape[1]
    assert per_expert.tolist() == per_list or per_list == [], "num_tokens_per_expert differs from the returned list"
    s = 0
    for e, n in enumerate(per_expert.tolist()):
        assert n % alignment == 0, f"expert {e}: {n} slots, not a multiple of alignment {alignment}"
        assert start[e].item() == s and end[e].item() == s + n, f"expert {e}: range [{start[e]}, {end[e]}), want [{s}, {s + n})"
        seg = p2e[s:s + n]
        assert int((seg == e).sum()) == int((topk_idx == e).sum()), f"expert {e}: slot count != index count"
        assert bool(((seg == e) | (seg == -1)).all()), f"expert {e}: a slot of its range names another expert"
        s += n
    used = p2e >= 0
    if bool(used.any()):
        tt = p2tt[used].long()
        got = ttp[tt // num_topk, tt % num_topk].long()
        want = torch.nonzero(used).reshape(-1)
        assert torch.equal(got, want), "token_topk_to_pos does not invert pos_to_token_topk"
        assert torch.equal(topk_idx[tt // num_topk, tt % num_topk], p2e[used].long()), "pos_to_expert != topk_idx"
        assert torch.equal((tt // num_topk).int(), p2t[used]), "pos_to_token != pos_to_token_topk // num_topk"
    assert torch.equal(~used, p2t < 0) and torch.equal(~used, p2tt < 0), "unused slots disagree across the maps"


def _scatter_rows(out: torch.Tensor, src: torch.Tensor, token_topk_to_pos: torch.Tensor) -> None:
    num_topk = token_topk_to_pos.shape[1]
    pos = token_topk_to_pos.reshape(-1).long()
    keep = (pos >= 0) & (pos < out.shape[0])
    rows = src.unsqueeze(1).expand(-1, num_topk, -1).reshape(-1, src.shape[1])
    out[pos[keep]] = rows[keep]


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """``out[pos] = x[t]`` for every slot ``pos = token_topk_to_pos[t, k] >= 0``; zeros elsewhere."""
    out = torch.zeros((pos_to_expert.shape[0], x.shape[1]), dtype=x.dtype, device=x.device)
    _scatter_rows(out, x, token_topk_to_pos)
    return out


def expand_to_fused_with_sf(x, num_per_channels: int, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
                            use_tma_aligned_col_major_sf: bool = False):
    """``(out, out_sf)``: rows and their scale rows expanded alike; out_sf row-major, or column-major
    with the slot count padded to 4 (strides ``(1, align(slots, 4))``)."""
    data, sf = x
    slots = pos_to_expert.shape[0]
    out = expand_to_fused(data, token_topk_to_pos, pos_to_expert)
    if use_tma_aligned_col_major_sf:
        out_sf = torch.zeros((sf.shape[1], _cdiv(slots, 4) * 4), dtype=sf.dtype, device=sf.device)[:, :slots].T
    else:
        out_sf = torch.zeros((slots, sf.shape[1]), dtype=sf.dtype, device=sf.device)
    _scatter_rows(out_sf, sf, token_topk_to_pos)
    return out, out_sf


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 ``a * b + c`` (one rounding), elementwise with broadcasting.

    The product is exact in float64; the float64 sum ``s`` is the exact sum rounded, with error
    ``err`` (TwoSum).  Rounding ``s`` to fp32 equals rounding the exact value unless ``s`` is a
    tie between two fp32 neighbours and ``err != 0``: then ``s`` moves one float64 ulp toward
    the exact value first.
    """
    p = a.double() * b.double()
    c = c.double()
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    t = s.float()
    td = t.double()
    nb = torch.nextafter(t, torch.where(s > td, torch.full_like(t, float("inf")), torch.full_like(t, float("-inf"))))
    tie = (s != td) & (s == (td + nb.double()) / 2) & (err != 0)
    nudged = torch.nextafter(s, torch.where(err > 0, torch.full_like(s, float("inf")), torch.full_like(s, float("-inf"))))
    return torch.where(tie, nudged, s).float()


def reduce_fused(x: Union[torch.Tensor, tuple], topk_weights: Optional[torch.Tensor], token_topk_to_pos: torch.Tensor,
                 fp8_format: str = "", sf: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per token, in fp32: ``acc = fma(x[pos_k], w_k * x_sf[pos_k], acc)`` over valid slots in
    top-k order from 0, then ``acc * sf[0]``, cast (e4m3 saturating)."""
    x_sf = None
    if isinstance(x, tuple):
        x, x_sf = x
    num_tokens, num_topk = token_topk_to_pos.shape
    out_dtype = torch.float8_e4m3fn if fp8_format == "e4m3" else x.dtype
    acc = torch.zeros((num_tokens, x.shape[1]), dtype=torch.float32, device=x.device)
    for k in range(num_topk):
        pos = token_topk_to_pos[:, k].long()
        ok = pos >= 0
        safe = pos.clamp(min=0)
        s = torch.ones(num_tokens, dtype=torch.float32, device=x.device)
        if topk_weights is not None:
            s = topk_weights[:, k].clone()
        if x_sf is not None:
            s = s * x_sf[safe]
        acc = torch.where(ok.unsqueeze(1), fma_f32(x[safe].float(), s.unsqueeze(1), acc), acc)
    if sf is not None:
        acc = acc * sf[0].item()
    if out_dtype == torch.float8_e4m3fn:
        acc = acc.clamp(-E4M3_MAX, E4M3_MAX)
    return acc.to(out_dtype)


__all__ = ["E4M3_MAX", "check_mapping_invariants", "expand_to_fused", "expand_to_fused_with_sf", "fma_f32",
           "get_fused_mapping", "reduce_fused"]
