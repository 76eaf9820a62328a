"""GPU tests of ``tilebin.ops.moe.reduce_fused`` and ``expand_to_fused_with_sf`` at the sizes their
kernels' designs single out, bit for bit against ``moe_ref.routing`` with poisoned outputs.

reduce_fused runs ``moe.reduce_fused_few_tokens`` below ``_REDUCE_SPLIT_TOKENS`` (1024) tokens and
``moe.reduce_fused`` from there on; most tests force each of the two at every size (the op's split
moved), one calls the op on both sides of the split as shipped.  The shapes: decode batches
(1-128 tokens, 256 experts, top-k 8, hidden 7168: mostly padding slots), hidden sizes that leave
partial blocks / chunks, top-k wider than reduce_fused_few_tokens' batch of 8 and than a warp,
empty inputs, slots past the tokens, and the benchmark's large shapes.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed, topk_idx
from moe_ref import routing as ref

REDUCE_KERNELS = ("moe.reduce_fused", "moe.reduce_fused_few_tokens")
DECODE = (1, 4, 16, 64, 128)


@pytest.fixture(scope="module")
def moe(require):
    return load_moe_ops(require, ("get_fused_mapping", "expand_to_fused_with_sf", "reduce_fused"),
                        "ops/moe/_routing.py")


@pytest.fixture(params=[(REDUCE_KERNELS[0], 0), (REDUCE_KERNELS[1], 1 << 40)], ids=("reduce_fused", "few_tokens"))
def reduce_kernel(request, require, monkeypatch):
    """Which kernel reduce_fused launches, at every token count (the op's _REDUCE_SPLIT_TOKENS moved:
    0 forces moe.reduce_fused, 2**40 moe.reduce_fused_few_tokens; _PAIRED_ROW_BYTES -1 keeps
    moe.reduce_fused_paired out, tests/gpu/test_gpu_moe_reduce_paired.py covers it); the op's memo of
    validated calls starts empty."""
    from tilebin.ops.moe import _routing

    name, split = request.param
    for kernel in REDUCE_KERNELS:
        require(kernel)
    monkeypatch.setattr(_routing, "_REDUCE_SPLIT_TOKENS", split)
    monkeypatch.setattr(_routing, "_PAIRED_ROW_BYTES", -1)
    monkeypatch.setattr(_routing.REDUCE_FUSED, "memo", {})
    return name


# ---------------------------------------------------------------- reduce_fused
def _reduce_check(moe, x, w, x_sf, ttp, fp8: str, sf, what: str) -> None:
    """One call (and, without sf, one into a caller's buffer) against the reference, bit for bit."""
    x_in = (x, x_sf) if x_sf is not None else x
    what = (f"{what}: reduce_fused({tuple(x.shape)} {x.dtype}, ttp {tuple(ttp.shape)}, fp8={fp8!r}, "
            f"weights={w is not None}, x_sf={x_sf is not None}, sf={sf is not None})")
    want = ref.reduce_fused(x_in, w, ttp, fp8, sf)
    poison_cache(2 * want.numel() * 4)
    got = moe.reduce_fused(x_in, w, ttp, fp8, sf)
    assert_bits_equal(got, want, what)
    if sf is None and want.numel():
        buf = torch.full_like(want, float("nan")) if want.dtype != torch.float8_e4m3fn else torch.empty_like(want)
        assert moe.reduce_fused(x_in, w, ttp, fp8, None, buf) is buf
        assert_bits_equal(buf, want, what + " out=buf")


def _reduce_inputs(idx, experts: int, alignment: int, hidden: int, dtype):
    """(x, weights, x_sf, token_topk_to_pos) over the fused layout of ``idx``."""
    ttp = ref.get_fused_mapping(idx, experts, 0, alignment)[3]
    slots = int(ttp.max()) + 1 if ttp.numel() else 0
    x = torch.randn((slots, hidden), device="cuda").to(dtype)
    w = torch.rand(idx.shape, device="cuda")
    x_sf = torch.randn((slots,), device="cuda")
    return x, w, x_sf, ttp


@pytest.mark.parametrize("tokens", DECODE)
def test_reduce_fused_decode(moe, reduce_kernel, tokens):
    """DeepSeek-V3 decode: 256 experts, top-k 8, hidden 7168, every output kind."""
    seed("cand_reduce_decode", tokens)
    idx = topk_idx(tokens, 8, 256, 1)
    for dtype in (torch.bfloat16, torch.float32):
        x, w, x_sf, ttp = _reduce_inputs(idx, 256, 16, 7168, dtype)
        _reduce_check(moe, x, w, None, ttp, "", None, "decode")
        _reduce_check(moe, x, w, x_sf, ttp, "", None, "decode")
        _reduce_check(moe, x, None, None, ttp, "e4m3", torch.rand((1,), device="cuda") + 0.5, "decode")


@pytest.mark.parametrize("hidden", [8, 16, 24, 576, 1000, 1024, 1032, 2056, 7168, 7176])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_reduce_fused_partial_blocks(moe, reduce_kernel, hidden, dtype):
    """Hidden sizes that end inside a block (1024 channels per reduce_fused_few_tokens block) or a vector pair."""
    seed("cand_reduce_hidden", hidden, str(dtype))
    idx = topk_idx(37, 6, 72, 1)
    x, w, x_sf, ttp = _reduce_inputs(idx, 72, 1, hidden, dtype)
    _reduce_check(moe, x, w, x_sf, ttp, "", None, "partial")
    _reduce_check(moe, x, w, None, ttp, "e4m3", torch.randn((1,), device="cuda") * 4, "partial")


@pytest.mark.parametrize("topk", [1, 2, 7, 8, 9, 16, 17, 40])
def test_reduce_fused_topk(moe, reduce_kernel, topk):
    """Top-k around and past reduce_fused_few_tokens' batch of 8 (later batches keep the FMA order), with
    missing slots (-1: experts of other EP ranks)."""
    seed("cand_reduce_topk", topk)
    idx = topk_idx(61, topk, 48, 2)
    for dtype in (torch.bfloat16, torch.float32):
        x, w, x_sf, ttp = _reduce_inputs(idx, 48, 4, 2048, dtype)
        _reduce_check(moe, x, w, x_sf, ttp, "", None, f"topk {topk}")
        _reduce_check(moe, x, None, None, ttp, "", None, f"topk {topk}")


@pytest.mark.parametrize("tokens, topk, hidden", [(600, 9, 7168), (1100, 6, 3080), (1600, 17, 2048),
                                                  (4000, 8, 7168), (9000, 3, 1032)])
def test_reduce_fused_chunk_loop(moe, reduce_kernel, tokens, topk, hidden):
    """Hundreds to thousands of tokens (each kernel forced on either side of the op's split), hidden sizes
    ending inside a block, top-k in one batch of 8 or several."""
    seed("cand_reduce_chunks", tokens, topk, hidden)
    idx = topk_idx(tokens, topk, 64, 1)
    for dtype in (torch.bfloat16, torch.float32):
        x, w, x_sf, ttp = _reduce_inputs(idx, 64, 8, hidden, dtype)
        _reduce_check(moe, x, w, x_sf, ttp, "", None, "chunks")
        _reduce_check(moe, x, None, None, ttp, "e4m3", torch.rand((1,), device="cuda") + 0.5, "chunks")


@pytest.mark.parametrize("tokens", [1023, 1024, 1100])
def test_reduce_fused_split_by_tokens(moe, require, monkeypatch, tokens):
    """The op as shipped: moe.reduce_fused_few_tokens below _REDUCE_SPLIT_TOKENS tokens,
    moe.reduce_fused from there on; same bits either side."""
    from tilebin.ops.moe import _routing

    require(REDUCE_KERNELS[1])
    monkeypatch.setattr(_routing.REDUCE_FUSED, "memo", {})
    seed("cand_reduce_split", tokens)
    idx = topk_idx(tokens, 8, 256, 1)[:tokens]
    x, w, _, ttp = _reduce_inputs(idx, 256, 16, 7168, torch.bfloat16)
    for _ in range(2):  # the validating call, then the memoized one
        _reduce_check(moe, x, w, None, ttp, "", None, "split")


def test_reduce_fused_empty_and_single(moe, reduce_kernel):
    """0 tokens (nothing launched) and 1 token with a single valid slot."""
    seed("cand_reduce_small")
    for tokens in (0, 1):
        idx = topk_idx(tokens, 4, 8, 4) if tokens else torch.empty((0, 4), dtype=torch.int64, device="cuda")
        x, w, x_sf, ttp = _reduce_inputs(idx, 8, 1, 7168, torch.bfloat16)
        _reduce_check(moe, x, w, x_sf, ttp, "", None, f"{tokens} tokens")


@pytest.mark.parametrize("hidden, dtype", [(2048, torch.bfloat16), (3072, torch.float32), (7168, torch.float32)],
                         ids=["2048-bf16", "3072-f32", "7168-f32"])
def test_reduce_fused_bench_shapes(moe, reduce_kernel, hidden, dtype):
    """compare_peer's large shapes: 4001 tokens x 8 EP ranks, top-k 6, e4m3 out with sf."""
    seed("cand_reduce_big", hidden, str(dtype))
    idx = topk_idx(4001, 6, 32, 8)
    x, w, x_sf, ttp = _reduce_inputs(idx, 32, 16, hidden, dtype)
    _reduce_check(moe, x, w, None, ttp, "e4m3", torch.rand((1,), device="cuda") + 0.5, "bench")
    _reduce_check(moe, x, w, x_sf, ttp, "", None, "bench")


def test_reduce_fused_saturates_e4m3(moe, reduce_kernel):
    seed("cand_reduce_sat")
    idx = topk_idx(300, 8, 32, 8)
    x, _, _, ttp = _reduce_inputs(idx, 32, 1, 2048, torch.float32)
    _reduce_check(moe, x * 300, None, None, ttp, "e4m3", None, "saturating")


# ---------------------------------------------------------------- expand_to_fused_with_sf
def _expand_check(moe, idx, experts: int, alignment: int, hidden: int, npc: int, layout: str,
                  dtype=torch.float8_e4m3fn, slots: int = 0) -> None:
    """One call against the reference (``slots``: a fixed slot count, padding past the tokens)."""
    p2e, _, _, ttp, *_ = ref.get_fused_mapping(idx, experts, slots, alignment)
    rows = idx.shape[0]
    if dtype == torch.float8_e4m3fn:
        bits = torch.randint(0, 256, (rows, hidden), dtype=torch.uint8, device="cuda")
        bits[(bits & 0x7F) == 0x7F] = 0x38  # no NaN patterns
        x = bits.view(torch.float8_e4m3fn)
    else:
        x = torch.randn((rows, hidden), device="cuda").to(dtype)
    groups = -(-hidden // npc)
    if layout == "ue8m0":
        sf = torch.randint(-2**31, 2**31 - 1, (rows, -(-groups // 4)), dtype=torch.int32, device="cuda")
    else:
        sf = torch.rand((rows, groups), device="cuda") + 0.5
    col = layout != "row"
    poison_cache(p2e.numel() * hidden * 2 + (1 << 22))
    out, out_sf = moe.expand_to_fused_with_sf((x, sf), npc, ttp, p2e, col)
    want, want_sf = ref.expand_to_fused_with_sf((x, sf), npc, ttp, p2e, col)
    what = (f"expand_to_fused_with_sf({tuple(x.shape)} {dtype}, sf {tuple(sf.shape)} {layout}, npc={npc}, "
            f"topk={idx.shape[1]}, slots={p2e.numel()})")
    assert_bits_equal(out, want, what + " out")
    assert out_sf.stride() == want_sf.stride() or out_sf.numel() == 0 or out_sf.shape[0] == 1, (
        f"{what} out_sf strides {out_sf.stride()}, want {want_sf.stride()}")
    assert_bits_equal(out_sf, want_sf, what + " out_sf")


@pytest.mark.parametrize("layout", ["row", "col", "ue8m0"])
@pytest.mark.parametrize("tokens", DECODE)
def test_expand_sf_decode(moe, tokens, layout):
    """Decode: 256 experts, top-k 8, alignment 16 (mostly padding slots), hidden 7168, 1x128 and 1x32."""
    seed("cand_expand_decode", tokens, layout)
    idx = topk_idx(tokens, 8, 256, 1)
    _expand_check(moe, idx, 256, 16, 7168, 128, layout)
    _expand_check(moe, idx, 256, 16, 7168, 32, layout)


@pytest.mark.parametrize("topk", [2, 6, 8, 9])
def test_expand_sf_bench_shapes(moe, topk):
    """compare_peer's shapes: 4001 tokens x 8 EP ranks, 32 experts, alignment 128, hidden 3072."""
    seed("cand_expand_big", topk)
    _expand_check(moe, topk_idx(4001, topk, 32, 8), 32, 128, 3072, 128, "row")


@pytest.mark.parametrize("hidden", [16, 576, 1040, 4096, 8192, 8208, 9216])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16], ids=str)
def test_expand_sf_hidden(moe, hidden, dtype):
    """Rows shorter than a block's vectors, ending inside a chunk, and past one chunk of 8 vectors
    per thread (e4m3 > 8192, bf16 > 4096 channels); scale rows longer than a block (1x32)."""
    seed("cand_expand_hidden", hidden, str(dtype))
    idx = topk_idx(37, 6, 16, 2)
    _expand_check(moe, idx, 16, 8, hidden, 32, "row", dtype)
    _expand_check(moe, idx, 16, 8, hidden, 128, "col", dtype)


@pytest.mark.parametrize("tokens, topk, slots", [(0, 4, 0), (0, 4, 77), (1, 1, 0), (1, 9, 300), (5, 40, 0),
                                                 (33, 33, 0), (3, 2, 1000),
                                                 (3, 2, 8191), (3, 2, 8192), (700, 3, 9001)])
def test_expand_sf_edges(moe, tokens, topk, slots):
    """Empty inputs, slots past the tokens (blocks that only zero-fill), top-k wider than a warp."""
    seed("cand_expand_edges", tokens, topk, slots)
    if tokens:
        idx = topk_idx(tokens, topk, 64, 1)
    else:
        idx = torch.empty((0, topk), dtype=torch.int64, device="cuda")
    _expand_check(moe, idx, 64, 4, 576, 32, "row", slots=slots)
    _expand_check(moe, idx, 64, 4, 7168, 128, "ue8m0", slots=slots)
