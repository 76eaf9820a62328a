"""``quant.per_block_cast_lossless``: packed e2m1 with (1, 32) power-of-two scales -> e4m3 with
one power-of-two scale per output block (1 x 128, 32 x 32 or 128 x 128), exactly.

Parameters, in order:

* ``x``: int8 ``[num_tokens, x_cols]``, two e2m1 codes per byte (low nibble = even channel),
  ``x_cols = hidden // 2``, contiguous.
* ``x_sf``: the input scales as the user holds them (``ops/quant/_sf.py``), read as 4-byte
  words ``[num_tokens, xs_cols]`` with run-time strides ``(xs_s0, xs_s1)`` (elements): fp32
  ``row`` or ``col`` ``[T, G]`` (the kernel reads their bits; the op passes the fp32 tensor as
  is), or packed ``ue8m0`` int32 ``[T, ceil(G / 4)]``, byte ``g % 4`` of word ``g // 4``;
  ``G = hidden // 32``.
* ``out``: float8_e4m3fn ``[num_tokens, hidden]``, contiguous.
* ``out_sf``: the output scales as the op returns them, same conventions, for blocks of
  ``block_m x block_k``: ``[os_rows, os_cols]`` words with strides ``(os_s0, os_s1)``.
* ``in_kind``, ``out_kind``: 0 row, 1 col (both fp32 words: strides tell them apart), 2 ue8m0.

Rules the op checks: ``hidden % 64 == 0``; 16-byte aligned pointers (the kernel needs only 4 bytes
for the scales; the op copies a misaligned scale view); int32 element counts.

Math (tile_kernels' lossless rule): ``e`` = the biased exponent of each input scale (fp32 bits
>> 23, or the UE8M0 byte); per output block ``E = max(e) - 6`` (0 when below 6; input groups
past the edges excluded); the output scale is ``2**(E - 127)`` (fp32 bits ``E << 23``, or byte
``E``) and every value is ``decode(code) * 2**(e - E)`` rounded to e4m3, exact whenever
``e >= E - 5`` (the largest input scale at most 2**11 times the smallest in the block).
tile_kernels traps on a violation (device assert); this kernel never traps: such values are
scaled by ``2**(clamp(e - E + 127, 1, 254) - 127)`` and rounded (RNE, saturating), i.e. lose
their low bits.  Unused bytes of the last UE8M0 group of four are written as 0.

Design: one 16-byte load = 32 e2m1 codes = exactly one input scale group.  Lanes run along
channels (8 per 256-channel tile row), a thread owns ``K`` rows of its column; block (1, 128):
64-row tiles, the four lanes of an output group join by xor-shuffles; blocks (32, 32) and
(128, 128): the tile is one block row high, and the exponent max goes through shuffles and one
shared-memory exchange (``per_block_cast.tile_plan``).  Block (1, 128), where the group's shift
``e - E`` is -5..6 (every value exact: always, for inputs within the rule): the e4m3 bytes come
from a table, two ``prmt`` per four values, one looking the magnitude's byte up in two words that
hold the eight magnitudes' bytes for this shift (:func:`lossless_tables`), one placing the sign
bits.  Otherwise (the block shapes of several rows, and values that lose bits) each value's
magnitude code gives the fp32 bits directly (``0x3F000000 + (code << 22)``, 0.5 for code 1, 0
for code 0), one fp32 multiply applies the power of two, the sign bit is copied and
``cvt.rn.satfinite`` packs e4m3.  Measured on the H200 at 8192 x 7168 (2026-12-03): the table
took (1, 128) from 53.5 to 41.9 us, but (128, 128) from 58.0 to 64.4 us, so only (1, 128) has it.
Each row's 32 bytes go out as two 16-byte stores.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl
from .per_block_cast import shuffle_masks

BLOCKS = ((1, 128), (32, 32), (128, 128))
VEC = 32  # e2m1 values per 16-byte load = channels per input scale
TN = 256  # tile width in channels (8 lanes per row)


def _view(buf, shape, dtype: str):
    """A reinterpreting view of ``buf``'s data (build inline, never bind it to a name)."""
    return T.Tensor(shape, dtype, buf.data)


def _f32(bits):
    return T.reinterpret(bits, "float32")


def plan(block_m: int, block_k: int) -> dict:
    """Tile and thread layout of one variant."""
    C = TN // VEC
    threads = 128 if block_m == 32 else 256
    R = threads // C
    tm = 64 if block_m == 1 else block_m
    L = block_k // VEC
    return {"threads": threads, "C": C, "R": R, "tm": tm, "K": tm // R, "L": L, "NB": TN // block_k,
            "slots": threads // 32, "masks": shuffle_masks(C, L) if block_m > 1 else shuffle_masks(32, L)}


def e4m3_of_code(code, scale):
    """e4m3 of ``decode_e2m1(code) * scale`` (code an int32 nibble, scale a power of two)."""
    mag = code & 7
    bits = T.if_then_else(mag >= 2, T.Cast("uint32", 0x3F000000 + (mag << 22)),
                          T.if_then_else(mag == 1, T.uint32(0x3F000000), T.uint32(0)))
    value = T.reinterpret(_f32(bits) * scale, "uint32") | (T.Cast("uint32", code & 8) << T.uint32(28))
    return T.Cast("float8_e4m3fn", _f32(value))


# The smallest shift e - E at which every e2m1 value times 2**shift is a normal e4m3 (0.5 * 2**-5 =
# 2**-6); the output scale's rule bounds it above by 6 (6 * 2**6 = 384 <= 448).
EXACT_MIN_SHIFT = -5


def byte_perm(lo, hi, selector):
    """PTX ``prmt``: byte ``n`` of the result is byte ``selector >> 4n & 7`` of ``hi:lo``."""
    return T.call_extern("uint32", "__byte_perm", lo, hi, selector)


def lossless_tables(shift):
    """The e4m3 bytes of the eight e2m1 magnitudes times ``2**shift`` (shift -5..6: all normal,
    exact), as two words for :func:`byte_perm`: magnitude ``m``'s byte is byte ``m``.  Magnitude
    0 is 0; 0.5 .. 6 are 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C plus ``8 * shift`` (the
    exponent field).  The words hold those minus 0x28 (magnitude 0's byte: 0) plus
    ``8 * shift + 40`` (0..88) in each byte, so no byte carries into the next."""
    add = T.Cast("uint32", 8 * shift + 40)
    return T.uint32(0x14100800) + add * T.uint32(0x01010100), T.uint32(0x24201C18) + add * T.uint32(0x01010101)


@T.macro
def write_sf(out_sf, os_bytes, os_s0, os_s1, out_kind, r, og, num_og, e):
    """Scale of output block (r, og): 2**(e - 127) as fp32 bits (row / col) or its UE8M0 byte,
    byte ``og % 4`` of word ``(r, og // 4)``.  The parameters carry the kernel parameters' own
    names: a macro argument bound to another name renames the variable, hence the parameter."""
    if out_kind != 2:
        out_sf[r, og] = T.Cast("int32", e) << 23
    else:
        _view(out_sf, os_bytes, "uint8")[(r * os_s0 + (og // 4) * os_s1) * 4 + og % 4] = T.Cast("uint8", e)
        if og == num_og - 1:  # zero the unused bytes of the last group of four
            for p in T.unroll(3):
                if og % 4 + p + 1 < 4:
                    _view(out_sf, os_bytes, "uint8")[(r * os_s0 + (og // 4) * os_s1) * 4 + og % 4 + p + 1] = T.uint8(0)


def per_block_cast_lossless(block_m: int, block_k: int):
    """Build the PrimFunc for one output block shape."""
    if (block_m, block_k) not in BLOCKS:
        raise ValueError(f"per_block_cast_lossless: unsupported output block ({block_m}, {block_k})")
    p = plan(block_m, block_k)
    threads, C, R, tm, K, L, NB, slots, masks = (p[k] for k in ("threads", "C", "R", "tm", "K", "L", "NB", "slots", "masks"))
    assert C * R == threads and K * R == tm and L * NB == C
    n_masks = len(masks)
    n_low = sum(1 for m in masks if m < L)
    num_tokens, hidden, x_cols = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("x_cols")
    xs_cols, xs_s0, xs_s1 = T.dynamic("xs_cols"), T.dynamic("xs_s0"), T.dynamic("xs_s1")
    os_rows, os_cols, os_s0, os_s1 = (T.dynamic(n) for n in ("os_rows", "os_cols", "os_s0", "os_s1"))
    x_words = (num_tokens, hidden // 64 * 8)
    out_bytes = (num_tokens, hidden // 64 * 64)
    out_words = (num_tokens, hidden // 64 * 16)
    os_bytes = (((os_rows - 1) * os_s0 + (os_cols - 1) * os_s1 + 1) * 4,)  # the words' extent, as bytes
    num_og = T.ceildiv(hidden, block_k)
    table = block_m == 1  # the table path: measured faster at (1, 128) only (see the module docstring)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, x_cols), "int8"),
        x_sf: T.StridedTensor((num_tokens, xs_cols), (xs_s0, xs_s1), "int32"),
        out: T.Tensor((num_tokens, hidden), "float8_e4m3fn"),
        out_sf: T.StridedTensor((os_rows, os_cols), (os_s0, os_s1), "int32"),
        in_kind: T.int32,
        out_kind: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, tm), T.ceildiv(hidden, TN), threads=threads) as (bx, by):
            tid = T.get_thread_binding()
            red = T.alloc_shared((slots, NB), "int32")
            xw = T.alloc_local((K, 4), "uint32")
            ein = T.alloc_local((K,), "int32")
            eout = T.alloc_local((K,), "int32")
            fp8 = T.alloc_local((VEC,), "float8_e4m3fn")
            ow = T.alloc_local((8,), "uint32")
            emax = T.alloc_var("int32")
            scale = T.alloc_var("float32")
            c = tid % C
            g = tid // C
            cv = by * C + c  # input scale group = 16-byte vector index along the row
            vec_ok = cv < hidden // VEC
            for k in T.unroll(K):
                ein[k] = 0
                if vec_ok and bx * tm + g + R * k < num_tokens:
                    for w in T.vectorized(4):
                        xw[k, w] = _view(x, x_words, "uint32")[bx * tm + g + R * k, cv * 4 + w]
                    if in_kind != 2:  # fp32: the biased exponent (and the sign, 0 for a valid scale)
                        ein[k] = T.Cast("int32", T.Cast("uint32", x_sf[bx * tm + g + R * k, cv]) >> T.uint32(23))
                    else:
                        ein[k] = T.Cast("int32", (T.Cast("uint32", x_sf[bx * tm + g + R * k, cv // 4])
                                                  >> T.Cast("uint32", 8 * (cv % 4))) & T.uint32(255))
                else:
                    for w in T.unroll(4):
                        xw[k, w] = T.uint32(0)
            if block_m == 1:
                for k in T.unroll(K):
                    eout[k] = ein[k]
                    for i in T.unroll(n_masks):
                        eout[k] = T.max(eout[k], T.shfl_xor(eout[k], 1 << i))
                    eout[k] = T.max(eout[k] - 6, 0)
                    if c % L == 0 and vec_ok and bx * tm + g + R * k < num_tokens:
                        write_sf(out_sf, os_bytes, os_s0, os_s1, out_kind, bx * tm + g + R * k, cv // L, num_og, eout[k])
            else:
                emax = 0
                for k in T.unroll(K):
                    emax = T.max(emax, ein[k])
                for i in T.unroll(n_masks):
                    emax = T.max(emax, T.shfl_xor(emax, T.if_then_else(i < n_low, 1 << i, C << (i - n_low))))
                if c % L == 0 and tid % 32 < C:
                    red[tid // 32, c // L] = emax
                T.sync_threads()
                for s in T.unroll(slots):
                    emax = T.max(emax, red[s, c // L])
                emax = T.max(emax - 6, 0)
                for k in T.unroll(K):
                    eout[k] = emax
                if g == 0 and c % L == 0 and by * NB + c // L < num_og:
                    write_sf(out_sf, os_bytes, os_s0, os_s1, out_kind, bx, by * NB + c // L, num_og, emax)
            for k in T.unroll(K):
                if vec_ok and bx * tm + g + R * k < num_tokens:
                    if table and ein[k] - eout[k] >= EXACT_MIN_SHIFT:  # every value exact: bytes from a table
                        lut_lo, lut_hi = lossless_tables(ein[k] - eout[k])
                        for w in T.unroll(8):
                            codes = xw[k, w // 2] >> T.uint32(16 * (w % 2))
                            ow[w] = byte_perm(lut_lo, lut_hi, codes & T.uint32(0x7777)) | byte_perm(
                                T.uint32(0x8000), T.uint32(0), (codes >> T.uint32(3)) & T.uint32(0x1111))
                        for w in T.vectorized(8):
                            _view(out, out_words, "uint32")[bx * tm + g + R * k, cv * 8 + w] = ow[w]
                    else:  # some values lose low bits: scale in fp32, round to e4m3 (RNE, saturating)
                        scale = _f32(T.Cast("uint32", T.min(T.max(ein[k] - eout[k] + 127, 1), 254)) << T.uint32(23))
                        for e in T.unroll(VEC):
                            fp8[e] = e4m3_of_code(T.Cast("int32", (xw[k, e // 8] >> T.uint32(4 * (e % 8))) & T.uint32(15)),
                                                  scale)
                        for e in T.vectorized(VEC):
                            _view(out, out_bytes, "float8_e4m3fn")[bx * tm + g + R * k, cv * VEC + e] = fp8[e]

    return main


KERNELS = (
    KernelDecl(
        name="quant.per_block_cast_lossless",
        factory=per_block_cast_lossless,
        grid=tuple({"block_m": m, "block_k": k} for m, k in BLOCKS),
        outputs=("out", "out_sf"),
        # the user's tensors as they are: uint8 packed data, fp32 scales (read as their bits)
        also_dtypes={"x": ("uint8",), "x_sf": ("float32",), "out_sf": ("float32",)},
        doc="packed e2m1 with (1, 32) power-of-two scales -> e4m3 with (block_m, block_k) scales, exact; "
            "sf as the user's 4-byte words with run-time strides, in_kind/out_kind 0 row / 1 col / 2 ue8m0.",
    ),
)

__all__ = ["KERNELS", "per_block_cast_lossless", "plan"]
