"""GPU tests of the speed candidate ``moe._reduce_fused_candidate`` (issue 12): through the op, with
``_REDUCE_SPLIT_TOKENS`` forced to 0 so that every token count reaches the many-token kernel, the
candidate's output must equal the shipped ``moe.reduce_fused``'s and ``moe_ref.routing``'s bit for
bit.  Outputs come from poisoned memory (or a NaN-filled ``out=``), inputs are fresh per case.

Token counts: empty, 1, 7, 1000, 4097 (one token per block), 9001 and ~17.6k (compare_peer's
4001 tokens x 8 EP ranks: 2 and 4 tokens per block, partial last blocks); hidden / dtype: the
three compare_peer shapes and two small odd rows (a chunk's threads partly idle).  Routing is
mostly -1 slots (EP, top-k 6) or every slot valid (top-k 8 and 40: more than one batch of 2 and
more than a warp of slots).
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed, topk_idx
from moe_ref import routing as ref

SHIPPED, CANDIDATE = "moe.reduce_fused", "moe._reduce_fused_candidate"
SHAPES = [(2048, torch.bfloat16), (3072, torch.float32), (7168, torch.float32), (1032, torch.bfloat16),
          (76, torch.float32)]
SHAPE_IDS = ["2048-bf16", "3072-f32", "7168-f32", "1032-bf16", "76-f32"]


@pytest.fixture(scope="module")
def moe(require):
    for kernel in (SHIPPED, CANDIDATE):
        require(kernel)
    return load_moe_ops(require, ("reduce_fused",), "ops/moe/_routing.py")


@pytest.fixture
def launch(moe, monkeypatch):
    """``launch(kernel, *args)``: the op with its many-token kernel set to ``kernel`` at every token
    count (split 0), planned afresh (empty memo), output from poisoned memory."""
    from tilebin.ops.moe import _routing

    monkeypatch.setattr(_routing, "_REDUCE_SPLIT_TOKENS", 0)

    def run(kernel: str, x_in, w, ttp, fp8: str, sf, out=None):
        monkeypatch.setattr(_routing, "_REDUCE_MANY", kernel)
        monkeypatch.setattr(_routing.REDUCE_FUSED, "memo", {})
        data = x_in[0] if isinstance(x_in, tuple) else x_in
        poison_cache(2 * ttp.shape[0] * data.shape[1] * 4)  # out (<= fp32) lands in poisoned memory
        return moe.reduce_fused(x_in, w, ttp, fp8, sf, out)

    return run


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


def _compare(launch, x_in, w, ttp, fp8: str, sf, what: str) -> None:
    want = ref.reduce_fused(x_in, w, ttp, fp8, sf)
    shipped = launch(SHIPPED, x_in, w, ttp, fp8, sf)
    got = launch(CANDIDATE, x_in, w, ttp, fp8, sf)
    assert_bits_equal(shipped, want, f"{what}: shipped vs reference")
    assert_bits_equal(got, want, f"{what}: candidate vs reference")
    assert_bits_equal(got, shipped, f"{what}: candidate vs shipped")


def _check_all_outputs(launch, ttp, hidden: int, dtype, what: str) -> None:
    slots = int(ttp.max()) + 1 if ttp.numel() else 0
    x = torch.randn((slots, hidden), device="cuda").to(dtype)
    w = torch.rand(ttp.shape, device="cuda")
    x_sf = torch.randn((slots,), device="cuda")
    sf = torch.rand((1,), device="cuda") + 0.5
    what = f"{what}, hidden {hidden} {dtype}, ttp {tuple(ttp.shape)}"
    _compare(launch, x, w, ttp, "e4m3", sf, what + ", e4m3 + sf")  # compare_peer's case
    _compare(launch, (x, x_sf), w, ttp, "", None, what + ", plain, x_sf")
    _compare(launch, x, None, ttp, "", None, what + ", plain, no weights")
    _compare(launch, (x, x_sf), None, ttp, "e4m3", -sf, what + ", e4m3, x_sf, negative sf")


@pytest.mark.parametrize("tokens", [0, 1, 7, 1000, 4097, 9001])
@pytest.mark.parametrize("hidden, dtype", SHAPES, ids=SHAPE_IDS)
def test_candidate_matches_shipped_ep(launch, tokens, hidden, dtype):
    seed("cand_reduce_ep", tokens, hidden, str(dtype))
    _check_all_outputs(launch, _routing_for(tokens, 6, dense=False), hidden, dtype, f"EP top-k 6, {tokens} tokens")


@pytest.mark.parametrize("hidden, dtype", SHAPES[:3], ids=SHAPE_IDS[:3])
def test_candidate_matches_shipped_bench_shape(launch, hidden, dtype):
    """compare_peer's case: 4001 tokens x 8 EP ranks (~17.6k rows: 4 tokens per block)."""
    seed("cand_reduce_bench", hidden, str(dtype))
    idx = topk_idx(4001, 6, 32, 8)
    _check_all_outputs(launch, ref.get_fused_mapping(idx, 32, 0, 16)[3], hidden, dtype, "bench")


@pytest.mark.parametrize("tokens, topk", [(7, 40), (1000, 8), (4097, 40), (16385, 8)])
@pytest.mark.parametrize("hidden, dtype", [SHAPES[0], SHAPES[2], SHAPES[4]], ids=["2048-bf16", "7168-f32", "76-f32"])
def test_candidate_matches_shipped_dense(launch, tokens, topk, hidden, dtype):
    """Every slot valid: 4 or 20 batches of 2 rows per chunk, top-k past a warp (40)."""
    seed("cand_reduce_dense", tokens, topk, hidden, str(dtype))
    _check_all_outputs(launch, _routing_for(tokens, topk, dense=True), hidden, dtype, f"dense top-k {topk}")


def test_candidate_into_a_given_out(launch):
    """``out=`` a NaN-filled buffer (bf16) and an e4m3 buffer of 0xFF bytes (NaN)."""
    seed("cand_reduce_out")
    ttp = _routing_for(9001, 6, dense=False)
    slots = int(ttp.max()) + 1
    for dtype, fp8 in ((torch.bfloat16, ""), (torch.float32, "e4m3")):
        x = torch.randn((slots, 3072), device="cuda").to(dtype)
        w = torch.rand(ttp.shape, device="cuda")
        want = ref.reduce_fused(x, w, ttp, fp8, None)
        buf = torch.empty_like(want)
        if fp8:
            buf.view(torch.uint8).fill_(0xFF)
        else:
            buf.fill_(float("nan"))
        assert launch(CANDIDATE, x, w, ttp, fp8, None, out=buf) is buf
        assert_bits_equal(buf, want, f"out= {dtype} fp8={fp8!r}")
