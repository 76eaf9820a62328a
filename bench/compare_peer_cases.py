"""The cases of ``bench/compare_peer.py``: the speed-parity issue's shapes, decode sizes (1-128
tokens), the per-block, lossless and cast-back casts at 8192 x 7168, the transpose ops, and
(without ``--quick``) every other op of the peer's quant and moe API once, each a call that
``tilebin.ops.<family>`` and ``tile_kernels.<family>`` 1.0.0 both take (same function name, same
arguments).

Inputs are made on the GPU when a case runs (``Case.make``); routing maps come from tilebin's
``get_fused_mapping``, so both sides read the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

FAMILIES = ("quant", "moe", "transpose")
# the public API of tile_kernels 1.0.0 the cases call (tile_kernels/<family>/__init__.py)
PEER_API = {
    "quant": ("per_token_cast", "per_channel_cast", "per_channel_cast_fused", "swiglu_backward_and_per_token_cast",
              "per_block_cast", "per_block_cast_lossless", "cast_back", "per_token_cast_with_sf_only",
              "per_token_cast_with_precomputed_sf", "per_token_cast_back", "unpack_from_e2m1fn_x2",
              "per_block_cast_with_sf_only", "per_block_cast_with_precomputed_sf", "per_channel_cast_and_transpose",
              "swiglu_forward_and_per_token_cast", "swiglu_forward_and_per_channel_cast_and_transpose"),
    "moe": ("aux_fi", "get_fused_mapping", "normalize_weight", "topk_sum_and_topk_group_idx", "top2_sum_gate",
            "topk_gate", "expand_to_fused_with_sf", "reduce_fused", "expand_to_fused", "group_count",
            "mask_indices_by_tp"),
    "transpose": ("transpose", "batched_transpose"),
}
DECODE_TOKENS = (1, 4, 16, 64, 128)


@dataclass(frozen=True)
class Case:
    family: str  # the module: tilebin.ops.<family> and tile_kernels.<family>
    op: str  # the function name, the same in both
    label: str
    make: Callable[[], tuple[tuple, dict]]  # (args, kwargs) on the GPU, given to both


# ------------------------------------------------------------------ inputs
def _t():
    import torch

    return torch


def local_topk_idx(tokens: int, topk: int, experts: int = 32, ep_ranks: int = 8):
    """int64 [rows, topk] as tile_kernels' benchmarks make them: top-k over every rank's experts,
    other ranks' experts as -1, rows with no local expert dropped (4001 x 8 ranks: ~9k-23k rows)."""
    torch = _t()
    scores = torch.rand((tokens * ep_ranks, experts * ep_ranks), dtype=torch.bfloat16, device="cuda")
    idx = torch.topk(scores, k=topk, dim=-1, sorted=False).indices
    idx[idx >= experts] = -1
    return idx[(idx >= 0).any(dim=1)].contiguous()


def decode_topk_idx(tokens: int, topk: int = 8, experts: int = 256):
    torch = _t()
    return torch.rand((tokens, experts), device="cuda").topk(topk, dim=-1).indices.contiguous()


def _mapping(topk_idx, experts: int, alignment: int):
    """(pos_to_expert, pos_to_token_topk, token_topk_to_pos) of tilebin's get_fused_mapping."""
    from tilebin.ops import moe

    m = moe.get_fused_mapping(topk_idx, experts, 0, alignment)
    return m[0], m[2], m[3]


def _e4m3_pair(rows: int, cols: int, group: int):
    torch = _t()
    data = torch.randn((rows, cols), device="cuda").clamp(-448, 448).to(torch.float8_e4m3fn)
    return data, torch.rand((rows, cols // group), device="cuda") + 0.01


def _e2m1_pow2_pair(rows: int, cols: int):
    """Packed e2m1 data (every code) with fp32 power-of-two scales per 32 channels, row-major, within
    2**8 of each other (the lossless re-cast's rule holds)."""
    torch = _t()
    data = torch.randint(-128, 128, (rows, cols // 2), dtype=torch.int8, device="cuda")
    return data, torch.exp2(torch.randint(-4, 5, (rows, cols // 32), device="cuda").float())


def _randn(shape, dtype):
    return _t().randn(shape, device="cuda").to(dtype)


def mapping_inputs(idx, experts: int, alignment: int):
    """get_fused_mapping's arguments with the slot count given (no host sync on either side)."""
    return (idx, experts, idx.numel() + experts * (alignment - 1), alignment), {}


def swiglu_bwd_inputs(topk: int, hidden: int = 4096, group: int = 32):
    torch = _t()
    idx = local_topk_idx(4001, topk)
    _, p2t, ttp = _mapping(idx, 32, 128)
    rows = p2t.shape[0]
    weight = torch.rand(idx.shape, device="cuda") + 0.01
    return (_e4m3_pair(rows, 2 * hidden, group), _randn((rows, hidden), torch.bfloat16), weight, p2t, ttp, group), {}


def expand_sf_inputs(idx, experts: int, hidden: int, alignment: int):
    pte, _, ttp = _mapping(idx, experts, alignment)
    return (_e4m3_pair(idx.shape[0], hidden, 128), 128, ttp, pte), {}


def reduce_inputs(idx, experts: int, hidden: int, dtype, fp8: bool):
    torch = _t()
    pte, _, ttp = _mapping(idx, experts, 16)
    x = _randn((pte.shape[0], hidden), dtype)
    weights = torch.rand(idx.shape, device="cuda")
    return ((x, weights, ttp, "e4m3", torch.rand((1,), device="cuda") + 0.5) if fp8 else (x, weights, ttp)), {}


def gate_inputs(tokens: int, experts: int, topk: int, groups: int, topk_groups: int, scoring: str):
    torch = _t()
    logits, bias = _randn((tokens, experts), torch.float32), _randn((experts,), torch.float32)
    return (logits, bias, topk, topk_groups, groups, False, 0, 2.5, 0, 1, 0, 1, scoring), {}


# ------------------------------------------------------------------ the case table
def quant_cases(quick: bool) -> list[Case]:
    torch = _t()
    bf16, fp32 = torch.bfloat16, torch.float32
    topks = (2, 8) if quick else (2, 6, 8, 9)
    cases = [Case("quant", "swiglu_backward_and_per_token_cast", f"hidden 4096, 1x32 sf, topk {k}",
                  lambda k=k: swiglu_bwd_inputs(k)) for k in topks]
    cases += [Case("quant", "per_channel_cast", f"bf16 {t}x{h}, 128 tokens per sf",
                   lambda t=t, h=h: ((_randn((t, h), bf16), "e4m3", 128), {}))
              for h in (2048, 6144) for t in ((4096,) if quick else (4096, 8064))]
    cases.append(Case("quant", "per_channel_cast_fused", "bf16 4096x4096, plain",
                      lambda: ((_randn((4096, 4096), bf16), "e4m3", 128), {})))
    cases += [Case("quant", "per_token_cast", f"fp32 {t}x2048 -> e5m6",
                   lambda t=t: ((_randn((t, 2048), fp32), "e5m6", 2048), {})) for t in (4001, 8001)]
    cases += [Case("quant", "per_token_cast", f"bf16 {t}x7168 -> e4m3 1x128 (decode)",
                   lambda t=t: ((_randn((t, 7168), bf16), "e4m3", 128), {})) for t in DECODE_TOKENS]
    cases.append(Case("quant", "per_token_cast", "bf16 8192x7168 -> e4m3 1x128",
                      lambda: ((_randn((8192, 7168), bf16), "e4m3", 128), {})))
    ue8m0 = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    cases += [Case("quant", "per_block_cast", f"bf16 8192x7168 -> e4m3 {m}x{k}{', packed ue8m0' if kw else ''}",
                   lambda m=m, k=k, kw=kw: ((_randn((8192, 7168), bf16), "e4m3", (m, k)), kw))
              for m, k, kw in ((128, 128, {}), (32, 32, ue8m0))]
    cases += [Case("quant", "per_block_cast_lossless",
                   f"e2m1 8192x7168, 1x32 sf -> e4m3 {m}x{k}{', packed ue8m0' if kw else ''}",
                   lambda m=m, k=k, kw=kw: ((_e2m1_pow2_pair(8192, 7168), "e4m3", (1, 32), (m, k)),
                                            dict(kw, round_sf=True)))
              for m, k, kw in ((1, 128, {}), (128, 128, ue8m0))]
    cases.append(Case("quant", "cast_back", "e4m3 8192x7168, 1x128 fp32 sf -> bf16",
                      lambda: ((_e4m3_pair(8192, 7168, 128), "bf16", (1, 128)), {})))
    return cases if quick else cases + quant_coverage_cases()


def quant_coverage_cases() -> list[Case]:
    """Every other op of the peer's quant API once, at 8192 tokens (the SwiGLU ops: x 8192 x 4096)."""
    torch = _t()
    bf16, big = torch.bfloat16, (8192, 7168)
    return [
        Case("quant", "per_token_cast", "bf16 8192x7168 -> e2m1 1x32", lambda: ((_randn(big, bf16), "e2m1", 32), {})),
        Case("quant", "per_token_cast_with_sf_only", "bf16 8192x7168, 1x128",
             lambda: ((_randn(big, bf16), "e4m3", 128), {})),
        Case("quant", "per_token_cast_with_precomputed_sf", "bf16 8192x7168 -> e4m3 1x128",
             lambda: ((_randn(big, bf16), "e4m3", 128, torch.rand((8192, 56), device="cuda") + 0.01), {})),
        Case("quant", "per_token_cast_back", "e4m3 8192x7168, 1x128 -> fp32",
             lambda: ((_e4m3_pair(8192, 7168, 128), "fp32", 128), {})),
        Case("quant", "cast_back", "e2m1 8192x7168, 1x32 sf -> bf16",
             lambda: ((_e2m1_pow2_pair(8192, 7168), "bf16", (1, 32)), {})),
        Case("quant", "unpack_from_e2m1fn_x2", "int8 8192x3584 -> fp32",
             lambda: ((_e2m1_pow2_pair(8192, 7168)[0],), {})),
        Case("quant", "per_block_cast_with_sf_only", "bf16 8192x7168, 128x128",
             lambda: ((_randn(big, bf16), "e4m3", (128, 128)), {})),
        Case("quant", "per_block_cast_with_precomputed_sf", "bf16 8192x7168 -> e4m3 128x128",
             lambda: ((_randn(big, bf16), "e4m3", (128, 128), torch.rand((64, 56), device="cuda") + 0.01), {})),
        Case("quant", "per_channel_cast_and_transpose", "bf16 8192x7168, 128 tokens per sf",
             lambda: ((_randn(big, bf16), "e4m3", 128), {})),
        Case("quant", "swiglu_forward_and_per_token_cast", "bf16 8192x4096 -> e4m3 1x128",
             lambda: ((_randn((8192, 4096), bf16), "e4m3", 128), {})),
        Case("quant", "swiglu_forward_and_per_channel_cast_and_transpose", "bf16 8192x4096, 128 tokens per sf",
             lambda: ((_randn((8192, 4096), bf16), "e4m3", 128), {})),
    ]


def moe_cases(quick: bool) -> list[Case]:
    torch = _t()
    topks = (2, 8) if quick else (2, 6, 8, 9)
    cases = []
    for k in topks:
        idx = lambda k=k: local_topk_idx(4001, k)  # noqa: E731
        cases += [
            Case("moe", "aux_fi", f"32 experts, topk {k}", lambda k=k, idx=idx: ((idx(), 32, k), {})),
            Case("moe", "get_fused_mapping", f"32 experts, align 128, topk {k}",
                 lambda idx=idx: mapping_inputs(idx(), 32, 128)),
            Case("moe", "normalize_weight", f"topk {k}, 4001x8 ranks",
                 lambda idx=idx: ((torch.rand(idx().shape, device="cuda") + 0.01,), {})),
            Case("moe", "expand_to_fused_with_sf", f"hidden 3072, 1x128 sf, topk {k}",
                 lambda idx=idx: expand_sf_inputs(idx(), 32, 3072, 128)),
        ]
    for t in ((4001,) if quick else (4001, 8001)):
        cases += [
            Case("moe", "topk_sum_and_topk_group_idx", f"{t} tok, 256 experts, 8 groups",
                 lambda t=t: ((_randn((t, 8, 32), torch.float32), 2, 4), {})),
            Case("moe", "top2_sum_gate", f"{t} tok, 256 experts, 8 groups, sqrtsoftplus",
                 lambda t=t: gate_inputs(t, 256, 8, 8, 4, "sqrtsoftplus")),
            Case("moe", "top2_sum_gate", f"{t} tok, 108 experts, softmax",
                 lambda t=t: gate_inputs(t, 108, 6, 0, 0, "softmax")),
            Case("moe", "topk_gate", f"{t} tok, 256 experts, topk 8",
                 lambda t=t: ((_randn((t, 256), torch.float32), 8), {})),
        ]
    for h, dtype in ((2048, torch.bfloat16), (3072, torch.float32), (7168, torch.float32)):
        cases.append(Case("moe", "reduce_fused", f"hidden {h} {str(dtype)[6:]} -> e4m3 with sf, topk 6",
                          lambda h=h, dtype=dtype: reduce_inputs(local_topk_idx(4001, 6), 32, h, dtype, True)))
    if not quick:
        cases += moe_coverage_cases()
    return cases + moe_decode_cases()


def moe_coverage_cases() -> list[Case]:
    """The peer's other moe ops once each, on tile_kernels' benchmark routing (topk 8, 32 local experts)."""
    torch = _t()

    def expand_inputs():
        idx = local_topk_idx(4001, 8)
        pte, _, ttp = _mapping(idx, 32, 128)
        return (_randn((idx.shape[0], 7168), torch.bfloat16), ttp, pte), {}

    return [
        Case("moe", "expand_to_fused", "hidden 7168 bf16, topk 8", expand_inputs),
        Case("moe", "group_count", "32 experts, topk 8", lambda: ((local_topk_idx(4001, 8), 32), {})),
        Case("moe", "mask_indices_by_tp", "256 experts, 8 EP ranks, TP rank 1 of 2",
             lambda: ((decode_topk_idx(4001 * 8), 256, 8, 1, 2), {})),
    ]


def moe_decode_cases() -> list[Case]:
    """DeepSeek-V3 routing (256 experts, 8 groups, top-8, hidden 7168) at decode sizes."""
    torch = _t()
    cases = []
    for t in DECODE_TOKENS:
        idx = lambda t=t: decode_topk_idx(t)  # noqa: E731
        cases += [
            Case("moe", "top2_sum_gate", f"{t} tok (decode), 256 experts, 8 groups, sigmoid",
                 lambda t=t: gate_inputs(t, 256, 8, 8, 4, "sigmoid")),
            Case("moe", "topk_gate", f"{t} tok (decode), 256 experts",
                 lambda t=t: ((_randn((t, 256), torch.float32), 8), {})),
            Case("moe", "normalize_weight", f"{t} tok (decode), topk 8",
                 lambda t=t: ((torch.rand((t, 8), device="cuda") + 0.01,), {})),
            Case("moe", "get_fused_mapping", f"{t} tok (decode), 256 experts, align 16",
                 lambda idx=idx: mapping_inputs(idx(), 256, 16)),
            Case("moe", "expand_to_fused_with_sf", f"{t} tok (decode), hidden 7168",
                 lambda idx=idx: expand_sf_inputs(idx(), 256, 7168, 16)),
            Case("moe", "reduce_fused", f"{t} tok (decode), hidden 7168 bf16",
                 lambda idx=idx: reduce_inputs(idx(), 256, 7168, torch.bfloat16, False)),
        ]
    return cases


def transpose_cases(quick: bool) -> list[Case]:
    torch = _t()
    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32, torch.float8_e4m3fn)
    cases = [Case("transpose", "transpose", f"{str(d)[6:]} 8192x7168", lambda d=d: ((_randn((8192, 7168), d),), {}))
             for d in dtypes]
    cases.append(Case("transpose", "batched_transpose", "bf16 8x4096x4096",
                      lambda: ((_randn((8, 4096, 4096), torch.bfloat16),), {})))
    cases.append(Case("transpose", "transpose", "bf16 4001x7168 (peer: multiples of 64 only)",
                      lambda: ((_randn((4001, 7168), torch.bfloat16),), {})))
    cases += [Case("transpose", "transpose", f"bf16 {t}x7168 (decode)",
                   lambda t=t: ((_randn((t, 7168), torch.bfloat16),), {})) for t in DECODE_TOKENS]
    return cases


CASES = {"quant": quant_cases, "moe": moe_cases, "transpose": transpose_cases}


def all_cases(family: str, quick: bool) -> list[Case]:
    """The family's cases (``quick``: fewer top-k values and token counts)."""
    return CASES[family](quick)
