"""GPU tests of ``moe.reduce_fused_paired`` as shipped: ``tilebin.ops.moe.reduce_fused`` on its
default path (no monkeypatching: ``moe.reduce_fused_few_tokens`` below ``_REDUCE_SPLIT_TOKENS``
tokens, from there on ``moe.reduce_fused_paired`` for rows of <= ``_PAIRED_ROW_BYTES`` bytes, else
``moe.reduce_fused``) must equal ``moe_ref.routing`` bit for bit, and so must ``moe.reduce_fused``
and ``moe.reduce_fused_paired`` launched directly on the same inputs.  Op outputs come from
poisoned memory (or a NaN-filled ``out=``), direct launches write into NaN / 0xFF buffers; inputs
are fresh per case.

Token counts: empty, 1, 7, 1000, 1023 (below the split), 1024, 4097 (one token per block), 9001 and
~17.6k (compare_peer's 4001 tokens x 8 EP ranks: 2 and 4 tokens per block, partial last blocks).
Rows: compare_peer's 2048 bf16 and 3072 fp32 (12288 bytes: the limit, paired) and 7168 fp32 (28672
bytes: moe.reduce_fused), 6152 bf16 (12304 bytes: just past the limit) and two small odd rows (a
chunk's threads partly idle).  Routing is mostly -1 slots (EP, top-k 6) or every slot valid
(top-k 8 and 40: more than one batch of 2 and more than a warp of slots).
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed, topk_idx
from moe_ref import routing as ref

SHIPPED, PAIRED = "moe.reduce_fused", "moe.reduce_fused_paired"
ROW_LIMIT = 12288  # ops/moe/_routing.py's _PAIRED_ROW_BYTES
SHAPES = [(2048, torch.bfloat16), (3072, torch.float32), (7168, torch.float32), (6152, torch.bfloat16),
          (1032, torch.bfloat16), (76, torch.float32)]
SHAPE_IDS = ["2048-bf16", "3072-f32", "7168-f32", "6152-bf16", "1032-bf16", "76-f32"]
_KEYS = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn"}


@pytest.fixture(scope="module")
def moe(require):
    for kernel in (SHIPPED, PAIRED, "moe.reduce_fused_few_tokens"):
        require(kernel)
    from tilebin.ops.moe import _routing

    if _routing._PAIRED_ROW_BYTES != ROW_LIMIT:
        pytest.fail(f"_PAIRED_ROW_BYTES is {_routing._PAIRED_ROW_BYTES}; these shapes pick sides of {ROW_LIMIT}")
    return load_moe_ops(require, ("reduce_fused",), "ops/moe/_routing.py")


def _direct(rt, kernel: str, x_in, w, ttp, fp8: str, sf) -> torch.Tensor:
    """``kernel`` through the checked runtime.launch into a NaN (0xFF bytes for e4m3) buffer; an absent
    optional input is a stand-in of its dtype and rank (its flag 0: never read)."""
    data, x_sf = x_in if isinstance(x_in, tuple) else (x_in, None)
    out_dtype = torch.float8_e4m3fn if fp8 else data.dtype
    out = torch.empty((ttp.shape[0], data.shape[1]), dtype=out_dtype, device="cuda")
    out.view(torch.uint8).fill_(0xFF)
    one = torch.ones((1,), device="cuda")
    weights = torch.ones(ttp.shape, device="cuda") if w is None else w
    rt.launch(kernel, data, weights, ttp, out, one if sf is None else sf, one if x_sf is None else x_sf,
              int(w is not None), int(x_sf is not None), int(sf is not None),
              in_dtype=_KEYS[data.dtype], out_dtype=_KEYS[out_dtype])
    return out


def _compare(rt, moe, x_in, w, ttp, fp8: str, sf, what: str) -> None:
    want = ref.reduce_fused(x_in, w, ttp, fp8, sf)
    data = x_in[0] if isinstance(x_in, tuple) else x_in
    poison_cache(2 * ttp.shape[0] * data.shape[1] * 4)  # the op's out (<= fp32) lands in poisoned memory
    got = moe.reduce_fused(x_in, w, ttp, fp8, sf)
    assert_bits_equal(got, want, f"{what}: op vs reference")
    for kernel in (SHIPPED, PAIRED):
        assert_bits_equal(_direct(rt, kernel, x_in, w, ttp, fp8, sf), got, f"{what}: {kernel} direct vs op")


def _routing_for(tokens: int, topk: int, dense: bool) -> torch.Tensor:
    """token_topk_to_pos of exactly ``tokens`` rows: EP-style (8 ranks of 32 experts, most slots -1)
    or dense (64 experts, one rank: every slot valid)."""
    if tokens == 0:
        idx = torch.empty((0, topk), dtype=torch.int64, device="cuda")
    elif dense:
        idx = topk_idx(tokens, topk, 64, 1)
    else:
        idx = topk_idx(tokens // 2 + 4, topk, 32, 8)[:tokens].contiguous()
    assert idx.shape[0] == tokens, (idx.shape, tokens)
    return ref.get_fused_mapping(idx, 64 if dense else 32, 0, 16)[3]


def _check_all_outputs(rt, moe, ttp, hidden: int, dtype, what: str) -> None:
    slots = int(ttp.max()) + 1 if ttp.numel() else 0
    x = torch.randn((slots, hidden), device="cuda").to(dtype)
    w = torch.rand(ttp.shape, device="cuda")
    x_sf = torch.randn((slots,), device="cuda")
    sf = torch.rand((1,), device="cuda") + 0.5
    side = "paired" if hidden * x.element_size() <= ROW_LIMIT else "reduce_fused"
    what = f"{what}, hidden {hidden} {dtype} ({side} side), ttp {tuple(ttp.shape)}"
    _compare(rt, moe, x, w, ttp, "e4m3", sf, what + ", e4m3 + sf")  # compare_peer's case
    _compare(rt, moe, (x, x_sf), w, ttp, "", None, what + ", plain, x_sf")
    _compare(rt, moe, x, None, ttp, "", None, what + ", plain, no weights")
    _compare(rt, moe, (x, x_sf), None, ttp, "e4m3", -sf, what + ", e4m3, x_sf, negative sf")


@pytest.mark.parametrize("tokens", [0, 1, 7, 1000, 1023, 1024, 4097, 9001])
@pytest.mark.parametrize("hidden, dtype", SHAPES, ids=SHAPE_IDS)
def test_op_matches_reference_and_kernels_ep(rt, moe, tokens, hidden, dtype):
    seed("reduce_paired_ep", tokens, hidden, str(dtype))
    _check_all_outputs(rt, moe, _routing_for(tokens, 6, dense=False), hidden, dtype, f"EP top-k 6, {tokens} tokens")


@pytest.mark.parametrize("hidden, dtype", SHAPES[:4], ids=SHAPE_IDS[:4])
def test_op_matches_reference_and_kernels_bench_shape(rt, moe, hidden, dtype):
    """compare_peer's case: 4001 tokens x 8 EP ranks (~17.6k rows: 4 tokens per block)."""
    seed("reduce_paired_bench", hidden, str(dtype))
    idx = topk_idx(4001, 6, 32, 8)
    _check_all_outputs(rt, moe, ref.get_fused_mapping(idx, 32, 0, 16)[3], hidden, dtype, "bench")


@pytest.mark.parametrize("tokens, topk", [(7, 40), (1000, 8), (4097, 40), (16385, 8)])
@pytest.mark.parametrize("hidden, dtype", [SHAPES[0], SHAPES[2], SHAPES[3], SHAPES[5]],
                         ids=["2048-bf16", "7168-f32", "6152-bf16", "76-f32"])
def test_op_matches_reference_and_kernels_dense(rt, moe, tokens, topk, hidden, dtype):
    """Every slot valid: 4 or 20 batches of 2 rows per chunk, top-k past a warp (40)."""
    seed("reduce_paired_dense", tokens, topk, hidden, str(dtype))
    _check_all_outputs(rt, moe, _routing_for(tokens, topk, dense=True), hidden, dtype, f"dense top-k {topk}")


@pytest.mark.parametrize("hidden", [3072, 7168])
def test_op_into_a_given_out(moe, hidden):
    """``out=`` a NaN-filled buffer (bf16 / fp32) and an e4m3 buffer of 0xFF bytes (NaN), 9001 tokens,
    rows on both sides of the limit."""
    seed("reduce_paired_out", hidden)
    ttp = _routing_for(9001, 6, dense=False)
    slots = int(ttp.max()) + 1
    for dtype, fp8 in ((torch.bfloat16, ""), (torch.float32, "e4m3"), (torch.float32, "")):
        x = torch.randn((slots, hidden), device="cuda").to(dtype)
        w = torch.rand(ttp.shape, device="cuda")
        want = ref.reduce_fused(x, w, ttp, fp8, None)
        buf = torch.empty_like(want)
        if fp8:
            buf.view(torch.uint8).fill_(0xFF)
        else:
            buf.fill_(float("nan"))
        assert moe.reduce_fused(x, w, ttp, fp8, None, buf) is buf
        assert_bits_equal(buf, want, f"out= hidden {hidden} {dtype} fp8={fp8!r}")
