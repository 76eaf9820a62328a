"""``quant.per_token_cast_e5m6``: bf16 -> packed E5M6 with one scale per token (fp32 input:
``quant.per_token_cast_e5m6_fp32``, the same algorithm with 4 cached units per thread).

Per token: ``amax = max |x|``; ``sf = max(amax, 1e-4) / 65024`` and ``sf_inv = 65024 / max(amax,
1e-4)`` (two IEEE divisions), or with ``round_sf`` sf rounded up to a power of two and sf_inv its
exact inverse.  Each ``v = x_fp32 * sf_inv`` becomes a 12-bit code: the top 12 bits of the half
that truncates ``v`` toward zero, plus one when the 17 low bits of ``v``'s fp32 pattern exceed
0x10000 (or equal it with an odd code); eight codes pack into three uint32 words (see
``cast_back_e5m6.py``).  Bit-for-bit the torch reference (``quant_ref.cast_to_e5m6``).

Parameters, in order:

* ``x``: ``[num_tokens, hidden]`` bfloat16, row stride ``x_stride`` (runtime), unit column
  stride.  (The factory also builds float32; the grid leaves it to ``quant.per_token_cast_e5m6_fp32``,
  which measured faster: 8 blocks per SM instead of 5.)
* ``out``: ``[num_tokens, out_bytes]`` uint8, ``out_bytes = hidden * 3 // 2``, contiguous.
* ``out_sf``: kernel orientation of a ``(1, hidden)``-block scale tensor: ``row`` fp32
  ``[num_tokens, 1]``; ``col`` fp32 ``[1, num_tokens]``; ``ue8m0`` uint8 ``[1, 4 * num_tokens]``
  (byte ``4 t`` the exponent, bytes ``4 t + 1..3`` written 0); runtime row stride ``sf_stride``.
* ``round_sf`` (int, 0/1; the ``ue8m0`` variant needs 1), ``tokens_per_block`` (1, 2 or 4).

Rules the op checks: ``hidden % 8 == 0``; x's row stride and pointer 16-byte aligned; int32
element counts.

Design: a block of 4 warps serves ``tokens_per_block`` tokens; a token's ``32 * 4 /
tokens_per_block`` threads own its 8-value units round robin (unit ``j`` of the row: 16 (bf16)
or 32 (fp32) input bytes, 12 output bytes), so a warp's loads cover 512 contiguous bytes.  The
first ``CACHED`` units of each thread stay in registers between the amax pass and the cast pass
(a full 7168-wide bf16 row with one token per block); units past those (hidden above
``CACHED * 8 * 128``) are read twice, the second time from L1/L2.  The amax is reduced with warp
shuffles and a 4-float shared array.  The op picks ``tokens_per_block`` so that short rows keep
every warp busy (4 tokens for hidden <= 2048, 2 up to 4096, else 1).
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl, product

THREADS = 128
CACHED = 8  # units per thread kept in registers between the two passes
E5M6_MAX = 65024.0
CLAMP_MIN = 1e-4
SF_KINDS = ("row", "col", "ue8m0")
_IN_DTYPES = {"bfloat16": 4, "float32": 8}  # uint32 words per 8-value unit


def _view(buf, shape, dtype: str):
    """A reinterpreting view of ``buf``'s data (built inline: a bound view renames the parameter)."""
    return T.Tensor(shape, dtype, buf.data)


def unit_value(words, r, k, in_dtype: str):
    """fp32 value ``k`` (0..7, a loop variable: folded once unrolled) of the unit in ``words[r, :]``."""
    if in_dtype == "float32":
        return T.reinterpret(words[r, k], "float32")
    w = words[r, k // 2]  # bf16 pair: the even element in the low half
    return T.reinterpret(T.if_then_else(k % 2 == 0, w << T.uint32(16), w & T.uint32(0xFFFF0000)), "float32")


def truncated_code(v):
    """Top 12 bits (uint32) of the half that truncates fp32 ``v`` toward zero."""
    half = T.call_extern("uint16", "__half_as_ushort", T.call_extern("float16", "__float2half_rz", v))
    return T.Cast("uint32", half) >> T.uint32(4)


def rounded_code(code, v):
    """``code`` (from :func:`truncated_code`, a variable) rounded half to even on ``v``'s 17 low
    fp32 mantissa bits, wrapped to 12 bits."""
    low = T.reinterpret(v, "uint32") & T.uint32(0x1FFFF)
    return (code + T.Cast("uint32", (code & T.uint32(1)) + low > T.uint32(0x10000))) & T.uint32(0xFFF)


def e5m6_scales(amax, round_sf):
    """(sf, sf_inv) of a token whose absolute maximum is ``amax``; ``round_sf`` a runtime int."""
    clamped = T.max(amax, T.float32(CLAMP_MIN))
    sf = T.ieee_fdiv(clamped, T.float32(E5M6_MAX))
    sf_inv = T.ieee_fdiv(T.float32(E5M6_MAX), clamped)
    # sf > 0 and normal here, so (bits - 1) >> 23 is the exponent of the next power of two, minus one
    exp = ((T.reinterpret(sf, "uint32") - T.uint32(1)) >> T.uint32(23)) + T.uint32(1)  # biased
    r_sf = T.reinterpret(exp << T.uint32(23), "float32")
    r_inv = T.reinterpret((T.uint32(254) - exp) << T.uint32(23), "float32")
    return T.Select(round_sf != 0, r_sf, sf), T.Select(round_sf != 0, r_inv, sf_inv)


def per_token_cast_e5m6(in_dtype: str, sf_kind: str):
    """Build the PrimFunc for one (input dtype, scale layout)."""
    if in_dtype not in _IN_DTYPES or sf_kind not in SF_KINDS:
        raise ValueError(f"per_token_cast_e5m6: unsupported variant in_dtype={in_dtype!r} sf_kind={sf_kind!r}")
    nw = _IN_DTYPES[in_dtype]
    per_word = 8 // nw  # input values per uint32 word
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    x_stride, out_bytes, sf_stride = T.dynamic("x_stride"), T.dynamic("out_bytes"), T.dynamic("sf_stride")
    if sf_kind == "row":
        sf_shape, sf_dtype = (num_tokens, T.dynamic("sf_k")), "float32"
    elif sf_kind == "col":
        sf_shape, sf_dtype = (T.dynamic("sf_k"), T.dynamic("sf_m")), "float32"
    else:
        sf_shape, sf_dtype = (T.dynamic("sf_k4"), T.dynamic("sf_m4")), "uint8"
    units = hidden // 8
    # x as uint32 words; the row length in words is written so that TileLang sees a multiple of 4
    # (16-byte vectors; the op guarantees x_stride is a multiple of the vector's element count)
    per_vector = 4 * per_word  # elements per 16-byte vector
    x_words = (num_tokens, x_stride // per_vector * 4)
    out_words = (num_tokens, units * 3)

    @T.prim_func
    def main(
        x: T.StridedTensor((num_tokens, hidden), (x_stride, 1), in_dtype),
        out: T.Tensor((num_tokens, out_bytes), "uint8"),
        out_sf: T.StridedTensor(sf_shape, (sf_stride, 1), sf_dtype),
        round_sf: T.int32,
        tokens_per_block: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, tokens_per_block), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            cache = T.alloc_local((CACHED, nw), "uint32")
            spill = T.alloc_local((1, nw), "uint32")
            codes = T.alloc_local((8,), "uint32")
            warp_amax = T.alloc_shared((4,), "float32")
            tpt = T.alloc_var("int32")  # threads per token
            token = T.alloc_var("int32")
            lane = T.alloc_var("int32")  # thread index within the token
            j = T.alloc_var("int32")
            amax = T.alloc_var("float32")
            sf = T.alloc_var("float32")
            sf_inv = T.alloc_var("float32")
            fv = T.alloc_var("float32")  # one scaled value (a variable: keeps expressions small)
            tpt = THREADS // tokens_per_block
            token = bx * tokens_per_block + tid // tpt
            lane = tid % tpt
            amax = T.float32(0)
            # pass 1: amax (units kept in registers, then the rest)
            for r in T.unroll(CACHED):
                j = lane + r * tpt
                if token < num_tokens and j < units:
                    for w in T.vectorized(nw):
                        cache[r, w] = _view(x, x_words, "uint32")[token, j * nw + w]
                    for k in T.unroll(8):
                        amax = T.max(amax, T.abs(unit_value(cache, r, k, in_dtype)))
            for it in T.serial(T.max(T.ceildiv(units, tpt) - CACHED, 0)):
                j = lane + (it + CACHED) * tpt
                if token < num_tokens and j < units:
                    for w in T.vectorized(nw):
                        spill[0, w] = _view(x, x_words, "uint32")[token, j * nw + w]
                    for k in T.unroll(8):
                        amax = T.max(amax, T.abs(unit_value(spill, 0, k, in_dtype)))
            for s in T.unroll(5):
                amax = T.max(amax, T.shfl_xor(amax, 16 >> s))
            if tid % 32 == 0:
                warp_amax[tid // 32] = amax
            T.sync_threads()
            amax = warp_amax[(tid // tpt) * (tpt // 32)]
            for s in T.unroll(1, 4):
                if s < tpt // 32:
                    amax = T.max(amax, warp_amax[(tid // tpt) * (tpt // 32) + s])
            sf, sf_inv = e5m6_scales(amax, round_sf)
            if token < num_tokens and lane == 0:
                if sf_kind == "row":
                    out_sf[token, 0] = sf
                elif sf_kind == "col":
                    out_sf[0, token] = sf
                else:
                    out_sf[0, token * 4] = T.Cast("uint8", T.reinterpret(sf, "uint32") >> T.uint32(23))
                    for b in T.unroll(1, 4):
                        out_sf[0, token * 4 + b] = T.uint8(0)
            # pass 2: scale, encode, pack, store
            for r in T.unroll(CACHED):
                j = lane + r * tpt
                if token < num_tokens and j < units:
                    for k in T.unroll(8):
                        fv = unit_value(cache, r, k, in_dtype) * sf_inv
                        codes[k] = truncated_code(fv)
                        codes[k] = rounded_code(codes[k], fv)
                    _pack_store(out, out_words, token, j, codes)
            for it in T.serial(T.max(T.ceildiv(units, tpt) - CACHED, 0)):
                j = lane + (it + CACHED) * tpt
                if token < num_tokens and j < units:
                    for w in T.vectorized(nw):
                        spill[0, w] = _view(x, x_words, "uint32")[token, j * nw + w]
                    for k in T.unroll(8):
                        fv = unit_value(spill, 0, k, in_dtype) * sf_inv
                        codes[k] = truncated_code(fv)
                        codes[k] = rounded_code(codes[k], fv)
                    _pack_store(out, out_words, token, j, codes)

    return main


@T.macro
def _pack_store(pk_out, pk_shape, pk_token, pk_unit, pk_codes):
    """Three words of eight codes (code 0 in the top bits of word 0), stored at unit ``pk_unit``."""
    _view(pk_out, pk_shape, "uint32")[pk_token, pk_unit * 3] = (
        (pk_codes[0] << T.uint32(20)) | (pk_codes[1] << T.uint32(8)) | (pk_codes[2] >> T.uint32(4)))
    _view(pk_out, pk_shape, "uint32")[pk_token, pk_unit * 3 + 1] = (
        (pk_codes[2] << T.uint32(28)) | (pk_codes[3] << T.uint32(16)) | (pk_codes[4] << T.uint32(4))
        | (pk_codes[5] >> T.uint32(8)))
    _view(pk_out, pk_shape, "uint32")[pk_token, pk_unit * 3 + 2] = (
        (pk_codes[5] << T.uint32(24)) | (pk_codes[6] << T.uint32(12)) | pk_codes[7])


KERNELS = (
    KernelDecl(
        name="quant.per_token_cast_e5m6",
        factory=per_token_cast_e5m6,
        grid=product(in_dtype=["bfloat16"], sf_kind=list(SF_KINDS)),  # fp32: quant.per_token_cast_e5m6_fp32
        outputs=("out", "out_sf"),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="Per-token E5M6 cast (one scale per token): bf16 -> uint8 [tokens, hidden*3/2] + sf.",
    ),
)

__all__ = ["KERNELS", "e5m6_scales", "per_token_cast_e5m6", "rounded_code", "truncated_code"]
