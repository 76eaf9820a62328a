"""GPU tests of ``tilebin.ops.quant`` per-block casts against ``quant_ref`` (bit-exact).

per_block_cast / _with_sf_only / _with_precomputed_sf: every (input dtype, fmt, block, sf layout)
combination at a small odd shape, every hidden size at 4001 tokens on a rotating subset, and the
large sizes (8001 x 7168) on a representative subset; 0 and 1 tokens.  per_block_cast_lossless:
every (input sf layout, output block, output sf layout) combination; its data and scales are
compared bit for bit with a torch reference of tile_kernels' lossless rule (below), and the
cast-back values with the input's (what tile_kernels' own test checks).

Outputs come from fresh allocations; before each op call the caching allocator's free memory is
filled with 0xFF (``_poison_cache``), so an element the kernel forgot reads as poison and fails
the bit-exact comparison.
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

import quant_ref

HIDDEN = (576, 2048, 2560, 3072, 4096, 6144, 7168)
# (use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
LAYOUTS = ((False, False, False), (False, True, False), (True, False, False), (True, True, False), (True, True, True))
DTYPES = (torch.bfloat16, torch.float32)
FMTS = ("e4m3", "e2m1")
BLOCKS = ((128, 128), (32, 32))
TOLERANCE = {"e4m3": 1e-3, "e2m1": 2e-2}


@pytest.fixture
def q(require):
    require("quant.per_block_cast")
    require("quant.per_block_cast_lossless")
    from tilebin.ops import quant

    return quant


def _poison_cache(nbytes: int) -> None:
    """Fill free blocks of torch's caching allocator with 0xFF (outputs reuse them)."""
    blob = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device="cuda")
    blob.fill_(0xFF)
    del blob


def _seed(*key) -> None:
    torch.manual_seed(zlib.crc32(repr(key).encode()))


def _cases() -> list:
    cases = [(129, 576, d, f, b, lay) for d, f, b, lay in itertools.product(DTYPES, FMTS, BLOCKS, LAYOUTS)]
    combos = list(itertools.product(DTYPES, FMTS, BLOCKS, LAYOUTS))
    cases += [(4001, h, *combos[(7 * i) % len(combos)]) for i, h in enumerate(HIDDEN)]
    cases += [(4001, 7168, torch.bfloat16, "e4m3", (128, 128), LAYOUTS[4]),
              (8001, 7168, torch.bfloat16, "e4m3", (128, 128), LAYOUTS[0]),
              (8001, 7168, torch.float32, "e2m1", (32, 32), LAYOUTS[4]),
              (8001, 2048, torch.bfloat16, "e2m1", (128, 128), LAYOUTS[2]),
              (8193, 576, torch.float32, "e4m3", (32, 32), LAYOUTS[1])]
    cases += [(t, 576, d, f, b, lay) for t in (0, 1) for d, f, b in itertools.product(DTYPES, FMTS, BLOCKS)
              for lay in (LAYOUTS[1], LAYOUTS[4])]
    return cases


def _case_id(case) -> str:
    t, h, d, f, b, (col, rnd, packed) = case
    return f"{t}x{h}-{str(d).removeprefix('torch.')}-{f}-{b[0]}x{b[1]}-col{int(col)}-round{int(rnd)}-ue8m0{int(packed)}"


@pytest.mark.parametrize("case", _cases(), ids=_case_id)
def test_per_block_cast(q, case):
    tokens, hidden, dtype, fmt, block, (col, round_sf, packed) = case
    _seed("per_block", case)
    x = torch.randn((tokens, hidden), dtype=dtype, device="cuda")
    if tokens > 1:  # exact zeros, -0.0 and a tiny block exercise the sign and clamp paths
        x[0, :64] = 0
        x[1, :32] = -0.0
        x[-1, -32:] *= 1e-30 if dtype == torch.float32 else 1e-20
    flags = dict(use_tma_aligned_col_major_sf=col, round_sf=round_sf, use_packed_ue8m0=packed)
    name = _case_id(case)
    ref_out, ref_sf = quant_ref.cast(x, fmt, block, **flags)

    _poison_cache(4 * x.numel())
    out, sf = q.per_block_cast(x, fmt, block, **flags)
    quant_ref.assert_equal(sf, ref_sf, f"{name}: sf")
    quant_ref.assert_equal(out, ref_out, f"{name}: out")
    if tokens:
        back = quant_ref.cast_back((out, sf), "fp32", block)
        diff = quant_ref.calc_diff(back, x.float())
        assert diff <= TOLERANCE[fmt], f"{name}: cast-back calc_diff {diff:.3g} > {TOLERANCE[fmt]}"

    _poison_cache(4 * x.numel())
    sf_only = q.per_block_cast_with_sf_only(x, fmt, block, **flags)
    quant_ref.assert_equal(sf_only, ref_sf, f"{name}: sf-only sf")

    if not col:
        _poison_cache(4 * x.numel())
        out_pre = q.per_block_cast_with_precomputed_sf(x, fmt, block, ref_sf, **flags)
        quant_ref.assert_equal(out_pre, quant_ref.cast(x, fmt, block, sf=ref_sf, **flags), f"{name}: precomputed out")


@pytest.mark.parametrize("fmt", FMTS)
def test_per_block_cast_precomputed_arbitrary_sf(q, fmt):
    """Scales that are not powers of two: the kernel's 1 / sf must match torch.reciprocal."""
    _seed("precomputed", fmt)
    x = torch.randn((300, 2560), dtype=torch.bfloat16, device="cuda")
    sf = torch.rand((3, 20), dtype=torch.float32, device="cuda") * 0.02 + 1e-3
    _poison_cache(4 * x.numel())
    out = q.per_block_cast_with_precomputed_sf(x, fmt, (128, 128), sf)
    quant_ref.assert_equal(out, quant_ref.cast(x, fmt, (128, 128), sf=sf), f"precomputed {fmt}")


# ----------------------------------------------------------------------------- lossless
def _clamp_abs_ratio(t: torch.Tensor, max_ratio: float = 2.0**9) -> torch.Tensor:
    if t.numel() == 0:
        return t
    floor = t.abs().max() / max_ratio
    return torch.sign(t) * torch.maximum(t.abs(), floor)


def _exponents(sf: torch.Tensor) -> torch.Tensor:
    """Biased exponents (int64) of a power-of-two sf in logical [rows, groups] orientation."""
    if sf.dtype == torch.int32:
        dense = torch.empty(sf.shape, dtype=torch.int32, device=sf.device)
        dense.copy_(sf)
        return dense.view(torch.uint8).to(torch.int64)
    return (sf.contiguous().view(torch.int32).to(torch.int64) >> 23) & 0x1FF


def _output_exponents(e_in: torch.Tensor, out_block) -> tuple[torch.Tensor, torch.Tensor]:
    """The lossless rule's output exponent of each block, max(e_in over the block) - 6 floored at 0
    ([row blocks, group blocks]), and the same for each input group ([tokens, groups])."""
    tokens, groups = e_in.shape
    bm, per = out_block[0], out_block[1] // 32
    rb, gb = -(-tokens // bm), -(-groups // per)
    padded = torch.zeros((rb * bm, gb * per), dtype=torch.int64, device=e_in.device)
    padded[:tokens, :groups] = e_in
    e_out = torch.clamp(padded.reshape(rb, bm, gb, per).amax(dim=(1, 3)) - 6, min=0)
    return e_out, e_out.repeat_interleave(bm, 0).repeat_interleave(per, 1)[:tokens, :groups]


def lossless_ref(x, out_block, col: bool, packed: bool):
    """tile_kernels' lossless rule in torch: E = max(e_in over the block) - 6 (floored at 0),
    value * 2**(e_in - E) rounded to e4m3; output sf 2**(E - 127) in the requested layout."""
    data, sf = x
    tokens, hidden = data.shape[0], data.shape[1] * 2
    e_in = _exponents(sf)[:, :hidden // 32]  # [tokens, groups]
    e_out, e_out_full = _output_exponents(e_in, out_block)
    rb, gb = e_out.shape
    shift = torch.clamp(e_in - e_out_full + 127, 1, 254)
    scale = (shift.to(torch.int32) << 23).view(torch.float32).repeat_interleave(32, 1)
    values = quant_ref.unpack_e2m1(data) * scale
    out = values.to(torch.float8_e4m3fn)
    bits = (e_out.to(torch.int32) << 23)
    if not col:
        return out, bits.view(torch.float32)
    wb = -(-gb // 4) * 4 if packed else gb
    buf = torch.zeros((-(-rb // 4) * 4, wb), dtype=torch.int32, device=data.device)
    buf[:rb, :gb] = bits
    buf = (buf >> 23).to(torch.int8).view(torch.int32) if packed else buf.view(torch.float32)
    return out, buf.T.contiguous().T[:rb]


def _lossless_cases() -> list:
    ins = ((False, False), (True, False), (True, True))  # (col, packed) of the e2m1 input
    outs = ((1, 128), (32, 32), (128, 128))
    cases = [(257, 576, i, o, lo) for i, o, lo in itertools.product(ins, outs, ins)]
    cases += [(4001, h, ins[n % 3], outs[n % 3], ins[(n + 1) % 3]) for n, h in enumerate(HIDDEN)]
    cases += [(8001, 7168, ins[2], o, ins[2]) for o in outs]
    cases += [(t, 2048, ins[0], o, ins[1]) for t in (0, 1) for o in outs]
    return cases


def _lossless_id(case) -> str:
    t, h, (ic, ip), o, (oc, op) = case
    return f"{t}x{h}-in{'ue8m0' if ip else 'col' if ic else 'row'}-{o[0]}x{o[1]}-out{'ue8m0' if op else 'col' if oc else 'row'}"


@pytest.mark.parametrize("case", _lossless_cases(), ids=_lossless_id)
def test_per_block_cast_lossless(q, case):
    tokens, hidden, (in_col, in_packed), out_block, (out_col, out_packed) = case
    _seed("lossless", case)
    name = _lossless_id(case)
    x = torch.randn((tokens, hidden), dtype=torch.float32, device="cuda")
    x = _clamp_abs_ratio(x * torch.exp2(torch.randint(-3, 4, (tokens, 1), device="cuda").float()))
    x_fp4 = quant_ref.cast(x, "e2m1", (1, 32), round_sf=True, use_tma_aligned_col_major_sf=in_col,
                           use_packed_ue8m0=in_packed)
    _poison_cache(4 * x.numel())
    out, out_sf = q.per_block_cast_lossless(x_fp4, "e4m3", (1, 32), out_block, use_tma_aligned_col_major_sf=out_col,
                                            round_sf=True, use_packed_ue8m0=out_packed)
    ref_out, ref_sf = lossless_ref(x_fp4, out_block, out_col, out_packed)
    quant_ref.assert_equal(out_sf, ref_sf, f"{name}: out_sf")
    quant_ref.assert_equal(out, ref_out, f"{name}: out")
    quant_ref.assert_equal(quant_ref.cast_back((out, out_sf), "fp32", out_block),
                           quant_ref.cast_back(x_fp4, "fp32", (1, 32)), f"{name}: cast-back values")


def _scales_of_exponents(e: torch.Tensor, packed: bool) -> torch.Tensor:
    """Input scales 2**(e - 127) of exponents ``e`` [tokens, groups]: fp32 row-major, or packed
    UE8M0 int32 [tokens, ceil(groups / 4)] column-major (byte g % 4 of word g // 4)."""
    if not packed:
        return (e.to(torch.int32) << 23).view(torch.float32)
    tokens, groups = e.shape
    raw = torch.zeros((tokens, -(-groups // 4) * 4), dtype=torch.uint8, device=e.device)
    raw[:, :groups] = e.to(torch.uint8)
    return raw.view(torch.int32).T.contiguous().T


@pytest.mark.parametrize("out_block", [(1, 128), (32, 32), (128, 128)])
@pytest.mark.parametrize("in_packed", [False, True], ids=["in_row", "in_ue8m0"])
def test_per_block_cast_lossless_every_shift(q, in_packed, out_block):
    """Every e2m1 code under input scales spread far beyond the lossless rule's 2**11: the shift of
    each group's scale to its block's output scale runs from 6 down past -5 (to about -240 in
    blocks of many rows), so at (1, 128) both ways the kernel makes the bytes (a table for the
    exact shifts -5..6, an fp32 multiply and rounding below), and at (32, 32) and (128, 128) the
    fp32 path over the whole range, meet the reference bit for bit."""
    tokens, hidden = 300, 1536
    _seed("lossless-shifts", in_packed, out_block)
    data = torch.randint(-128, 128, (tokens, hidden // 2), dtype=torch.int8, device="cuda")
    anchors = torch.tensor((3, 9, 30, 127, 200, 250), device="cuda")
    rows = anchors[torch.randint(0, len(anchors), (tokens, 1), device="cuda")]
    e = torch.clamp(rows - torch.randint(0, 37, (tokens, hidden // 32), device="cuda"), 0, 254)
    sf = _scales_of_exponents(e, in_packed)
    out_col, out_packed = (False, False) if out_block == (1, 128) else (True, out_block == (128, 128))
    _poison_cache(4 * tokens * hidden)
    out, out_sf = q.per_block_cast_lossless((data, sf), "e4m3", (1, 32), out_block,
                                            use_tma_aligned_col_major_sf=out_col, round_sf=True,
                                            use_packed_ue8m0=out_packed)
    ref_out, ref_sf = lossless_ref((data, sf), out_block, out_col, out_packed)
    shifts = e - _output_exponents(e, out_block)[1]
    assert shifts.max() <= 6 and (shifts < -5).any() and ((shifts >= -5) & (shifts < 0)).any(), "both paths"
    quant_ref.assert_equal(out_sf, ref_sf, f"{out_block}: out_sf")
    quant_ref.assert_equal(out, ref_out, f"{out_block}: out")


@pytest.mark.parametrize("in_kind", ["row", "col", "ue8m0"])
def test_per_block_cast_lossless_takes_users_tensors_as_they_are(q, in_kind):
    """The kernel reads the user's scales as 4-byte words with their own strides: uint8 data, a later
    chunk of rows (a scale pointer 8 bytes past alignment: the op copies it), and column-major scales
    whose column stride is the token count (odd, not TMA-aligned) give the reference's bytes."""
    tokens, hidden = 37, 576  # 18 scales a row: rows 5.. start 8 (row) or 20 (col, ue8m0) bytes in
    _seed("lossless-users", in_kind)
    x = torch.randn((tokens + 5, hidden), dtype=torch.float32, device="cuda")
    x = _clamp_abs_ratio(x * torch.exp2(torch.randint(-3, 4, (tokens + 5, 1), device="cuda").float()))
    col, packed = in_kind != "row", in_kind == "ue8m0"
    data, sf = quant_ref.cast(x, "e2m1", (1, 32), round_sf=True, use_tma_aligned_col_major_sf=col,
                              use_packed_ue8m0=packed)
    data, sf = data[5:].view(torch.uint8), sf[5:]  # rows 5.. of every layout: views into the scales
    assert sf.data_ptr() % 16
    dense = sf.T.contiguous().T if col else sf.clone()  # aligned; column-major: strides (1, 37)
    for case in ((data, sf), (data, dense)):
        for out_block, out_col, out_packed in (((1, 128), False, False), ((32, 32), True, False),
                                               ((128, 128), True, True)):
            _poison_cache(4 * x.numel())
            out, out_sf = q.per_block_cast_lossless(case, "e4m3", (1, 32), out_block,
                                                    use_tma_aligned_col_major_sf=out_col, round_sf=True,
                                                    use_packed_ue8m0=out_packed)
            ref_out, ref_sf = lossless_ref((case[0].view(torch.int8), case[1]), out_block, out_col, out_packed)
            name = f"{in_kind}-sf strides {case[1].stride()}-{out_block}-{'ue8m0' if out_packed else 'col' if out_col else 'row'}"
            quant_ref.assert_equal(out_sf, ref_sf, f"{name}: out_sf")
            quant_ref.assert_equal(out, ref_out, f"{name}: out")


def test_per_block_cast_lossless_launches_with_fp32_scales_through_runtime_launch(q):
    """``runtime.launch`` (the checked path) takes fp32 scales for the int32 parameters
    (``also_dtypes``) and writes what the op writes."""
    from tilebin import runtime

    _seed("lossless-launch")
    x = _clamp_abs_ratio(torch.randn((64, 1024), dtype=torch.float32, device="cuda"))
    data, sf = quant_ref.cast(x, "e2m1", (1, 32), round_sf=True)
    want_out, want_sf = q.per_block_cast_lossless((data, sf), "e4m3", (1, 32), (1, 128), round_sf=True)
    out = torch.empty_like(want_out)
    out_sf = torch.full_like(want_sf, float("nan"))
    runtime.launch("quant.per_block_cast_lossless", data, sf, out, out_sf, 0, 0, block_m=1, block_k=128)
    quant_ref.assert_equal(out, want_out, "out")
    quant_ref.assert_equal(out_sf, want_sf, "out_sf")
