"""tilebin.ops.quant E5M6: per_token_cast(x, 'e5m6', hidden, ...) and cast_back /
per_token_cast_back with x_special_fmt='e5m6', on the GPU.  Bit-exact against quant_ref
(cast_to_e5m6 / cast_back_from_e5m6, the tile_kernels.torch semantics); cast -> cast_back error
vs the original (calc_diff < 1e-4 random, < 5e-6 for the special-value inputs, as tile_kernels'
tests); every output element written.

Axes: input bf16 / fp32; sf row fp32 (round_sf off / on), column-major fp32 (off / on), packed
UE8M0; every hidden size of {576, ..., 7168} plus 8, 24, 9216 and 16384 (rows longer than the
kernel keeps in registers); token counts 0, 1, 3, 4001, 8001; inputs: normal, values spread over
60 binades (E5M6 subnormals and underflow), the E5M6 special values, zero rows; strided x.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import quant_ref  # noqa: E402

pytestmark = pytest.mark.gpu
HIDDENS = (576, 2048, 2560, 3072, 4096, 6144, 7168)
# name -> (use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
LAYOUTS = {
    "row": (False, False, False),
    "row_round": (False, True, False),
    "col": (True, False, False),
    "col_round": (True, True, False),
    "ue8m0": (True, True, True),
}
SPECIAL = (2.0**-20, 2.0**-14 * 63 / 64, 2.0**-14)  # min subnormal, max subnormal, min normal
OUT = {"bf16": torch.bfloat16, "fp32": torch.float32}


@pytest.fixture(scope="module")
def ops():
    from tilebin.ops import quant

    return quant


@pytest.fixture(autouse=True)
def _need(require):
    require("quant.per_token_cast_e5m6")
    require("quant.cast_back_e5m6")


def _poison_pool(*shapes_dtypes) -> None:
    """Hand 0xFF-filled blocks of the outputs' sizes back to torch's caching allocator, so the op's
    torch.empty outputs most likely start as poison."""
    blocks = [torch.empty(s, dtype=d, device="cuda") for s, d in shapes_dtypes]
    for b in blocks:
        if b.numel():
            quant_ref.poison_(b)
    del blocks


def _inputs(rng, tokens: int, hidden: int, dtype, kind: str) -> torch.Tensor:
    if kind == "normal":
        return rng.normal((tokens, hidden), dtype)
    if kind == "spread":  # each element scaled by 2**k, k in [-30, 30): subnormal codes, underflow
        k = torch.randint(-30, 30, (tokens, hidden), device="cuda", generator=rng.gen).float()
        x = rng.normal((tokens, hidden), torch.float32) * torch.exp2(k)
        if tokens:
            x[::7] = 0.0  # zero rows: amax clamped to 1e-4
            x[1::5, ::3] = -0.0
        return x.to(dtype)
    value = SPECIAL[int(kind[-1])]
    x = torch.full((tokens, hidden), value, dtype=dtype, device="cuda")
    x[:, -1] = 65024.0
    return x


def _cast(ops, x, layout: str):
    col, rnd, packed = LAYOUTS[layout]
    tokens, hidden = x.shape
    _poison_pool(((tokens, hidden * 3 // 2), torch.uint8), ((tokens, 4), torch.float32))
    got = ops.per_token_cast(x, "e5m6", hidden, use_tma_aligned_col_major_sf=col, round_sf=rnd, use_packed_ue8m0=packed)
    want = quant_ref.cast_to_e5m6(x, hidden, use_tma_aligned_col_major_sf=col, round_sf=rnd, use_packed_ue8m0=packed)
    return got, want


def _check_cast(got, want, desc: str) -> None:
    (data, sf), (data_ref, sf_ref) = got, want
    quant_ref.assert_equal(data, data_ref, f"e5m6 data ({desc})")
    quant_ref.assert_equal(sf, sf_ref, f"e5m6 sf ({desc})")
    if sf.numel():
        quant_ref.assert_all_written(sf, f"e5m6 sf ({desc})")


def _check_back(ops, x, data, sf, fmt_out: str, limit, desc: str) -> None:
    tokens, hidden = x.shape
    _poison_pool(((tokens, hidden), OUT[fmt_out]))
    if fmt_out == "bf16":
        got = ops.cast_back((data, sf), fmt_out, (1, hidden), x_special_fmt="e5m6")
    else:
        got = ops.per_token_cast_back((data, sf), fmt_out, hidden, x_special_fmt="e5m6")
    want = quant_ref.cast_back_from_e5m6((data, sf), fmt_out, (1, hidden))
    quant_ref.assert_equal(got, want, f"e5m6 cast_back -> {fmt_out} ({desc})")
    if got.numel():
        quant_ref.assert_all_written(got, f"e5m6 cast_back -> {fmt_out} ({desc})")
    if got.numel() and limit is not None:
        diff = quant_ref.calc_diff(got.float(), x.float())
        assert diff < limit, f"{desc}: cast -> cast_back calc_diff {diff:.3e} >= {limit:.0e} vs the original"


@pytest.mark.parametrize("hidden", HIDDENS + (8, 24, 9216, 16384))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_every_hidden_layout_and_input(ops, rng, dtype, hidden):
    """37 tokens (odd; 4 tokens per block leave a partial block), every layout and input kind."""
    for i, layout in enumerate(LAYOUTS):
        for kind in ("normal", "spread", f"special{i % 3}"):
            x = _inputs(rng, 37, hidden, dtype, kind)
            desc = f"{dtype} {layout} {kind}, 37 x {hidden}, seed {rng.seed}"
            got, want = _cast(ops, x, layout)
            _check_cast(got, want, desc)
            # spread values lose precision by design (E5M6 subnormals): bit-exact check only
            limit = {"normal": 1e-4, "spread": None}.get(kind, 5e-6)
            _check_back(ops, x, *got, "bf16" if i % 2 else "fp32", limit, desc)


@pytest.mark.parametrize("tokens", [0, 1, 3, 4001, 8001])
@pytest.mark.parametrize("hidden", [576, 4096, 7168])
def test_token_counts(ops, rng, hidden, tokens):
    layouts = ("row_round", "ue8m0") if tokens > 1000 else tuple(LAYOUTS)
    for layout in layouts:
        for dtype in (torch.bfloat16, torch.float32):
            x = _inputs(rng, tokens, hidden, dtype, "normal")
            desc = f"{dtype} {layout}, {tokens} x {hidden}, seed {rng.seed}"
            got, want = _cast(ops, x, layout)
            _check_cast(got, want, desc)
            for fmt_out in ("bf16", "fp32"):
                _check_back(ops, x, *got, fmt_out, 1e-4, desc)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_strided_input(ops, rng, dtype):
    """x as a column slice of a wider tensor: an aligned row stride (read in place) and an odd
    one (copied by the op); a single row with a huge stride."""
    for pad in (64, 3):
        big = rng.normal((101, 2048 + pad), dtype)
        x = big[:, pad:]
        got, want = _cast(ops, x, "col_round")
        _check_cast(got, want, f"{dtype} row stride {x.stride(0)}, offset {pad}, seed {rng.seed}")
    x = rng.normal((2, 576), dtype)[1:]
    got, want = _cast(ops, x, "row")
    _check_cast(got, want, f"{dtype} one row at offset 576, seed {rng.seed}")


@pytest.mark.parametrize("block", [(1, 4), (32, 64), (128, 128), (1, 2048), (4096, 8)], ids=str)
@pytest.mark.parametrize("sf_layout", ["row", "col", "ue8m0"])
def test_cast_back_other_blocks(ops, rng, block, sf_layout):
    """cast_back from E5M6 with scales of other blocks (random finite codes, random scales):
    exercises per-value scales (channels per scale < 8) and token blocks."""
    tokens, hidden = 300, 2048
    codes = torch.randint(0, 4096, (tokens, hidden), device="cuda", generator=rng.gen, dtype=torch.int32)
    codes = torch.where(((codes >> 6) & 31) == 31, codes & 0x83F, codes)  # no inf / NaN codes
    data = quant_ref.pack_e5m6(codes)
    m, k = -(-tokens // block[0]), hidden // block[1]
    if sf_layout == "ue8m0":
        raw = torch.randint(100, 150, (m, -(-k // 4) * 4), device="cuda", generator=rng.gen).to(torch.uint8)
        sf = torch.zeros((-(-k // 4), -(-m // 4) * 4), dtype=torch.int32, device="cuda")
        sf[:, :m] = raw.view(torch.int32).T
        sf = sf.T[:m]
    else:
        sf = torch.exp2(torch.randint(-20, 20, (m, k), device="cuda", generator=rng.gen).float()) * 1.3
        if sf_layout == "col":
            sf = sf.T.contiguous().T
    for fmt_out in ("bf16", "fp32"):
        got = ops.cast_back((data, sf), fmt_out, block, x_special_fmt="e5m6")
        want = quant_ref.cast_back_from_e5m6((data, sf), fmt_out, block)
        quant_ref.assert_equal(got, want, f"e5m6 cast_back {block} {sf_layout} -> {fmt_out}, seed {rng.seed}")
