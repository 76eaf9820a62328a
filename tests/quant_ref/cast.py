"""Reference block-scaled casts to FP8 (e4m3) and FP4 (e2m1), and back (plain torch, CPU or CUDA).

Contract: bit-for-bit the semantics of ``tile_kernels.torch.cast`` / ``cast_back`` 1.0.0 (the
specification of the ``tilebin.ops.quant`` kernels), including the layouts (dtype, shape, strides)
of every output.  Every function is deterministic and works on any device: only element-wise
torch ops whose fp32 results are exactly rounded (``*``, ``/`` between tensors, comparisons,
integer bit operations) are used, so CPU and CUDA give identical bits.

Scale factors ("sf", the dequantization multipliers) for a ``(rows, cols)`` tensor and a block
``(bh, bw)`` cover ``ceil(rows / bh) x ceil(cols / bw)`` blocks and come in three layouts:

* row-major fp32 ``[row_blocks, col_blocks]``, contiguous;
* column-major fp32 (``use_tma_aligned_col_major_sf``): same shape, strides ``(1, pad4(row_blocks))``;
* packed UE8M0 (``use_packed_ue8m0`` together with the column-major flag): int32
  ``[row_blocks, ceil(col_blocks / 4)]``, strides ``(1, pad4(row_blocks))``; byte ``g % 4``
  (little endian) of int32 column ``g // 4`` holds the biased exponent of block column ``g``;
  unused bytes are zero.
"""

from typing import Optional, Union

import torch

QuantPair = tuple[torch.Tensor, torch.Tensor]

FMT_DTYPES = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.int8}
FMT_MAX = {"e4m3": 448.0, "e2m1": 6.0}
# The smallest amax a block is given, so that sf never reaches zero or a denormal.
FMT_CLAMP_MIN = {"e4m3": 1e-4, "e2m1": 6.0 * 2.0**-126}
# The magnitudes of the eight non-negative e2m1 codes 0..7 (code | 8 is the negative one).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Round-to-nearest-even decision points between consecutive codes: a magnitude strictly
# above the point (or at it, when the upper code is the even one) takes the upper code.
_E2M1_STEPS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_fmt(fmt: str) -> None:
    if fmt not in FMT_DTYPES:
        raise ValueError(f"fmt must be one of {sorted(FMT_DTYPES)}, got {fmt!r}")


# ---------------------------------------------------------------------------------- e2m1 codes
def e2m1_bits(values: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (uint8, same shape) of fp32 ``values``: round to nearest, ties to even, onto
    {0, .5, 1, 1.5, 2, 3, 4, 6}; magnitudes above 6 (inf and NaN too) saturate to code 7; bit 3 is
    the fp32 sign bit (so -0.0 gives 8 and a tiny negative value gives 8)."""
    if values.dtype != torch.float32:
        raise TypeError(f"e2m1_bits takes fp32 values, got {values.dtype}")
    mag = values.abs()
    code = torch.zeros(values.shape, dtype=torch.int32, device=values.device)
    for point, tie_up in _E2M1_STEPS:
        code += (mag >= point if tie_up else mag > point).to(torch.int32)
    code = torch.where(torch.isnan(values), 7, code)
    sign = (values.contiguous().view(torch.int32) >> 28) & 8
    return (code | sign).to(torch.uint8)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes ``[..., 2k]`` into int8 bytes ``[..., k]``: the even element in the low
    nibble, the odd one in the high nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"e2m1 packing needs an even last dimension, got {tuple(codes.shape)}")
    pairs = codes.to(torch.int32).reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8).view(torch.int8)


def unpack_e2m1(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed e2m1 bytes (int8 or uint8, ``[..., k]``) into ``out_dtype`` values ``[..., 2k]``
    (low nibble first); code 8 decodes to -0.0.  Same results as
    ``tile_kernels.quant.unpack_from_e2m1fn_x2``."""
    if x.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"unpack_e2m1 takes int8/uint8 packed bytes, got {x.dtype}")
    if x.ndim == 0:
        raise ValueError("unpack_e2m1 needs at least one dimension (the packed one)")
    table = torch.tensor(E2M1_MAGNITUDES + tuple(-v for v in E2M1_MAGNITUDES), dtype=torch.float32, device=x.device)
    byte = x.to(torch.int32) & 0xFF
    codes = torch.stack((byte & 0xF, byte >> 4), dim=-1).reshape(*x.shape[:-1], x.shape[-1] * 2)
    return table[codes.long()].to(out_dtype)


# ------------------------------------------------------------------------------ scale factors
def sf_to_fp32(sf: torch.Tensor) -> torch.Tensor:
    """fp32 scale factors in logical ``[row_blocks, col_blocks]`` orientation.  fp32 input is returned
    as is (any layout); packed UE8M0 int32 ``[rb, c4]`` becomes fp32 ``[rb, 4 * c4]`` holding
    ``2 ** (byte - 127)`` (byte 0 gives 0.0, byte 255 gives inf), padding bytes included."""
    if sf.dtype == torch.float32:
        return sf
    if sf.dtype != torch.int32:
        raise TypeError(f"sf must be fp32 or packed-ue8m0 int32, got {sf.dtype}")
    dense = torch.empty(sf.shape, dtype=torch.int32, device=sf.device)
    dense.copy_(sf)
    exps = dense.view(torch.uint8).to(torch.int32)
    return (exps << 23).view(torch.float32)


def _expand_blocks(sf: torch.Tensor, block: tuple[int, int], rows: int, cols: int) -> torch.Tensor:
    full = sf.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    return full[:rows, :cols]


def dequantize(x: QuantPair, block_size: tuple[int, int]) -> torch.Tensor:
    """fp32 values ``data * sf`` of a quantized pair (e4m3 data, or e2m1 packed in int8; sf fp32 in
    either layout or packed UE8M0 int32), the sf broadcast over ``block_size`` blocks."""
    data, sf = x
    if data.dtype == torch.float8_e4m3fn:
        values = data.to(torch.float32)
    elif data.dtype == torch.int8:
        values = unpack_e2m1(data)
    else:
        raise TypeError(f"quantized data must be float8_e4m3fn or int8 (packed e2m1), got {data.dtype}")
    if values.ndim != 2:
        raise ValueError(f"quantized data must be 2-D, got shape {tuple(data.shape)}")
    scale = _expand_blocks(sf_to_fp32(sf), block_size, values.shape[0], values.shape[1])
    return values * scale


def _block_amax(x32: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    h, w = x32.shape
    bh, bw = block
    hb, wb = _ceil_div(h, bh), _ceil_div(w, bw)
    padded = torch.zeros((hb * bh, wb * bw), dtype=torch.float32, device=x32.device)
    padded[:h, :w] = x32
    # max() over one flattened block dim (not amax over two): it keeps a NaN's payload, as tile_kernels
    blocks = padded.abs().reshape(hb, bh, wb, bw).permute(0, 2, 1, 3).reshape(hb, wb, bh * bw)
    return blocks.max(dim=-1).values


def scales_from_amax(amax: torch.Tensor, fmt: str, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sf_bits, sf_inv)`` for fp32 block maxima: ``sf = max(amax, clamp_min) / fmt_max`` (fp32
    division); with ``round_sf`` sf's bits are rounded up to a power of two
    (``(bits + 0x7FFFFF) & 0x7F800000``) and ``sf_inv = 1 / sf`` (exact), else
    ``sf_inv = fmt_max / max(amax, clamp_min)`` (a second division, not ``1 / sf``).
    ``sf_bits`` is int32 (the fp32 sf bit pattern); a zero sf gets ``sf_inv = 0``."""
    clamped = torch.clamp(amax, min=FMT_CLAMP_MIN[fmt])
    fmt_max = torch.full_like(clamped, FMT_MAX[fmt])
    bits = (clamped / fmt_max).view(torch.int32)
    zero = torch.zeros_like(clamped)
    if round_sf:
        bits = (bits + 0x007FFFFF) & 0x7F800000
        inv = torch.where(bits == 0, zero, torch.reciprocal(bits.view(torch.float32)))
    else:
        inv = torch.where(bits == 0, zero, fmt_max / clamped)
    return bits, inv


def _format_sf(bits: torch.Tensor, col_major: bool, packed: bool) -> torch.Tensor:
    if not col_major:
        return bits.view(torch.float32)
    hb, wb = bits.shape
    wb_pad = _ceil_div(wb, 4) * 4 if packed else wb
    buf = torch.zeros((_ceil_div(hb, 4) * 4, wb_pad), dtype=torch.int32, device=bits.device)
    buf[:hb, :wb] = bits
    if packed:
        buf = (buf >> 23).to(torch.int8).view(torch.int32)
    else:
        buf = buf.view(torch.float32)
    return buf.T.contiguous().T[:hb]


def _empty_result(w: int, fmt: str, block, sf, col_major: bool, packed: bool, device):
    out = torch.empty((0, w // 2 if fmt == "e2m1" else w), dtype=FMT_DTYPES[fmt], device=device)
    if sf is not None:
        return out
    groups = _ceil_div(w, block[1])
    if packed:
        out_sf = torch.empty((_ceil_div(groups, 4), 0), dtype=torch.int32, device=device).T
    elif col_major:
        out_sf = torch.empty((groups, 0), dtype=torch.float32, device=device).T
    else:
        out_sf = torch.empty((0, groups), dtype=torch.float32, device=device)
    return out, out_sf


# ------------------------------------------------------------------------------- public casts
def _input_fp32(x, x_block_size) -> torch.Tensor:
    if isinstance(x, tuple):
        if x_block_size is None:
            raise ValueError("a (data, sf) input needs x_block_size")
        return dequantize(x, x_block_size)
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"x must be bf16 or fp32 (or a (data, sf) pair), got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D, got shape {tuple(x.shape)}")
    return x.to(torch.float32).contiguous()


def _quant_sf_inv(sf: torch.Tensor, shape, block, col_major: bool, packed: bool) -> torch.Tensor:
    if col_major or packed:
        raise ValueError("a precomputed sf is row-major fp32: column-major / packed output flags must be off")
    expected = (_ceil_div(shape[0], block[0]), _ceil_div(shape[1], block[1]))
    if sf.ndim != 2 or tuple(sf.shape) != expected:
        raise ValueError(f"sf must have shape {expected}, got {tuple(sf.shape)}")
    return torch.reciprocal(sf)


def cast(
    x: Union[torch.Tensor, QuantPair],
    fmt: str,
    block_size: tuple[int, int] = (32, 32),
    sf: Optional[torch.Tensor] = None,
    x_block_size: Optional[tuple[int, int]] = None,
    round_sf: bool = False,
    use_tma_aligned_col_major_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> Union[torch.Tensor, QuantPair]:
    """Quantize a 2-D bf16/fp32 tensor (or a ``(data, sf)`` pair, first dequantized in fp32 with
    ``x_block_size`` blocks) to ``fmt`` with one sf per ``block_size`` block.

    Returns ``(data, sf)``, or only ``data`` when a precomputed row-major fp32 ``sf`` is given
    (then ``x * (1 / sf)`` is quantized).  ``data``: e4m3 ``[h, w]`` (values clamped to +-448,
    RNE), or e2m1 packed into int8 ``[h, w // 2]``; contiguous.  ``sf`` layout: see the module
    docstring; packed UE8M0 is produced only with the column-major flag (alone it is ignored, as in
    tile_kernels), and without ``round_sf`` its bytes are the truncated exponents.
    Raises ValueError/TypeError on arguments the reference does not accept."""
    _check_fmt(fmt)
    x32 = _input_fp32(x, x_block_size)
    h, w = x32.shape
    col_major, packed = use_tma_aligned_col_major_sf, use_packed_ue8m0
    if h == 0:
        return _empty_result(w, fmt, block_size, sf, col_major, packed, x32.device)
    if fmt == "e2m1" and w % 2:
        raise ValueError(f"e2m1 packs pairs along the last dim: width {w} must be even")
    if sf is None:
        bits, inv = scales_from_amax(_block_amax(x32, block_size), fmt, round_sf)
    else:
        inv = _quant_sf_inv(sf, (h, w), block_size, col_major, packed)
    scaled = x32 * _expand_blocks(inv, block_size, h, w)
    if fmt == "e4m3":
        data = torch.clamp(scaled, -FMT_MAX[fmt], FMT_MAX[fmt]).to(torch.float8_e4m3fn)
    else:
        data = pack_e2m1(e2m1_bits(scaled))
    if sf is not None:
        return data
    return data, _format_sf(bits, col_major, packed)


def cast_back(x: QuantPair, fmt: str, block_size: tuple[int, int] = (32, 32)) -> torch.Tensor:
    """Dequantize a ``(data, sf)`` pair (as :func:`dequantize`) into a contiguous ``fmt`` tensor:
    'fp32' or 'bf16' (the fp32 product rounded once to bf16)."""
    if fmt not in ("bf16", "fp32"):
        raise ValueError(f"cast_back fmt must be 'bf16' or 'fp32', got {fmt!r}")
    return dequantize(x, block_size).to(torch.float32 if fmt == "fp32" else torch.bfloat16)
