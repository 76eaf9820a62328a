"""CPU tests of the quantization torch references (tests/quant_ref): the references every GPU quant
test compares against must themselves be right, so their formats, rounding, scale factors and
layouts are checked here from first principles (hand-computed values, not other references)."""

import math

import pytest
import torch

import quant_ref as q

E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# ------------------------------------------------------------------------------------- e2m1
def test_e2m1_every_code_decodes_to_table_and_reencodes():
    codes = torch.arange(16, dtype=torch.uint8)
    packed = q.pack_e2m1(codes)
    decoded = q.unpack_e2m1(packed)
    expected = _f32(E2M1_TABLE + [-v for v in E2M1_TABLE])
    q.assert_equal(decoded, expected)  # bitwise: code 8 is -0.0
    q.assert_equal(q.e2m1_bits(decoded), codes)
    q.assert_equal(q.unpack_e2m1(packed.view(torch.uint8), torch.bfloat16), expected.to(torch.bfloat16))


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (0.25, 0), (0.2500001, 1), (0.75, 2), (0.7499999, 1), (1.25, 2), (1.2500001, 3), (1.75, 4),
        (2.5, 4), (2.5000002, 5), (3.5, 6), (3.4999998, 5), (5.0, 6), (5.0000005, 7), (6.0, 7),
        (6.5, 7), (1e30, 7), (math.inf, 7), (math.nan, 7), (1e-45, 0), (0.0, 0), (0.6, 1), (2.9, 5),
    ],
)
def test_e2m1_round_to_nearest_even_and_saturation(value, code):
    assert q.e2m1_bits(_f32([value])).item() == code
    assert q.e2m1_bits(_f32([-value])).item() == code | 8  # the sign is kept, also for -0 and NaN


def test_e2m1_packing_nibble_order_and_odd_width():
    codes = torch.tensor([[1, 2, 3, 15]], dtype=torch.uint8)
    assert q.pack_e2m1(codes).view(torch.uint8).tolist() == [[0x21, 0xF3]]
    q.assert_equal(q.unpack_e2m1(torch.tensor([[0x21, -13]], dtype=torch.int8)), _f32([[0.5, 1.0, 1.5, -6.0]]))
    with pytest.raises(ValueError):
        q.cast(torch.ones(2, 7), "e2m1", (1, 7))


# ------------------------------------------------------------------------------------- e4m3
def test_e4m3_saturates_at_448_with_precomputed_sf():
    x = _f32([[1000.0, -1000.0, 448.0, 464.0, -470.0, 0.1, math.inf, -0.0]])
    out = q.cast(x, "e4m3", (1, 8), sf=torch.ones(1, 1))
    assert out.dtype == torch.float8_e4m3fn and out.shape == (1, 8)
    got = out.float()[0].tolist()
    assert got[:5] == [448.0, -448.0, 448.0, 448.0, -448.0] and got[6] == 448.0
    assert got[5] == pytest.approx(0.1, rel=2**-4)
    assert out.view(torch.uint8)[0, 7].item() == 0x80  # -0.0 stays negative


def test_e4m3_block_max_maps_to_448_and_sf_is_amax_over_448():
    x = torch.randn(64, 256, generator=_gen(1))
    data, sf = q.cast(x, "e4m3", (32, 128))
    assert sf.shape == (2, 2) and sf.stride() == (2, 1) and sf.dtype == torch.float32
    amax = x.abs().reshape(2, 32, 2, 128).amax(dim=(1, 3))
    q.assert_equal(sf, amax / torch.full_like(amax, 448.0))
    assert data.float().abs().amax().item() == 448.0
    assert data.is_contiguous() and data.shape == x.shape


def test_zero_block_uses_clamp_min():
    data, sf = q.cast(torch.zeros(2, 64), "e4m3", (1, 32))
    assert torch.all(sf == _f32(1e-4) / 448.0) and torch.all(data.float() == 0)
    data, sf = q.cast(torch.zeros(2, 64), "e2m1", (1, 32))
    assert torch.all(sf == _f32(2.0**-126)) and torch.all(data == 0)


# ------------------------------------------------------------------------------- sf layouts
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_round_sf_gives_powers_of_two_at_least_sf(fmt):
    x = torch.randn(40, 192, generator=_gen(2)) * torch.exp2(torch.randint(-20, 20, (40, 1), generator=_gen(3)).float())
    _, plain = q.cast(x, fmt, (1, 32))
    _, rounded = q.cast(x, fmt, (1, 32), round_sf=True)
    mantissa, _ = torch.frexp(rounded)
    assert torch.all(mantissa == 0.5)  # exact powers of two
    assert torch.all(rounded >= plain) and torch.all(rounded < 2 * plain)
    exact = plain == rounded
    assert torch.all(torch.frexp(plain[exact])[0] == 0.5)  # unchanged only when already a power of two


def _known_exponent_input(rows: int, groups: int, bw: int = 32) -> tuple[torch.Tensor, list]:
    """Rows x groups*bw input whose block (r, g) has amax 448 * 2**(g - 3 + r % 2): sf = 2**(...)."""
    x = torch.full((rows, groups * bw), 0.5)
    exps = [[g - 3 + r % 2 for g in range(groups)] for r in range(rows)]
    for r in range(rows):
        for g in range(groups):
            x[r, g * bw + 5] = -448.0 * 2.0 ** exps[r][g]
    return x, exps


@pytest.mark.parametrize("rows", [1, 3, 5, 8])
def test_packed_ue8m0_byte_order_and_layout(rows):
    x, exps = _known_exponent_input(rows, groups=6)
    data, sf = q.cast(x, "e4m3", (1, 32), round_sf=True, use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True)
    pad = -(-rows // 4) * 4
    assert sf.dtype == torch.int32 and sf.shape == (rows, 2)
    assert sf.stride() == (1, pad) or rows == 1
    raw = sf.contiguous().view(torch.uint8).reshape(rows, 8)
    for r in range(rows):
        assert raw[r].tolist() == [127 + e for e in exps[r]] + [0, 0]  # byte g%4 of word g//4
    storage = torch.empty(0, dtype=torch.int32).set_(sf.untyped_storage(), 0, (2, pad), (pad, 1))
    assert torch.all(storage[:, rows:] == 0)  # token padding is zero
    _, row_major = q.cast(x, "e4m3", (1, 32), round_sf=True)
    q.assert_equal(q.sf_to_fp32(sf)[:, :6], row_major, check_stride=False)


@pytest.mark.parametrize("rows", [1, 6, 9])
def test_col_major_fp32_layout(rows):
    x = torch.randn(rows, 320, generator=_gen(rows))
    _, row = q.cast(x, "e2m1", (1, 32))
    _, col = q.cast(x, "e2m1", (1, 32), use_tma_aligned_col_major_sf=True)
    assert col.shape == (rows, 10) and col.stride() == (1, -(-rows // 4) * 4)
    assert row.stride() == (10, 1)
    q.assert_equal(col.contiguous(), row)


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize(("col", "packed"), [(False, False), (True, False), (True, True)])
def test_zero_rows(fmt, col, packed):
    flags = dict(round_sf=True, use_tma_aligned_col_major_sf=col, use_packed_ue8m0=packed)
    data, sf = q.cast(torch.empty(0, 576), fmt, (1, 128), **flags)
    assert data.shape == (0, 288 if fmt == "e2m1" else 576) and data.dtype == q.FMT_DTYPES[fmt]
    assert sf.shape == ((0, 2) if packed else (0, 5)) and sf.dtype == (torch.int32 if packed else torch.float32)
    assert q.cast(torch.empty(0, 576), fmt, (1, 128), sf=torch.ones(0, 5)).shape == data.shape
    assert q.cast_back((data, sf), "bf16", (1, 128)).shape == (0, 576)


# ---------------------------------------------------------------------------- round trips
@pytest.mark.parametrize(("fmt", "limit"), [("e4m3", 1e-3), ("e2m1", 2e-2)])
@pytest.mark.parametrize("block", [(1, 32), (1, 128), (32, 32), (128, 128), (1, 576), (32, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cast_back_error_bounds(fmt, limit, block, dtype):
    rows = 130 if block[0] > 32 else 33  # partial last row block either way
    x = torch.randn(rows, 576, generator=_gen(block[0] * 1000 + block[1])).to(dtype)
    for round_sf in (False, True):
        pair = q.cast(x, fmt, block, round_sf=round_sf)
        for out in ("fp32", "bf16"):
            back = q.cast_back(pair, out, block)
            assert back.dtype == (torch.float32 if out == "fp32" else torch.bfloat16) and back.shape == x.shape
            assert q.calc_diff(back, x) <= limit, (fmt, block, round_sf, out)
        q.check_bias(q.cast_back(pair, "fp32", block), x.float())


def test_precomputed_sf_matches_computed_when_rounded():
    x = torch.randn(100, 256, generator=_gen(5))
    for fmt in ("e4m3", "e2m1"):
        data, sf = q.cast(x, fmt, (1, 64), round_sf=True)
        q.assert_equal(q.cast(x, fmt, (1, 64), sf=sf), data)
        with pytest.raises(ValueError):
            q.cast(x, fmt, (1, 64), sf=sf[:, :3])
        with pytest.raises(ValueError):
            q.cast(x, fmt, (1, 64), sf=sf, use_tma_aligned_col_major_sf=True)


@pytest.mark.parametrize(("in_fmt", "in_block"), [("e4m3", (128, 128)), ("e2m1", (1, 32))])
@pytest.mark.parametrize("out_fmt", ["e4m3", "e2m1"])
def test_quant_tensor_input_recast(in_fmt, in_block, out_fmt):
    x = torch.randn(130, 256, generator=_gen(6))
    col = dict(use_tma_aligned_col_major_sf=True)
    layouts = [dict(), col, dict(col, use_packed_ue8m0=True)]
    expected = None
    for layout in layouts:
        pair = q.cast(x, in_fmt, in_block, round_sf=True, **layout)
        dequant = q.cast_back(pair, "fp32", in_block)
        got = q.cast(pair, out_fmt, (1, 128), x_block_size=in_block, round_sf=True)
        q.assert_equal(got[0], q.cast(dequant, out_fmt, (1, 128), round_sf=True)[0])
        expected = got if expected is None else expected
        q.assert_equal(got[1], expected[1])  # every input sf layout dequantizes identically
        q.assert_equal(got[0], expected[0])
    with pytest.raises(ValueError):
        q.cast(pair, out_fmt, (1, 128))  # x_block_size missing


def test_lossless_recast_e2m1_to_e4m3():
    # e2m1 values times power-of-two sf are exact in e4m3 with 128-wide power-of-two blocks
    x = torch.randn(64, 256, generator=_gen(8))
    pair = q.cast(x, "e2m1", (1, 32), round_sf=True)
    out = q.cast(pair, "e4m3", (1, 128), x_block_size=(1, 32), round_sf=True)
    q.assert_equal(q.cast_back(out, "fp32", (1, 128)), q.cast_back(pair, "fp32", (1, 32)))


# ------------------------------------------------------------------------------------- e5m6
def test_e5m6_codes_and_rounding():
    values = _f32([1.0, -2.0, 65024.0, 2.0**-20, 2.0**-14 * 63 / 64, 2.0**-14, 1 + 2.0**-7, 1 + 3 * 2.0**-7])
    codes = q.e5m6_bits(values).tolist()
    assert codes[:6] == [0x3C0, 0xC00, 0x7BF, 0x001, 0x03F, 0x040]
    assert codes[6] == 0x3C0 and codes[7] == 0x3C2  # ties to even on the 6-bit mantissa
    assert q.e5m6_bits(_f32([math.inf, -math.inf, 0.0, -0.0])).tolist() == [0x7C0, 0xFC0, 0, 0x800]


def test_e5m6_packing_order():
    codes = torch.tensor([[0xABC, 0x123, 0x456, 0x789, 0xDEF, 0x012, 0x345, 0x678]], dtype=torch.int32)
    packed = q.pack_e5m6(codes)
    assert packed.shape == (1, 12) and packed.dtype == torch.uint8
    words = [0xABC12345, 0x6789DEF0, 0x12345678]  # the 96-bit string, code 0 first, in 3 words
    assert packed[0].tolist() == [b for w in words for b in w.to_bytes(4, "little")]
    q.assert_equal(q.e5m6_bits(q.unpack_e5m6(packed)), codes)


@pytest.mark.parametrize("value", [2.0**-20, 2.0**-14 * 63 / 64, 2.0**-14])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_e5m6_special_values_round_trip(value, dtype):
    x = torch.full((3, 576), value, dtype=dtype)
    x[:, -1] = 65024.0
    for flags in [(False, True, False), (True, True, True)]:
        pair = q.cast_to_e5m6(x, 576, *flags)
        q.assert_equal(q.cast_back_from_e5m6(pair, "fp32", (1, 576)), x.float())


@pytest.mark.parametrize("npc", [64, 576])
@pytest.mark.parametrize(
    ("col", "round_sf", "packed"),
    [(False, False, False), (False, True, False), (True, True, True), (False, True, True)],
)
def test_e5m6_round_trip_and_sf_layout(npc, col, round_sf, packed):
    x = torch.randn(33, 576, generator=_gen(npc))
    data, sf = q.cast_to_e5m6(x, npc, col, round_sf, packed)
    assert data.shape == (33, 864) and data.dtype == torch.uint8
    groups = 576 // npc
    assert sf.shape == ((33, -(-groups // 4)) if packed else (33, groups))
    assert sf.dtype == (torch.int32 if packed else torch.float32)
    if col:
        assert sf.stride()[0] == 1 and (sf.shape[1] == 1 or sf.stride()[1] == 36)
    for out in ("fp32", "bf16"):
        back = q.cast_back_from_e5m6((data, sf), out, (1, npc))
        assert q.calc_diff(back, x) < 1e-4
    assert q.cast_to_e5m6(torch.empty(0, 576), npc, col, round_sf, packed)[0].shape == (0, 864)


# ---------------------------------------------------------------------------------- numeric
def test_assert_equal_reports_what_differs():
    x = torch.randn(4, 8, generator=_gen(9))
    y = x.clone()
    y[2, 5] = -0.0 if x[2, 5] == 0 else x[2, 5] * 2
    y[3, 1] = float("nan")
    with pytest.raises(AssertionError, match=r"(?s)2 of 32 elements differ.*\(2, 5\).*\(3, 1\)"):
        q.assert_equal(y, x, "data")
    with pytest.raises(AssertionError, match="dtype"):
        q.assert_equal(x, x.double())
    with pytest.raises(AssertionError, match="strides"):
        q.assert_equal(x.T.contiguous().T, x)
    with pytest.raises(AssertionError, match="1 of 1"):
        q.assert_equal(_f32([0.0]), _f32([-0.0]))
    q.assert_equal(_f32([float("nan")]), -_f32([float("nan")]), any_nan=True)
    q.assert_equal(torch.empty(0, 3).T, torch.empty(3, 0))  # empty: strides not compared
    q.assert_equal(torch.zeros(5, 4).T.contiguous().T[:, :1], torch.zeros(5, 1))  # size-1 dims ignored


def test_calc_diff_and_check_bias():
    x = torch.randn(1000, generator=_gen(10))
    assert q.calc_diff(x, x) == pytest.approx(0.0, abs=1e-12)
    assert q.calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    assert q.calc_diff(x, -x) == pytest.approx(2.0)
    q.check_bias(x + 1e-3 * torch.randn(1000, generator=_gen(11)), x)
    with pytest.raises(AssertionError, match="biased"):
        q.check_bias(x + 1e-3, x)


def test_clear_unused_sf_and_poison():
    x, _ = _known_exponent_input(5, groups=6)
    _, sf = q.cast(x, "e4m3", (1, 32), round_sf=True, use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True)
    assert not sf.is_contiguous()  # column-major: clear_unused_sf must handle the strides itself
    before = sf.clone()
    cleared = q.clear_unused_sf(sf, 192, 32)
    q.assert_equal(sf, before, check_stride=False)  # the input is left unchanged
    assert cleared.shape == (5, 8) and cleared.dtype == torch.uint8
    assert torch.all(cleared[:, 6:] == 0) and cleared[0, :6].tolist() == [124, 125, 126, 127, 128, 129]
    out = q.poison_like(torch.empty(3, 4))
    assert torch.isnan(out).all()
    with pytest.raises(AssertionError, match="12 elements"):
        q.assert_all_written(out)
    out[:] = 1.0
    q.assert_all_written(out)
    with pytest.raises(TypeError):
        q.assert_all_written(torch.zeros(2, dtype=torch.int8))
