"""tilebin.ops.quant cast_back / per_token_cast_back (e4m3 and packed e2m1 -> bf16 / fp32) and
unpack_from_e2m1fn_x2 on the GPU: bit-exact against quant_ref.cast_back (tile_kernels.torch
semantics), cast -> cast_back error vs the original (calc_diff: e4m3 <= 1e-3, e2m1 <= 2e-2),
every output element written.

Inputs come from the reference cast (quant_ref.cast), so these tests do not depend on the cast
kernels.  Axes: fmt e4m3/e2m1; out bf16/fp32; sf row-major fp32 (round_sf off/on), column-major
fp32 (off/on), packed UE8M0; blocks (1, 16/32/64/128), (1, hidden), (32, 32), (128, 128),
(128, 1), a token block spanning every token; every hidden size of {576, ..., 7168}; token
counts 0, 1, 33, 4001, 8001; strided sf, non-contiguous / misaligned data (copied by the op).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import quant_ref  # noqa: E402

pytestmark = pytest.mark.gpu
HIDDENS = (576, 2048, 2560, 3072, 4096, 6144, 7168)
OUT = {"bf16": torch.bfloat16, "fp32": torch.float32}
# name -> (use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
LAYOUTS = {
    "row": (False, False, False),
    "row_round": (False, True, False),
    "col": (True, False, False),
    "col_round": (True, True, False),
    "ue8m0": (True, True, True),
}
LIMIT = {"e4m3": 1e-3, "e2m1": 2e-2}


@pytest.fixture(scope="module")
def ops():
    from tilebin.ops import quant

    return quant


@pytest.fixture(autouse=True)
def _need(require):
    require("quant.cast_back")


def _poison_pool(shape, dtype) -> None:
    """Return a 0xFF-filled block of the output's size to torch's caching allocator, so the op's
    torch.empty output most likely starts as poison (NaN in bf16 / fp32)."""
    block = torch.empty(shape, dtype=dtype, device="cuda")
    if block.numel():
        quant_ref.poison_(block)
    del block


def _quantized(rng, tokens: int, hidden: int, fmt: str, block, layout: str, dtype=torch.float32):
    x = rng.normal((tokens, hidden), dtype, scale=2.0)
    col, rnd, packed = LAYOUTS[layout]
    data, sf = quant_ref.cast(x, fmt, block, round_sf=rnd, use_tma_aligned_col_major_sf=col, use_packed_ue8m0=packed)
    return x, data, sf


def _run(ops, data, sf, fmt_out: str, block, per_token: bool = False):
    tokens = data.shape[0]
    hidden = data.shape[1] * (2 if data.dtype == torch.int8 else 1)
    _poison_pool((tokens, hidden), OUT[fmt_out])
    if per_token:
        assert block[0] == 1
        return ops.per_token_cast_back((data, sf), fmt_out, block[1])
    return ops.cast_back((data, sf), fmt_out, block)


def _check(got, data, sf, fmt_out: str, block, desc: str, x=None, fmt: str = "e4m3") -> None:
    want = quant_ref.cast_back((data, sf), fmt_out, block)
    quant_ref.assert_equal(got, want, f"cast_back out ({desc})")
    if got.numel():
        quant_ref.assert_all_written(got, f"cast_back out ({desc})")
    if x is not None and got.numel():
        diff = quant_ref.calc_diff(got.float(), x.float())
        assert diff <= LIMIT[fmt], f"{desc}: cast -> cast_back calc_diff {diff:.3e} > {LIMIT[fmt]:.0e} vs the original"


@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_per_token_every_hidden_and_layout(ops, rng, fmt, layout, hidden):
    """33 tokens (odd), channels per scale 128 and hidden, both output dtypes, both entry points."""
    for npc in (128, hidden):
        x, data, sf = _quantized(rng, 33, hidden, fmt, (1, npc), layout)
        for fmt_out in ("bf16", "fp32"):
            desc = f"{fmt} {layout} (1, {npc}) -> {fmt_out}, 33 x {hidden}, seed {rng.seed}"
            got = _run(ops, data, sf, fmt_out, (1, npc), per_token=(fmt_out == "fp32"))
            _check(got, data, sf, fmt_out, (1, npc), desc, x, fmt)


@pytest.mark.parametrize("tokens", [0, 1, 4001, 8001])
@pytest.mark.parametrize("hidden", [576, 7168])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_token_counts(ops, rng, fmt, hidden, tokens):
    layouts = ("row_round", "ue8m0") if tokens > 1000 else ("row", "col_round", "ue8m0")
    for layout in layouts:
        x, data, sf = _quantized(rng, tokens, hidden, fmt, (1, 128), layout, torch.bfloat16)
        for fmt_out in ("bf16", "fp32"):
            desc = f"{fmt} {layout} (1, 128) -> {fmt_out}, {tokens} x {hidden}, seed {rng.seed}"
            got = _run(ops, data, sf, fmt_out, (1, 128))
            assert got.shape == (tokens, hidden) and got.is_contiguous(), f"{desc}: {got.shape} {got.stride()}"
            _check(got, data, sf, fmt_out, (1, 128), desc, x, fmt)


BLOCKS = [(1, 16), (1, 32), (1, 64), (32, 32), (128, 128), (128, 1), (4096, 128), (1, 2560)]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_block_sizes(ops, rng, fmt, block):
    """Blocks of other casts (per-block, per-channel, MX): 257 tokens x 2560 (partial token block),
    every layout, both output dtypes.  (4096, 128): one token block spanning all 257 tokens."""
    for layout in LAYOUTS:
        x, data, sf = _quantized(rng, 257, 2560, fmt, block, layout)
        for fmt_out in ("bf16", "fp32"):
            desc = f"{fmt} {layout} {block} -> {fmt_out}, 257 x 2560, seed {rng.seed}"
            got = _run(ops, data, sf, fmt_out, block)
            _check(got, data, sf, fmt_out, block, desc, x, fmt)


def test_non_power_of_two_block_spanning_the_dims(ops, rng):
    """(3, 576) on 3 x 576: not powers of two, each spans its whole dimension."""
    x, data, sf = _quantized(rng, 3, 576, "e4m3", (3, 576), "row")
    got = _run(ops, data, sf, "bf16", (3, 576))
    _check(got, data, sf, "bf16", (3, 576), f"(3, 576) block, seed {rng.seed}", x)


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_strided_sf_and_copied_data(ops, rng, fmt):
    """Row-major sf that is a column slice of a wider tensor (runtime row stride); data that is a
    non-contiguous column slice, and data at an odd byte offset (the op copies both)."""
    x, data, sf = _quantized(rng, 100, 2048, fmt, (1, 128), "row")
    wide = torch.full((100, 40), float("nan"), device="cuda")
    wide[:, 3:19] = sf
    sf_view = wide[:, 3:19]
    got = ops.cast_back((data, sf_view), "fp32", (1, 128))
    _check(got, data, sf, "fp32", (1, 128), f"{fmt} strided sf, seed {rng.seed}", x, fmt)
    big = torch.zeros((100, data.shape[1] + 64), dtype=data.dtype, device="cuda")
    big[:, 64:] = data
    got = ops.cast_back((big[:, 64:], sf), "bf16", (1, 128))
    _check(got, data, sf, "bf16", (1, 128), f"{fmt} non-contiguous data, seed {rng.seed}", x, fmt)
    flat = torch.zeros(data.numel() + 1, dtype=data.dtype, device="cuda")
    flat[1:] = data.reshape(-1)
    got = ops.cast_back((flat[1:].view(data.shape), sf), "bf16", (1, 128))
    _check(got, data, sf, "bf16", (1, 128), f"{fmt} misaligned data, seed {rng.seed}", x, fmt)


def test_random_codes_and_scales(ops, rng):
    """Every e4m3 code except NaN, every e2m1 code, random power-of-two and arbitrary scales
    (tiny scales make subnormal products, which must not be flushed)."""
    codes = torch.randint(0, 256, (64, 1024), device="cuda", dtype=torch.int32, generator=rng.gen)
    codes = torch.where((codes & 0x7F) == 0x7F, 0, codes).to(torch.uint8)
    sf = torch.exp2(torch.randint(-140, 40, (64, 8), device="cuda", generator=rng.gen).float())
    sf[::3] *= 1.37
    for data in (codes.view(torch.float8_e4m3fn), codes.view(torch.int8)):
        for fmt_out in ("bf16", "fp32"):
            got = ops.cast_back((data, sf), fmt_out, (1, 128 if data.dtype != torch.int8 else 256))
            want = quant_ref.cast_back((data, sf), fmt_out, (1, 128 if data.dtype != torch.int8 else 256))
            quant_ref.assert_equal(got, want, f"random codes {data.dtype} -> {fmt_out}, seed {rng.seed}")


def test_back_to_back_calls_no_sync(ops, rng):
    """Different shapes and variants queued without syncs; each checked at the end."""
    cases = []
    for i, (fmt, layout, hidden) in enumerate([("e4m3", "row", 576), ("e2m1", "ue8m0", 7168), ("e4m3", "col", 2048)]):
        _, data, sf = _quantized(rng, 50 + i, hidden, fmt, (1, 128), layout)
        cases.append((data, sf, ops.cast_back((data, sf), "bf16", (1, 128))))
    for data, sf, got in cases:
        quant_ref.assert_equal(got, quant_ref.cast_back((data, sf), "bf16", (1, 128)), "queued call")


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_unpack_from_e2m1fn_x2(ops, dtype, out_dtype):
    every = torch.arange(256, device="cuda", dtype=torch.int32).to(torch.uint8).view(dtype)
    for x in (every, every.reshape(4, 8, 8), every.reshape(16, 16)[:, 3:9]):
        got = ops.unpack_from_e2m1fn_x2(x, out_dtype) if out_dtype != torch.float32 else ops.unpack_from_e2m1fn_x2(x)
        want = quant_ref.unpack_e2m1(x, out_dtype)
        quant_ref.assert_equal(got, want, f"unpack_from_e2m1fn_x2 {dtype} -> {out_dtype} shape {tuple(x.shape)}")


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_unpack_kernel_sizes_and_layouts(ops, rng, dtype, out_dtype):
    """quant.unpack_e2m1 (CUDA, fp32/bf16/fp16 out): fresh random bytes at sizes 0, 1, odd (a partial
    last unit), decode and large; strided and misaligned views (copied first); rank 1 and 3.  The
    output's memory is poisoned first (a freed NaN block the allocator hands out again)."""
    shapes = [(0,), (1,), (3,), (5, 0), (0, 7), (1, 1), (3, 7), (4, 3584), (129, 1001), (4096, 3584), (2, 3, 5)]
    for shape in shapes:
        x = torch.randint(0, 256, shape, device="cuda", dtype=torch.int32, generator=rng.gen).to(torch.uint8).view(dtype)
        poison = torch.full((max(x.numel(), 1) * 2 + 64,), float("nan"), device="cuda", dtype=out_dtype)
        del poison
        quant_ref.assert_equal(ops.unpack_from_e2m1fn_x2(x, out_dtype), quant_ref.unpack_e2m1(x, out_dtype),
                               f"unpack {dtype} -> {out_dtype} shape {shape}, seed {rng.seed}")
    base = torch.randint(0, 256, (65, 66), device="cuda", dtype=torch.int32, generator=rng.gen).to(torch.uint8).view(dtype)
    for view in (base[1:], base[:, 1:], base.t(), base.reshape(-1)[3:1000]):  # misaligned and strided
        quant_ref.assert_equal(ops.unpack_from_e2m1fn_x2(view, out_dtype), quant_ref.unpack_e2m1(view, out_dtype),
                               f"unpack view {tuple(view.shape)} strides {view.stride()}")


def test_unpack_past_the_kernel_limit_takes_torch_ops(ops, rng, monkeypatch):
    """x with more bytes than the kernel indexes (UNPACK_KERNEL_MAX_BYTES, lowered here to keep the
    test small) is decoded by the torch path, with the same bits; smaller x still by the kernel."""
    from tilebin.ops.quant import _cast_back

    monkeypatch.setattr(_cast_back, "UNPACK_KERNEL_MAX_BYTES", 600)
    for shape in ((3, 200), (3, 201), (2, 150)):  # 600 bytes: the kernel; 603: torch; 300: the kernel
        x = torch.randint(0, 256, shape, device="cuda", dtype=torch.int32, generator=rng.gen).to(torch.uint8)
        for out_dtype in (torch.float32, torch.bfloat16):
            quant_ref.assert_equal(ops.unpack_from_e2m1fn_x2(x, out_dtype), quant_ref.unpack_e2m1(x, out_dtype),
                                   f"unpack {shape} -> {out_dtype} around the kernel limit")
