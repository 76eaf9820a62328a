"""Shared TileLang building blocks of the quantization kernels (formats, scale factors, layouts).

Everything here is meant to be called while a PrimFunc is traced.  All helpers are
**expression builders** (plain functions returning a ``PrimExpr`` or an index tuple): they work
anywhere, in a ``T.prim_func`` body or inside a ``T.macro``; the result is an expression, so
bind it to a ``T.alloc_var`` (or a local buffer element) when it is used more than once.

Bit-exactness contract, the same arithmetic as ``tile_kernels.torch.cast`` (our
``quant_ref.cast``):

* ``sf = max(amax, clamp_min) / fmt_max`` and ``sf_inv = fmt_max / max(amax, clamp_min)``: two
  IEEE round-to-nearest fp32 divisions (``T.ieee_fdiv``, so even a fast-math build keeps them);
  ``sf_inv`` is *not* ``1 / sf``.  ``clamp_min``: e4m3 ``1e-4`` (as fp32), e2m1 ``6 * 2**-126``.
* ``round_sf``: the bits of ``sf`` are rounded up to a power of two,
  ``(bits + 0x7FFFFF) & 0x7F800000``; ``sf_inv`` is then the exact inverse power of two, and
  the UE8M0 byte is the biased exponent ``bits >> 23``.
* the quantized value is ``x_fp32 * sf_inv`` (one fp32 multiply; a dequantized input is
  ``data_fp32 * in_sf`` first, another multiply: no add, so no FMA contraction can change bits).
* e4m3: round to nearest even with saturation to +-448 (``cvt.rn.satfinite.e4m3x2.f32``, what
  TileLang emits for a float32 -> float8_e4m3fn cast, scalar or vectorized).
* e2m1: round to nearest even onto {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6, sign bit kept
  (also for -0).  Nibble ``s e e m``; a packed byte holds element ``2i`` in its low nibble and
  ``2i + 1`` in its high nibble.

Scale-factor layouts (kernel orientation, see ``ops/quant/_sf.py``):

* ``"row"``: fp32 ``[rows, groups]``;
* ``"col"``: fp32 ``[groups, rows]`` (row stride padded, a runtime symbol);
* ``"ue8m0"``: uint8 ``[ceil(groups / 4), 4 * rows]``: byte ``4 * r + g % 4`` of row ``g // 4``;
* ``"f32"``: fp32 ``[d0, d1]`` whose orientation is a runtime flag ``col_major`` (0: ``[r, g]``,
  1: ``[g, r]``): one compiled variant serves both fp32 layouts.

Public API
----------
Constants: ``FMT_MAX``, ``CLAMP_MIN``, ``OUT_DTYPE`` (TileLang dtype of each output fmt).

Scale factors: ``sf_from_amax(amax, fmt, round_sf)`` -> ``(sf, sf_inv)``;
``round_sf_bits(sf)``; ``ue8m0_byte(sf)``; ``ue8m0_to_float(byte)``.

Conversions: ``to_e4m3(v)``; ``e2m1_code(v)`` (one nibble); ``e2m1_pack2(a, b)`` (one byte);
``e2m1_pack_word(values)`` (8 values -> uint32); decoders ``bf16_lo``/``bf16_hi`` (a uint32 word of
two bf16), ``e4m3_byte_to_float``, ``e2m1_nibble_to_float``, ``word_byte``, ``word_nibble``.

Layouts: ``sf_index(kind, row, grp, col_major=None)`` (store with
``buf[sf_index(..)] = sf_store_value(kind, sf)``), ``sf_store_value(kind, sf)``,
``load_sf(buf, kind, row, grp, col_major=None)`` (raw value: fp32, or the uint8 byte for ue8m0),
``load_sf_f32(buf, kind, row, grp, col_major=None)`` (decoded to fp32).

Why no macros here: TileLang binds a macro's arguments by parameter name; a PrimFunc parameter
passed under another name gets *renamed* (its kernel parameter too), and a caller's
``T.alloc_var`` that shares a parameter's name is *assigned*.  Expression builders have neither
hazard.  Writing your own macros: pass scalars under the names the caller uses.
"""

import tilelang.language as T

FMT_MAX = {"e4m3": 448.0, "e2m1": 6.0}
CLAMP_MIN = {"e4m3": 1e-4, "e2m1": 6.0 * 2.0**-126}
# What the kernels store per output fmt: e4m3 as float8_e4m3fn, e2m1 packed two per int8 byte.
OUT_DTYPE = {"e4m3": "float8_e4m3fn", "e2m1": "int8"}
SF_KINDS = ("row", "col", "ue8m0", "f32")

_EXP_MASK = 0x7F800000
_MANT_ONES = 0x007FFFFF


def _u32(v):
    return T.reinterpret(v, "uint32")


def _f32(bits):
    return T.reinterpret(bits, "float32")


def _flag(value):
    """A Python bool stays a bool (compile-time branch); anything else is a runtime PrimExpr."""
    return value if isinstance(value, bool) else value != 0


# --- scale factors ---------------------------------------------------------------------------------


def round_sf_bits(sf):
    """uint32 bits of ``sf`` rounded up to a power of two (``sf`` positive, normal)."""
    return (_u32(sf) + T.uint32(_MANT_ONES)) & T.uint32(_EXP_MASK)


def sf_from_amax(amax, fmt: str, round_sf=False):
    """``(sf, sf_inv)`` fp32 expressions for a group whose absolute maximum is ``amax`` (fp32).

    ``round_sf``: a Python bool (compile time) or a runtime int/bool PrimExpr (a ``Select``
    between both results; uniform, nearly free).  With rounding, ``sf`` is a power of two and
    ``sf_inv`` its exact inverse.  Bind ``amax`` to a variable first: it is used several times.
    """
    clamped = T.max(amax, T.float32(CLAMP_MIN[fmt]))
    fmax = T.float32(FMT_MAX[fmt])
    sf = T.ieee_fdiv(clamped, fmax)
    sf_inv = T.ieee_fdiv(fmax, clamped)
    if isinstance(round_sf, bool) and not round_sf:
        return sf, sf_inv
    rbits = round_sf_bits(sf)
    # 2**(127 - e) for sf = 2**(e - 127): biased exponent 254 - e
    r_sf, r_inv = _f32(rbits), _f32(T.uint32(254 << 23) - rbits)
    if isinstance(round_sf, bool):
        return r_sf, r_inv
    flag = _flag(round_sf)
    return T.Select(flag, r_sf, sf), T.Select(flag, r_inv, sf_inv)


def ue8m0_byte(sf):
    """The UE8M0 byte (biased exponent) of a power-of-two fp32 ``sf``, as uint8."""
    return T.Cast("uint8", _u32(sf) >> T.uint32(23))


def ue8m0_to_float(byte):
    """fp32 value ``2**(byte - 127)`` of a UE8M0 byte (any integer dtype)."""
    return _f32(T.Cast("uint32", byte) << T.uint32(23))


# --- conversions -----------------------------------------------------------------------------------


def to_e4m3(v):
    """``float8_e4m3fn`` of fp32 ``v``: RNE, saturating to +-448 (NaN stays NaN).

    A scalar cast; in a ``T.vectorized`` loop writing a local fp8 buffer TileLang emits the
    same conversion two lanes at a time (``__nv_cvt_float2_to_fp8x2(.., __NV_SATFINITE, ..)``).
    """
    return T.Cast("float8_e4m3fn", v)


class _TirOps:
    """The primitive operations of the e2m1 encoder, as TileLang expression builders."""

    bits = staticmethod(_u32)
    as_f32 = staticmethod(_f32)
    fabs = staticmethod(T.abs)
    f32 = staticmethod(T.float32)
    u32 = staticmethod(T.uint32)
    fmin = staticmethod(T.min)  # fp32: CUDA min(float, float) = fminf: a NaN operand loses
    fmax = staticmethod(T.max)


class _NumpyOps:
    """The same primitives on numpy arrays: the CPU emulation that tests hold against
    ``quant_ref.e2m1_bits``; it runs the very steps of ``_e2m1_steps``."""

    @staticmethod
    def bits(v):
        import numpy as np

        return np.asarray(v, dtype=np.float32).view(np.uint32)

    @staticmethod
    def as_f32(b):
        import numpy as np

        return np.asarray(b, dtype=np.uint32).view(np.float32)

    @staticmethod
    def fabs(v):
        import numpy as np

        return np.abs(np.asarray(v, dtype=np.float32))

    @staticmethod
    def f32(c):
        import numpy as np

        return np.float32(c)

    @staticmethod
    def u32(c):
        import numpy as np

        return np.uint32(c)

    @staticmethod
    def fmin(a, b):
        import numpy as np

        return np.fmin(a, b)  # IEEE minNum, like fminf / PTX min.f32: NaN operand loses

    @staticmethod
    def fmax(a, b):
        import numpy as np

        return np.fmax(a, b)


def _e2m1_steps(ops, v):
    """The e2m1 nibble of fp32 ``v`` (uint32) built from ``ops`` primitives; see ``e2m1_code``."""
    a = ops.fmin(ops.fabs(v), ops.f32(6.0))  # NaN -> 6 (minNum), inf and beyond -> 6
    step2 = ops.fmax(ops.as_f32(ops.bits(a) & ops.u32(0x7F800000)), ops.f32(1.0))
    # step2 = max(2**floor(log2 a), 1) is twice the e2m1 grid step around a (0.5 below 2, the
    # subnormal step included, then half the binade).  magic = step2 * (2**22 + 3) is exact and
    # lies in the binade whose fp32 ulp is that step, 6 ulps above its power of two; so a + magic
    # (one rounding, an FMA contraction changes nothing) rounds a onto the grid, ties to even
    # (6 is even), and its low bits hold 6 + n, n = a / step (at most 4).
    t = ops.bits(a + step2 * ops.f32(4194307.0))
    # t >> 22 = 2 * biased exponent = 298 + 2 e (step2 = 2**e); code = 2 e + n = (t + (t >> 22)) % 8
    # (304 = 6 + 298 is 0 mod 8).
    mag = t + (t >> ops.u32(22))
    sign = ops.bits(v) >> ops.u32(28)  # bit 3: the sign; bits 0-2 are replaced below
    return sign ^ ((mag ^ sign) & ops.u32(7))  # bits 0-2 from mag, bit 3 from sign


def e2m1_code(v):
    """The e2m1 nibble (uint32 in [0, 15]) of fp32 ``v``: RNE, saturating at 6, sign kept.

    Bit-exact with ``quant_ref.e2m1_bits`` for every fp32 input (inf and NaN give magnitude 7,
    -0 and negative NaN keep the sign); checked over all 2**32 inputs.  The FPU does the
    rounding: ``a = min(|v|, 6)`` plus ``magic = max(2**floor(log2 a), 1) * (2**22 + 3)``
    rounds ``a`` to the e2m1 grid step (0.5 below 2, 1 in [2, 4), 2 in [4, 6]) with ties to even, and
    the code is read from the sum's bits.  ``magic`` is an exact product, so an FMA contraction
    of ``a + magic`` gives the same bits.  nvcc 13 / sm_90: 8 SASS instructions per value
    (FMNMX, LOP3, FMNMX, FFMA, LEA.HI, LOP3, SHF + LOP3 for the sign; packing adds one IMAD),
    instead of about 24 for seven compares and their sum.
    """
    return _e2m1_steps(_TirOps, v)


def _e2m1_code_numpy(values):
    """numpy uint32 codes of fp32 ``values`` by the very steps of ``e2m1_code`` (a CPU emulation
    for the tests; kernels never call it)."""
    return _e2m1_steps(_NumpyOps, values)


def e2m1_pack2(even, odd):
    """One packed e2m1 byte (uint8): ``even`` in the low nibble, ``odd`` in the high one."""
    return T.Cast("uint8", e2m1_code(even) | (e2m1_code(odd) << T.uint32(4)))


def e2m1_pack_word(values):
    """uint32 holding 8 consecutive e2m1 values (``values``: 8 fp32 expressions, element 0 in
    the lowest nibble: the little-endian byte order of the packed tensor)."""
    word = e2m1_code(values[0])
    for j in range(1, 8):
        word = word | (e2m1_code(values[j]) << T.uint32(4 * j))
    return word


def bf16_lo(word):
    """fp32 of the bf16 in the low half of a uint32 word (the even element)."""
    return _f32(word << T.uint32(16))


def bf16_hi(word):
    """fp32 of the bf16 in the high half of a uint32 word (the odd element)."""
    return _f32(word & T.uint32(0xFFFF0000))


def word_byte(word, j: int):
    """Byte ``j`` (0 = lowest address) of a uint32 word, as uint32."""
    return (word >> T.uint32(8 * j)) & T.uint32(0xFF)


def word_nibble(word, j: int):
    """Nibble ``j`` (0 = low nibble of the lowest byte) of a uint32 word, as uint32."""
    return (word >> T.uint32(4 * j)) & T.uint32(0xF)


def e4m3_byte_to_float(b):
    """Exact fp32 of an e4m3 byte (uint32 in [0, 255]); NaN bytes are not special-cased.

    Sign, exponent and mantissa moved into fp32 position (exponent field unchanged, so the
    value is 2**-120 times too small, denormal for e4m3 subnormals) and rescaled exactly.
    """
    bits = ((b & T.uint32(0x80)) << T.uint32(24)) | ((b & T.uint32(0x7F)) << T.uint32(20))
    return _f32(bits) * T.float32(2.0**120)


def e2m1_nibble_to_float(n):
    """Exact fp32 of an e2m1 nibble (uint32 in [0, 15]), -0 for nibble 8 (same trick as e4m3)."""
    bits = ((n & T.uint32(8)) << T.uint32(28)) | ((n & T.uint32(7)) << T.uint32(22))
    return _f32(bits) * T.float32(2.0**126)


# --- scale-factor layouts --------------------------------------------------------------------------


def sf_index(kind: str, row, grp, col_major=None):
    """Index tuple of (row, group)'s scale in a kernel-side sf buffer: ``buf[sf_index(...)]``.

    ``kind``: ``"row"``, ``"col"``, ``"ue8m0"`` (fixed layouts) or ``"f32"`` (fp32, orientation
    chosen at run time by ``col_major`` != 0; both indices become selects, one store)."""
    if kind == "row":
        return (row, grp)
    if kind == "col":
        return (grp, row)
    if kind == "ue8m0":
        return (grp // 4, row * 4 + grp % 4)
    if kind == "f32":
        flag = col_major != 0
        return (T.if_then_else(flag, grp, row), T.if_then_else(flag, row, grp))
    raise ValueError(f"sf_index: kind must be one of {SF_KINDS} (got {kind!r})")


def sf_store_value(kind: str, sf):
    """What a buffer of ``kind`` stores for scale ``sf`` (fp32): ``sf`` itself, or for
    ``"ue8m0"`` its exponent byte (``sf`` must then be a power of two, i.e. ``round_sf``).
    Usage: ``buf[F.sf_index(kind, r, g, flag)] = F.sf_store_value(kind, sf)``."""
    return ue8m0_byte(sf) if kind == "ue8m0" else sf


def load_sf(buf, kind: str, row, grp, col_major=None):
    """The raw stored scale of (row, grp): fp32, or the uint8 byte for ``"ue8m0"``."""
    return buf[sf_index(kind, row, grp, col_major)]


def load_sf_f32(buf, kind: str, row, grp, col_major=None):
    """The scale of (row, grp) as fp32 (a UE8M0 byte decoded to ``2**(byte - 127)``)."""
    raw = load_sf(buf, kind, row, grp, col_major)
    return ue8m0_to_float(raw) if kind == "ue8m0" else raw


__all__ = [
    "CLAMP_MIN", "FMT_MAX", "OUT_DTYPE", "SF_KINDS",
    "bf16_hi", "bf16_lo", "e2m1_code", "e2m1_nibble_to_float", "e2m1_pack2", "e2m1_pack_word",
    "e4m3_byte_to_float", "load_sf", "load_sf_f32", "round_sf_bits", "sf_from_amax", "sf_index",
    "sf_store_value", "to_e4m3", "ue8m0_byte", "ue8m0_to_float", "word_byte", "word_nibble",
]
