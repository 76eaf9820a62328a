"""tilebin.ops.quant per-channel casts on the GPU: bit-exact against quant_ref (tile_kernels.torch
semantics), cast-back error, every output element written.

Ops: per_channel_cast, per_channel_cast_fused (plain bf16/fp32, quantized e4m3 + (1, 128) sf,
with and without pos_to_token, -1 padding), per_channel_cast_and_transpose (32 / 128 tokens per
scale).  Axes covered: token counts 0, 1, odd (4001, 33), partial tiles, >= 8001; every hidden
size of {576, 2048, 2560, 3072, 4096, 6144, 7168}; round_sf on and off; input dtypes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import quant_ref  # noqa: E402
from quant_ref import per_channel as ref  # noqa: E402

pytestmark = pytest.mark.gpu
HIDDENS = (576, 2048, 2560, 3072, 4096, 6144, 7168)
E4M3 = torch.float8_e4m3fn
FUSED, TRANSPOSE = "quant.per_channel_cast_fused", "quant.per_channel_cast_and_transpose"


@pytest.fixture(scope="module")
def ops():
    from tilebin.ops import quant

    return quant


def _poison_pool(*shapes_dtypes) -> None:
    """Hand blocks of the outputs' sizes, filled with 0xFF, back to torch's caching allocator, so
    the op's torch.empty outputs most likely start as poison (NaN in e4m3 and fp32)."""
    blocks = [torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in shapes_dtypes]
    for b in blocks:
        quant_ref.poison_(b)
    del blocks


def _check_pair(got, want, desc: str) -> None:
    out, out_sf = got
    out_ref, sf_ref = want
    quant_ref.assert_equal(out, out_ref, f"out ({desc})")
    quant_ref.assert_equal(out_sf, sf_ref, f"out_sf ({desc})")
    if out.numel():
        quant_ref.assert_all_written(out, f"out ({desc})")
        quant_ref.assert_all_written(out_sf, f"out_sf ({desc})")


def _check_cast_back(out, out_sf, source32, num_per_tokens: int, desc: str) -> None:
    """Dequantized result vs the fp32 source it was cast from: calc_diff <= 1e-3 (e4m3)."""
    if out.numel() == 0:
        return
    back = quant_ref.cast_back((out, out_sf), "fp32", (num_per_tokens, 1))
    diff = quant_ref.calc_diff(back, source32)
    assert diff <= 1e-3, f"{desc}: cast-back calc_diff {diff:.3e} > 1e-3"


def _input(rng, tokens: int, hidden: int, dtype) -> torch.Tensor:
    return rng.normal((tokens, hidden), dtype, scale=3.0)


def _quantized_input(rng, tokens: int, hidden: int):
    """An e4m3 (data, sf) pair with one scale per token and 128 channels (per_token_cast's output)."""
    x = _input(rng, tokens, hidden, torch.bfloat16)
    return quant_ref.cast(x, "e4m3", block_size=(1, 128))


def _moe_positions(rng, tokens: int, experts: int, topk: int, align: int = 128) -> torch.Tensor:
    """pos_to_token like a MoE expand: per expert the tokens routed to it, padded with -1 to a
    multiple of ``align``."""
    scores = torch.rand((tokens, experts), device="cuda", generator=rng.gen)
    chosen = scores.topk(min(topk, experts), dim=1).indices
    parts = []
    for e in range(experts):
        toks = (chosen == e).any(dim=1).nonzero().reshape(-1).to(torch.int32)
        parts += [toks, torch.full(((-toks.numel()) % align,), -1, dtype=torch.int32, device="cuda")]
    return torch.cat(parts)


# ------------------------------------------------------------------------------ per_channel_cast
CAST_CASES = (
    # every hidden at an odd token count (partial last block), round_sf alternating
    [(4001, h, torch.bfloat16, i % 2 == 1) for i, h in enumerate(HIDDENS)]
    + [
        (0, 7168, torch.bfloat16, False), (0, 576, torch.float32, True),
        (1, 576, torch.bfloat16, True), (1, 7168, torch.float32, False),
        (16, 2560, torch.bfloat16, False), (128, 2048, torch.float32, True), (300, 3072, torch.float32, False),
        (4001, 576, torch.float32, True), (4001, 6144, torch.float32, False),
        (8001, 7168, torch.bfloat16, True), (8192, 7168, torch.bfloat16, False),
        (8001, 4096, torch.float32, False), (8192, 2048, torch.float32, True),
    ]
)


def _id(case) -> str:
    return "-".join(str(v).removeprefix("torch.") if not isinstance(v, bool) else ("round" if v else "exact")
                    for v in case)


@pytest.mark.parametrize("case", CAST_CASES, ids=_id)
def test_per_channel_cast(ops, rng, case):
    tokens, hidden, dtype, round_sf = case
    desc = f"per_channel_cast x={tokens}x{hidden} {dtype} round_sf={round_sf} seed={rng.seed}"
    x = _input(rng, tokens, hidden, dtype)
    want = ref.per_channel_cast(x, 128, round_sf)
    _poison_pool((want[0].shape, E4M3), (want[1].shape, torch.float32))
    got = ops.per_channel_cast(x, "e4m3", 128, round_sf)
    torch.cuda.synchronize()
    _check_pair(got, want, desc)
    _check_cast_back(*got, x.float(), 128, desc)
    if tokens >= 4001:
        quant_ref.check_bias(quant_ref.cast_back(got, "fp32", (128, 1)), x.float())


@pytest.mark.parametrize("round_sf", [False, True], ids=["exact", "round"])
def test_per_channel_cast_special_values(ops, rng, round_sf):
    """Columns of zeros, -0.0, tiny and huge magnitudes (e4m3 subnormals, clamped amax)."""
    tokens, hidden = 300, 576
    x = _input(rng, tokens, hidden, torch.float32)
    col_scale = torch.pow(10.0, torch.linspace(-12, 30, hidden, device="cuda"))
    x = x * col_scale
    x[:, 0] = 0.0
    x[:, 1] = -0.0
    x[5, 2] = 1e-30
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        desc = f"special values {dtype} round_sf={round_sf}"
        _check_pair(ops.per_channel_cast(xd, "e4m3", 128, round_sf), ref.per_channel_cast(xd, 128, round_sf), desc)


# ------------------------------------------------------------------------ per_channel_cast_fused
FUSED_PLAIN = [
    (4001, 2048, torch.bfloat16, False), (257, 576, torch.float32, True), (0, 4096, torch.bfloat16, True),
]


@pytest.mark.parametrize("case", FUSED_PLAIN, ids=_id)
def test_fused_plain(ops, rng, case):
    tokens, hidden, dtype, round_sf = case
    desc = f"per_channel_cast_fused plain x={tokens}x{hidden} {dtype} round_sf={round_sf} seed={rng.seed}"
    x = _input(rng, tokens, hidden, dtype)
    got = ops.per_channel_cast_fused(x, "e4m3", 128, round_sf)
    _check_pair(got, ref.per_channel_cast_fused(x, 128, None, round_sf, None), desc)


FUSED_QUANTIZED = [
    (4001, 7168, False), (4001, 576, True), (1, 2048, False), (0, 4096, True), (129, 2560, False),
    (8192, 4096, True), (8001, 3072, False), (1000, 6144, True),
]


@pytest.mark.parametrize("case", FUSED_QUANTIZED, ids=_id)
def test_fused_quantized_input(ops, rng, case):
    tokens, hidden, round_sf = case
    desc = f"per_channel_cast_fused e4m3 input {tokens}x{hidden} round_sf={round_sf} seed={rng.seed}"
    xq = _quantized_input(rng, tokens, hidden)
    want = ref.per_channel_cast_fused(xq, 128, 128, round_sf, None)
    _poison_pool((want[0].shape, E4M3), (want[1].shape, torch.float32))
    got = ops.per_channel_cast_fused(xq, "e4m3", 128, round_sf, num_per_channels=128)
    torch.cuda.synchronize()
    _check_pair(got, want, desc)
    _check_cast_back(*got, quant_ref.dequantize(xq, (1, 128)), 128, desc)


# (tokens, hidden, experts, topk, input kind, round_sf)
EXPAND_CASES = [
    (1000, 7168, 16, 6, "bf16", False), (1000, 7168, 16, 6, "e4m3", True),
    (4001, 576, 8, 2, "fp32", True), (4001, 576, 8, 2, "e4m3", False),
    (3, 2048, 4, 2, "bf16", True), (777, 2560, 32, 8, "e4m3", True),
    (2048, 4096, 32, 8, "bf16", False), (513, 3072, 8, 4, "fp32", False), (300, 6144, 16, 4, "e4m3", False),
]


def _expand_input(rng, kind: str, tokens: int, hidden: int):
    if kind == "e4m3":
        return _quantized_input(rng, tokens, hidden), 128
    return _input(rng, tokens, hidden, torch.bfloat16 if kind == "bf16" else torch.float32), None


@pytest.mark.parametrize("case", EXPAND_CASES, ids=_id)
def test_fused_expand(ops, rng, case):
    tokens, hidden, experts, topk, kind, round_sf = case
    x, npc = _expand_input(rng, kind, tokens, hidden)
    pos = _moe_positions(rng, tokens, experts, topk)
    desc = (f"per_channel_cast_fused expand {kind} x={tokens}x{hidden} -> {pos.numel()} rows "
            f"({int((pos < 0).sum())} padding) round_sf={round_sf} seed={rng.seed}")
    want = ref.per_channel_cast_fused(x, 128, npc, round_sf, pos)
    _poison_pool((want[0].shape, E4M3), (want[1].shape, torch.float32))
    got = ops.per_channel_cast_fused(x, "e4m3", 128, round_sf, num_per_channels=npc, pos_to_token=pos)
    torch.cuda.synchronize()
    _check_pair(got, want, desc)
    padding = (pos < 0).nonzero().reshape(-1)
    if padding.numel():
        bad = int((got[0].view(torch.uint8)[padding] != 0).sum())
        assert bad == 0, f"{desc}: {bad} bytes of padding rows (pos_to_token == -1) are not zero"


@pytest.mark.parametrize("kind", ["bf16", "fp32", "e4m3"])
@pytest.mark.parametrize("round_sf", [False, True], ids=["exact", "round"])
def test_fused_expand_edge_positions(ops, rng, kind, round_sf):
    """Random positions with duplicates, an odd row count (not a multiple of 16), every position
    padding, positions past the end (zeros, no out-of-bounds read), no positions, no source rows."""
    tokens, hidden = 257, 576
    x, npc = _expand_input(rng, kind, tokens, hidden)
    gen = rng.gen
    cases = {
        "random-4001": torch.randint(-1, tokens, (4001,), device="cuda", dtype=torch.int32, generator=gen),
        "all-padding": torch.full((256,), -1, device="cuda", dtype=torch.int32),
        "past-end": torch.tensor([0, tokens, tokens + 5, 2**31 - 1, -7, tokens - 1, -1], device="cuda",
                                 dtype=torch.int32),
        "one": torch.tensor([tokens - 1], device="cuda", dtype=torch.int32),
        "empty": torch.empty((0,), device="cuda", dtype=torch.int32),
    }
    for name, pos in cases.items():
        desc = f"expand {name} {kind} round_sf={round_sf} seed={rng.seed}"
        got = ops.per_channel_cast_fused(x, "e4m3", 128, round_sf, num_per_channels=npc, pos_to_token=pos)
        _check_pair(got, ref.per_channel_cast_fused(x, 128, npc, round_sf, pos), desc)
    # no source rows at all: every output row is padding
    empty_x, npc = _expand_input(rng, kind, 0, hidden)
    pos = torch.full((130,), -1, device="cuda", dtype=torch.int32)
    got = ops.per_channel_cast_fused(empty_x, "e4m3", 128, round_sf, num_per_channels=npc, pos_to_token=pos)
    _check_pair(got, ref.per_channel_cast_fused(empty_x, 128, npc, round_sf, pos), f"expand from 0 tokens {kind}")


# ----------------------------------------------------------------- per_channel_cast_and_transpose
TRANSPOSE_CASES = (
    [(4001, h, 32 if i % 2 else 128, i % 4 >= 2) for i, h in enumerate(HIDDENS)]
    + [(4096, h, 128 if i % 2 else 32, i % 3 == 0) for i, h in enumerate(HIDDENS)]
    + [
        (0, 576, 128, False), (0, 2048, 32, True), (1, 7168, 32, False), (1, 576, 128, True),
        (33, 2048, 128, True), (64, 576, 32, False), (4000, 2560, 128, True), (4000, 3072, 32, False),
        (8001, 7168, 32, True), (8001, 7168, 128, False), (8192, 7168, 128, True), (8192, 7168, 32, False),
    ]
)


@pytest.mark.parametrize("case", TRANSPOSE_CASES, ids=_id)
def test_per_channel_cast_and_transpose(ops, rng, case):
    tokens, hidden, npt, round_sf = case
    desc = f"per_channel_cast_and_transpose x={tokens}x{hidden} num_per_tokens={npt} round_sf={round_sf} seed={rng.seed}"
    x = _input(rng, tokens, hidden, torch.bfloat16)
    want = ref.per_channel_cast_and_transpose(x, npt, round_sf)
    _poison_pool((want[0].shape, E4M3), (want[1].shape, torch.float32))
    got = ops.per_channel_cast_and_transpose(x, "e4m3", npt, round_sf)
    torch.cuda.synchronize()
    _check_pair(got, want, desc)
    _check_cast_back(got[0].T, got[1], x.float(), npt, desc)


def test_transpose_matches_per_channel_cast(ops, rng):
    """The transposed cast is the plain per-channel cast, transposed (both kernels, 128 tokens)."""
    x = _input(rng, 1000, 2048, torch.bfloat16)
    a_out, a_sf = ops.per_channel_cast_and_transpose(x, "e4m3", 128, True)
    b_out, b_sf = ops.per_channel_cast(x, "e4m3", 128, True)
    quant_ref.assert_equal(a_out, b_out.T.contiguous(), "transpose vs plain: out")
    quant_ref.assert_equal(a_sf, b_sf, "transpose vs plain: out_sf")


def test_kernels_shipped(kernel_names):
    missing = {FUSED, TRANSPOSE} - set(kernel_names)
    assert not missing, f"kernels {sorted(missing)} are not in the installed wheel ({len(kernel_names)} kernels)"
