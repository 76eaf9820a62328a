"""``quant.cast_back_e5m6``: dequantize packed E5M6 data with block scales to bf16 / fp32.

E5M6 is the upper 12 bits of an IEEE half (sign, 5 exponent bits, 6 mantissa bits); eight codes
``h0..h7`` fill three little-endian uint32 words ``w0 = h0<<20 | h1<<8 | h2>>4``,
``w1 = h2<<28 | h3<<16 | h4<<4 | h5>>8``, ``w2 = h5<<24 | h6<<12 | h7``.
``out[t, c] = half_value(code) * sf(t >> shift_t, c >> shift_c)``: fp32 multiply, one rounding to
the output dtype, as the torch reference does.  Parameters, in order:

* ``x``: ``[num_tokens, x_bytes]`` uint8, ``x_bytes = hidden * 3 // 2``, contiguous.
* ``x_sf``: the scales in kernel orientation (``row`` / ``col`` fp32, ``ue8m0`` uint8; see
  ``cast_back.py``), runtime row stride ``sf_stride``.
* ``out``: ``[num_tokens, hidden]`` bfloat16 or float32, contiguous.
* ``shift_t``, ``shift_c``: block index = index >> shift (30 for a block covering the dimension).

Rules the op checks: ``hidden % 8 == 0``; 16-byte aligned pointers; int32 element counts.

Design: units of eight values (12 input bytes, 16 or 32 output bytes), flattened over the whole
tensor; a thread owns ``UNROLL`` units spaced ``THREADS`` apart, so a warp's three word loads
cover 384 contiguous bytes and its 16-byte stores 512 (bf16) or 1024 (fp32) contiguous bytes.
Codes are decoded with integer arithmetic (exact, no half types): normal codes move their
exponent and mantissa into fp32 bits, subnormal codes are ``mantissa * 2**-20``.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl, product
from ._formats import load_sf_f32
from .cast_back import SF_KINDS

THREADS = 256
UNROLL = 4
_OUT_DTYPES = ("bfloat16", "float32")


def _view(buf, shape, dtype: str):
    """A reinterpreting view of ``buf``'s data (built inline: a bound view renames the parameter)."""
    return T.Tensor(shape, dtype, buf.data)


def e5m6_code(raw, u, v):
    """The 12-bit code (uint32) of value ``v`` (0..7, a loop variable: constant once unrolled) of
    the group in words ``raw[u, 0..2]``: bits ``[12 v, 12 v + 12)`` counted from the top of the
    96-bit string, i.e. ``b = 12 v % 32`` bits into word ``12 v // 32``, spilling into the next
    word when ``b > 20``."""
    bit = 12 * v
    word = bit // 32
    b = T.Cast("uint32", bit % 32)
    hi = raw[u, word]
    lo = raw[u, T.min(word + 1, 2)]
    spans = (hi << (b - T.uint32(20))) | (lo >> (T.uint32(52) - b))
    return T.if_then_else(bit % 32 <= 20, hi >> (T.uint32(20) - b), spans) & T.uint32(0xFFF)


def decode_e5m6(code):
    """Exact fp32 value of a 12-bit E5M6 code (int32 0..4095), as the half it truncates."""
    mag = code & 0x7FF
    special = T.reinterpret((mag << 17) | 0x7F800000, "float32")  # exponent 31: inf / NaN
    normal = T.reinterpret((mag << 17) + (112 << 23), "float32")
    subnormal = T.Cast("float32", mag) * T.float32(2.0**-20)
    value = T.if_then_else(mag >= 0x7C0, special, T.if_then_else(mag >= 0x40, normal, subnormal))
    return T.if_then_else(code >= 0x800, -value, value)


def cast_back_e5m6(out_dtype: str, sf_kind: str):
    """Build the PrimFunc for one (output dtype, scale layout)."""
    if out_dtype not in _OUT_DTYPES or sf_kind not in SF_KINDS:
        raise ValueError(f"cast_back_e5m6: unsupported variant out_dtype={out_dtype!r} sf_kind={sf_kind!r}")
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    x_bytes = T.dynamic("x_bytes")  # hidden * 3 // 2 (checked by the op)
    sf_stride = T.dynamic("sf_stride")
    if sf_kind == "row":
        sf_shape, sf_dtype = (T.dynamic("sf_m"), T.dynamic("sf_k")), "float32"
    elif sf_kind == "col":
        sf_shape, sf_dtype = (T.dynamic("sf_k"), T.dynamic("sf_m")), "float32"
    else:
        sf_shape, sf_dtype = (T.dynamic("sf_k4"), T.dynamic("sf_m4")), "uint8"
    units_per_row = hidden // 8
    num_units = num_tokens * units_per_row
    per_block = THREADS * UNROLL

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, x_bytes), "uint8"),
        x_sf: T.StridedTensor(sf_shape, (sf_stride, 1), sf_dtype),
        out: T.Tensor((num_tokens, hidden), out_dtype),
        shift_t: T.int32,
        shift_c: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_units, per_block), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            raw = T.alloc_local((UNROLL, 3), "uint32")
            vals = T.alloc_local((8,), "float32")
            res = T.alloc_local((8,), out_dtype)
            q = T.alloc_var("int32")
            m = T.alloc_var("int32")
            c0 = T.alloc_var("int32")
            sf = T.alloc_var("float32")
            code = T.alloc_var("int32")
            for u in T.unroll(UNROLL):
                if bx * per_block + u * THREADS + tid < num_units:
                    for w in T.unroll(3):
                        raw[u, w] = _view(x, (num_units * 3,), "uint32")[(bx * per_block + u * THREADS + tid) * 3 + w]
            for u in T.unroll(UNROLL):
                q = bx * per_block + u * THREADS + tid
                if q < num_units:
                    m = T.truncdiv(q, units_per_row) >> shift_t
                    c0 = T.truncmod(q, units_per_row) * 8
                    for v in T.unroll(8):
                        code = T.Cast("int32", e5m6_code(raw, u, v))  # a variable: keeps decode small
                        vals[v] = decode_e5m6(code)
                    if shift_c >= 3:
                        sf = load_sf_f32(x_sf, sf_kind, m, c0 >> shift_c)
                        for v in T.unroll(8):
                            res[v] = T.Cast(out_dtype, vals[v] * sf)
                    else:
                        for v in T.unroll(8):
                            res[v] = T.Cast(out_dtype, vals[v] * load_sf_f32(x_sf, sf_kind, m, (c0 + v) >> shift_c))
                    for v in T.vectorized(8):
                        _view(out, (num_units * 8,), out_dtype)[q * 8 + v] = res[v]

    return main


KERNELS = (
    KernelDecl(
        name="quant.cast_back_e5m6",
        factory=cast_back_e5m6,
        grid=product(out_dtype=list(_OUT_DTYPES), sf_kind=list(SF_KINDS)),
        outputs=("out",),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="out = e5m6 value * block scale; packed E5M6 (uint8) -> bf16 / fp32, scales row / col / ue8m0.",
    ),
)

__all__ = ["KERNELS", "cast_back_e5m6", "decode_e5m6", "e5m6_code"]
