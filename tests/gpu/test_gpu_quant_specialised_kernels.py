"""The quant kernels that serve part of an op's range, through the ops on the GPU, bit-exact
against ``quant_ref`` and with every output element written (scales only for E5M6, whose packed
data bytes may be 0xFF):

* ``quant.per_channel_cast_bf16``: per_channel_cast and per_channel_cast_fused (plain) on bf16 at
  0, 1, odd, partial-tile and benchmark sizes, round_sf on and off, special values;
* ``quant.per_token_cast_decode``: per_token_cast e4m3 bf16 / fp32 at decode sizes (1-256
  tokens, where the op launches it) and past them (257, 4001: ``quant.per_token_cast``), 16..128
  channels per scale, row / column-major scales, round_sf, and the layouts it leaves to
  ``quant.per_token_cast`` (UE8M0, one scale per row);
* ``quant.per_token_cast_e5m6_fp32``: fp32 E5M6 at 0, 1, odd and benchmark sizes, hidden 8..7168
  (every tokens_per_block, and units past the cached ones), the row, column-major and UE8M0 scale
  layouts, round_sf.
"""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

import quant_ref  # noqa: E402
from _moe_util import poison_cache, seed  # noqa: E402
from quant_ref import per_channel as pc_ref  # noqa: E402

pytestmark = pytest.mark.gpu
E4M3 = torch.float8_e4m3fn
PC_BF16 = "quant.per_channel_cast_bf16"
PT_GENERAL, PT_DECODE = "quant.per_token_cast", "quant.per_token_cast_decode"
E5_FP32 = "quant.per_token_cast_e5m6_fp32"


def _check(got, want, name: str) -> None:
    for g, w, part in zip(got, want, ("out", "out_sf")):
        quant_ref.assert_equal(g, w, f"{name}: {part}")
        if g.numel():
            quant_ref.assert_all_written(g, f"{name}: {part}")


# ------------------------------------------------------------------------------ per_channel_cast
@pytest.fixture
def pc_kernel(require):
    """The kernel per_channel_cast launches for plain bf16."""
    require(PC_BF16)
    return PC_BF16


PC_CASES = [(0, 2048), (1, 576), (1, 7168), (33, 2048), (127, 160), (128, 2048), (129, 576), (300, 3072),
            (4001, 2560), (4096, 2048), (8064, 2048), (4096, 6144), (8064, 6144), (4096, 4096), (8001, 7168)]


@pytest.mark.parametrize("round_sf", [False, True], ids=["exact", "round"])
@pytest.mark.parametrize("case", PC_CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_per_channel_cast_bf16(pc_kernel, case, round_sf):
    from tilebin.ops import quant

    tokens, hidden = case
    name = f"per_channel_cast {tokens}x{hidden} bf16 round_sf={round_sf} ({pc_kernel})"
    seed("pc", case, round_sf)
    x = (torch.randn((tokens, hidden), device="cuda") * 3).to(torch.bfloat16)
    if tokens > 3:  # zeros, -0.0, tiny values, an outlier
        x[:, 0] = 0
        x[:, 1] = -0.0
        x[2, 2:40] *= 1e-30
        x[3, 5] = 3e4
    want = pc_ref.per_channel_cast(x, 128, round_sf)
    poison_cache(4 * x.numel())
    _check(quant.per_channel_cast(x, "e4m3", 128, round_sf), want, name)
    poison_cache(4 * x.numel())
    _check(quant.per_channel_cast_fused(x, "e4m3", 128, round_sf), want, name + " fused")


def test_per_channel_cast_bf16_huge_columns(pc_kernel):
    """Column magnitudes over the bf16 range (subnormal e4m3 results, clamped amax, inf scales off)."""
    from tilebin.ops import quant

    seed("pc-huge")
    tokens, hidden = 300, 576
    col_scale = torch.pow(10.0, torch.linspace(-30, 30, hidden, device="cuda"))
    x = (torch.randn((tokens, hidden), device="cuda") * col_scale).to(torch.bfloat16)
    for round_sf in (False, True):
        _check(quant.per_channel_cast(x, "e4m3", 128, round_sf), pc_ref.per_channel_cast(x, 128, round_sf),
               f"huge columns round_sf={round_sf} ({pc_kernel})")


# ------------------------------------------------------------------------------ per_token_cast
@pytest.fixture
def pt_kernels(require):
    """The kernels per_token_cast launches for a plain input."""
    require(PT_GENERAL)
    require(PT_DECODE)


def _pt_kernel(tokens: int, group: int, packed: bool) -> str:
    """The kernel per_token_cast launches for this plain e4m3 case (for the failure messages)."""
    from tilebin import runtime

    decode = tokens <= runtime.spec(PT_DECODE).meta["max_tokens"] and group in (16, 32, 64, 128) and not packed
    return PT_DECODE if decode else PT_GENERAL


PT_CASES = [(t, h, d) for t in (1, 2, 4, 16, 64, 128, 256) for h, d in ((7168, "bfloat16"), (576, "float32"))]
PT_CASES += [(3, 2080, "bfloat16"), (5, 160, "float32"), (128, 2048, "float32"), (257, 7168, "bfloat16"),
             (4001, 7168, "bfloat16"), (0, 7168, "bfloat16")]
# (channels per scale, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
PT_LAYOUTS = [(128, False, False, False), (128, True, True, False), (16, False, True, False),
              (32, True, False, False), (64, False, False, False), (128, True, True, True),
              ("hidden", False, False, False)]


@pytest.mark.parametrize("layout", PT_LAYOUTS, ids=lambda lay: "-".join(str(v) for v in lay))
@pytest.mark.parametrize("case", PT_CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}")
def test_per_token_cast_decode(pt_kernels, case, layout):
    from tilebin.ops import quant

    tokens, hidden, dtype = case
    group, col, rnd, packed = layout
    group = hidden if group == "hidden" else group
    flags = dict(use_tma_aligned_col_major_sf=col, round_sf=rnd, use_packed_ue8m0=packed)
    name = f"per_token_cast {tokens}x{hidden} {dtype} n{group} {flags} ({_pt_kernel(tokens, group, packed)})"
    seed("pt", case, layout)
    x = torch.randn((tokens, hidden), device="cuda", dtype=getattr(torch, dtype))
    if tokens > 3:
        x[0, :64] = 0
        x[1, :32] = -0.0
        x[2, -48:] *= 1e-20
        x[3, 5] = 1e4
    want = quant_ref.cast(x, "e4m3", (1, group), **flags)
    for _ in range(2):  # the second call takes the memoized plan
        poison_cache(4 * x.numel() + (1 << 20))
        out, sf = quant.per_token_cast(x, "e4m3", group, **flags)
        quant_ref.assert_equal(out, want[0], f"{name}: out")
        quant_ref.assert_equal(sf, want[1], f"{name}: sf")
        if out.numel():
            quant_ref.assert_all_written(out, f"{name}: out")


def test_per_token_cast_decode_strided_rows(pt_kernels):
    """A row stride past hidden (aligned: no copy) at a decode size."""
    from tilebin.ops import quant

    seed("pt-strided")
    base = torch.randn((8, 7168 + 64), device="cuda", dtype=torch.bfloat16)
    x = base[:, :7168]
    want = quant_ref.cast(x.contiguous(), "e4m3", (1, 128))
    out, sf = quant.per_token_cast(x, "e4m3", 128)
    quant_ref.assert_equal(out, want[0], f"strided rows: out ({PT_DECODE})")
    quant_ref.assert_equal(sf, want[1], f"strided rows: sf ({PT_DECODE})")


# ------------------------------------------------------------------------------ per_token_cast e5m6
@pytest.fixture
def e5_kernel(require):
    """The kernel per_token_cast(fmt='e5m6') launches for fp32."""
    require(E5_FP32)
    return E5_FP32


# hidden sizes: all units cached with 4 / 2 / 1 tokens per block, and past the cache (re-read)
E5_CASES = [(0, 2048), (1, 2048), (3, 576), (4001, 2048), (8001, 2048), (130, 1024), (77, 4096), (33, 7168),
            (4001, 7168), (5, 8)]
E5_LAYOUTS = [(False, False, False), (True, True, False), (True, True, True), (False, True, False)]


@pytest.mark.parametrize("layout", E5_LAYOUTS, ids=lambda lay: "-".join(str(v) for v in lay))
@pytest.mark.parametrize("case", E5_CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_per_token_cast_e5m6_fp32(e5_kernel, case, layout):
    from tilebin.ops import quant

    tokens, hidden = case
    col, rnd, packed = layout
    flags = dict(use_tma_aligned_col_major_sf=col, round_sf=rnd, use_packed_ue8m0=packed)
    name = f"e5m6 {tokens}x{hidden} fp32 {flags} ({e5_kernel})"
    seed("e5", case, layout)
    k = torch.randint(-30, 30, (tokens, hidden), device="cuda").float()
    x = torch.randn((tokens, hidden), device="cuda") * torch.exp2(k)  # subnormal codes, underflow
    if tokens:
        x[::7] = 0.0  # zero rows: amax clamped
        x[1::5, ::3] = -0.0
    want = quant_ref.cast_to_e5m6(x, hidden, **flags)
    poison_cache(4 * x.numel() + (1 << 20))
    data, sf = quant.per_token_cast(x, "e5m6", hidden, **flags)
    quant_ref.assert_equal(data, want[0], f"{name}: data")
    quant_ref.assert_equal(sf, want[1], f"{name}: sf")
    if sf.numel():  # data: packed uint8 where 0xFF is a valid byte (the equality above covers it)
        quant_ref.assert_all_written(sf, f"{name}: sf")
