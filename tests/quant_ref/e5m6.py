"""Reference E5M6 per-token cast and cast-back (plain torch, CPU or CUDA, deterministic).

E5M6 is the top 12 bits of an IEEE half: sign, 5 exponent bits (bias 15), 6 mantissa bits; the
largest finite value is 2^15 * (1 + 63/64) = 65024.  Contract: bit-for-bit the semantics of
``tile_kernels.torch.cast_to_e5m6`` / ``cast_back_from_e5m6`` 1.0.0:

* encode (fp32 -> 12-bit code): take the half obtained by truncating toward zero (fp32 exponents
  above the half range give inf, NaN gives the sign-kept 0x7FFF NaN, magnitudes below 2^-24 give
  signed zero), keep its top 12 bits, then add one when the 17 low bits of the fp32 value exceed
  0x10000, or equal it with an odd code (round half to even on the fp32 mantissa); the sum wraps
  within 12 bits.
* packing: each 8 consecutive codes form a 96-bit big-endian bit string (code 0 in the top bits),
  cut into three uint32 words (word 0 the top), each stored little endian: uint8 output
  ``[tokens, hidden * 3 // 2]``.
* decode: code << 4 is the half's bit pattern; the value is that half, widened to fp32.
"""

import torch

from .cast import sf_to_fp32

E5M6_MAX = 65024.0
_CLAMP_MIN = 1e-4
_CODE_BITS = 12
_WORD_BITS = 32


def _half_rtz_bits(bits: torch.Tensor) -> torch.Tensor:
    """Bits (int32, 0..0xFFFF) of the fp16 obtained by truncating the fp32 with bits ``bits``."""
    sign = (bits >> 16) & 0x8000
    exp = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    normal = ((exp - 112) << 10) | (man >> 13)
    subnormal = (man | 0x800000) >> (126 - exp).clamp(0, 31)
    special = torch.full_like(bits, 0x7C00).masked_fill((exp == 255) & (man != 0), 0x7FFF)
    mag = torch.where(exp >= 103, subnormal, 0)
    mag = torch.where(exp >= 113, normal, mag)
    mag = torch.where(exp >= 143, special, mag)
    return sign | mag


def e5m6_bits(values: torch.Tensor) -> torch.Tensor:
    """12-bit E5M6 codes (int32, 0..0xFFF, same shape) of fp32 ``values`` (rounding: module docstring)."""
    if values.dtype != torch.float32:
        raise TypeError(f"e5m6_bits takes fp32 values, got {values.dtype}")
    bits = values.contiguous().view(torch.int32)
    code = _half_rtz_bits(bits) >> 4
    round_up = ((code & 1) + (bits & 0x1FFFF)) > 0x10000
    return (code + round_up.to(torch.int32)) & 0xFFF


def _word_shift(code_index: int, word_index: int) -> int:
    """Left shift that moves code ``code_index`` to its place inside word ``word_index`` (negative:
    a right shift); the 96-bit string holds code k at bit 84 - 12 k, word i at bit 64 - 32 i."""
    return (84 - _CODE_BITS * code_index) - (64 - _WORD_BITS * word_index)


def pack_e5m6(codes: torch.Tensor) -> torch.Tensor:
    """Pack int codes ``[tokens, hidden]`` (hidden % 8 == 0) into uint8 ``[tokens, hidden * 3 // 2]``."""
    tokens, hidden = codes.shape
    if hidden % 8:
        raise ValueError(f"E5M6 packs 8 values per 3 words: hidden {hidden} must be a multiple of 8")
    groups = codes.to(torch.int64).reshape(tokens, hidden // 8, 8)
    words = []
    for w in range(3):
        word = torch.zeros(groups.shape[:-1], dtype=torch.int64, device=codes.device)
        for k in range(8):
            s = _word_shift(k, w)
            if 0 <= s < _WORD_BITS:
                word |= (groups[..., k] << s) & 0xFFFFFFFF
            elif -_CODE_BITS < s < 0:
                word |= groups[..., k] >> -s
        words.append(word)
    stacked = torch.stack(words, dim=-1)
    byte_list = [(stacked >> (8 * b)) & 0xFF for b in range(4)]
    return torch.stack(byte_list, dim=-1).reshape(tokens, hidden // 8 * 12).to(torch.uint8)


def unpack_e5m6(packed: torch.Tensor) -> torch.Tensor:
    """Decode uint8 ``[tokens, hidden * 3 // 2]`` into fp32 ``[tokens, hidden]``."""
    if packed.dtype != torch.uint8 or packed.ndim != 2 or packed.shape[1] % 12:
        raise ValueError(
            f"E5M6 data must be 2-D uint8 with a multiple of 12 bytes per row, got {packed.dtype} {tuple(packed.shape)}"
        )
    tokens, nbytes = packed.shape
    raw = packed.to(torch.int64).reshape(tokens, nbytes // 12, 3, 4)
    words = raw[..., 0] | (raw[..., 1] << 8) | (raw[..., 2] << 16) | (raw[..., 3] << 24)
    codes = []
    for k in range(8):
        code = torch.zeros(words.shape[:-1], dtype=torch.int64, device=packed.device)
        for w in range(3):
            s = _word_shift(k, w)
            if 0 <= s < _WORD_BITS:
                code |= (words[..., w] >> s) & 0xFFF
            elif -_CODE_BITS < s < 0:
                code |= (words[..., w] << -s) & 0xFFF
        codes.append(code)
    half_bits = torch.stack(codes, dim=-1).reshape(tokens, nbytes // 12 * 8) << 4
    signed = torch.where(half_bits >= 0x8000, half_bits - 0x10000, half_bits)
    return signed.to(torch.int16).view(torch.float16).to(torch.float32)


def _col_major(sf: torch.Tensor) -> torch.Tensor:
    tokens, groups = sf.shape
    buf = torch.zeros((groups, -(-tokens // 4) * 4), dtype=sf.dtype, device=sf.device)
    buf[:, :tokens] = sf.T
    return buf.T[:tokens]


def _e5m6_scales(amax: torch.Tensor, round_sf: bool):
    """(sf_bits int32, exponent int32 or None, sf_inv fp32) per group."""
    clamped = torch.clamp(amax, min=_CLAMP_MIN)
    limit = torch.full_like(clamped, E5M6_MAX)
    bits = (clamped / limit).view(torch.int32)
    zero = torch.zeros_like(clamped)
    if not round_sf:
        return bits, None, torch.where(bits == 0, zero, limit / clamped)
    exp = ((bits - 1) >> 23) + 1 - 127
    inv = ((127 - exp).clamp(min=0) << 23).view(torch.float32)
    return bits, exp, torch.where(bits == 0, zero, inv)


def _e5m6_sf_out(bits, exp, col_major: bool, packed: bool) -> torch.Tensor:
    if packed:
        raw = (exp + 127) if exp is not None else ((bits >> 23) & 0xFF)
        tokens, groups = raw.shape
        buf = torch.zeros((tokens, -(-groups // 4) * 4), dtype=torch.uint8, device=raw.device)
        buf[:, :groups] = raw.to(torch.uint8)
        out = buf.view(torch.int32)
    else:
        out = ((exp + 127) << 23).view(torch.float32) if exp is not None else bits.view(torch.float32)
    return _col_major(out) if col_major else out


def cast_to_e5m6(
    x: torch.Tensor,
    num_per_channels: int,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token E5M6 cast of 2-D bf16/fp32 ``x`` (hidden % 8 == 0, hidden % num_per_channels == 0).

    sf per (token, group of num_per_channels): ``max(amax, 1e-4) / 65024``; with ``round_sf``
    rounded up to a power of two (sf_inv its exact inverse), else ``sf_inv = 65024 / max(amax,
    1e-4)``.  Returns ``(uint8 [tokens, hidden * 3 // 2], sf)``; sf is fp32 ``[tokens, groups]`` or,
    with ``use_packed_ue8m0``, int32 ``[tokens, ceil(groups / 4)]`` of exponent bytes (truncated
    exponent without round_sf; padding bytes 0), row-major, or column-major with the token dim
    padded to 4 when ``use_tma_aligned_col_major_sf`` (packed UE8M0 without it stays row-major)."""
    if x.ndim != 2 or x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"x must be a 2-D bf16/fp32 tensor, got {x.dtype} {tuple(x.shape)}")
    tokens, hidden = x.shape
    if hidden % 8 or hidden % num_per_channels:
        raise ValueError(f"hidden {hidden} must be a multiple of 8 and of num_per_channels {num_per_channels}")
    x32 = x.to(torch.float32).contiguous()
    groups = hidden // num_per_channels
    amax = x32.abs().reshape(tokens, groups, num_per_channels).amax(dim=-1)
    bits, exp, inv = _e5m6_scales(amax, round_sf)
    scaled = x32 * inv.repeat_interleave(num_per_channels, dim=1)
    packed = pack_e5m6(e5m6_bits(scaled))
    return packed, _e5m6_sf_out(bits, exp, use_tma_aligned_col_major_sf, use_packed_ue8m0)


def cast_back_from_e5m6(x: tuple[torch.Tensor, torch.Tensor], fmt: str, x_block_size: tuple[int, int]) -> torch.Tensor:
    """Dequantize ``(uint8 E5M6 data, sf)`` to contiguous 'bf16' or 'fp32' ``[tokens, hidden]``:
    decoded value * sf (fp32 or packed-UE8M0 int32, any layout) broadcast over
    ``x_block_size = (num_per_tokens, num_per_channels)`` blocks, rounded once to the output dtype."""
    if fmt not in ("bf16", "fp32"):
        raise ValueError(f"fmt must be 'bf16' or 'fp32', got {fmt!r}")
    data, sf = x
    values = unpack_e5m6(data)
    tokens, hidden = values.shape
    per_tokens, per_channels = x_block_size
    if hidden % per_channels:
        raise ValueError(f"hidden {hidden} must be a multiple of num_per_channels {per_channels}")
    scale = sf_to_fp32(sf)
    if sf.dtype != torch.float32:
        scale = scale[:, : hidden // per_channels]
    scale = scale.repeat_interleave(per_tokens, dim=0).repeat_interleave(per_channels, dim=1)[:tokens, :hidden]
    return (values * scale).to(torch.bfloat16 if fmt == "bf16" else torch.float32)
