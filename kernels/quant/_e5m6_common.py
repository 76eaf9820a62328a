"""The per-token E5M6 cast shared by ``quant.per_token_cast_e5m6`` (bf16 input) and
``quant.per_token_cast_e5m6_fp32``: the code arithmetic, the packing, and one kernel body
(``e5m6_kernel``).  The contract and the algorithm are described in ``per_token_cast_e5m6.py``.

The two kernels differ only in ``e5m6_kernel``'s arguments: the units a thread caches between
the two passes, whether pass 1 issues every cached load before the first amax, and
``__launch_bounds__``' minimum blocks per SM.  A further difference belongs here as another
argument, so that both keep computing the same bits.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

THREADS = 128
E5M6_MAX = 65024.0
CLAMP_MIN = 1e-4
SF_KINDS = ("row", "col", "ue8m0")
IN_WORDS = {"bfloat16": 4, "float32": 8}  # uint32 words per 8-value unit


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


def e5m6_kernel(in_dtype: str, sf_kind: str, cached: int, loads_first: bool, min_blocks: int):
    """The PrimFunc for one (input dtype, scale layout), the caller having validated both.

    ``cached``: units per thread kept in registers between the amax pass and the cast pass.
    ``loads_first``: pass 1 issues every cached unit's load (zeros past the row) before the first
    amax, rather than load-then-amax per unit.  ``min_blocks``: ``__launch_bounds__``' minimum
    blocks per SM, 0 for none."""
    nw = IN_WORDS[in_dtype]
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
            if min_blocks:
                T.annotate_min_blocks_per_sm(min_blocks)
            tid = T.get_thread_binding()
            cache = T.alloc_local((cached, nw), "uint32")
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
            # pass 1: amax (units kept in registers, then the rest one unit at a time)
            if loads_first:
                for r in T.unroll(cached):
                    j = lane + r * tpt
                    if token < num_tokens and j < units:
                        for w in T.vectorized(nw):
                            cache[r, w] = _view(x, x_words, "uint32")[token, j * nw + w]
                    else:
                        for w in T.unroll(nw):
                            cache[r, w] = T.uint32(0)
                for r in T.unroll(cached):
                    for k in T.unroll(8):
                        amax = T.max(amax, T.abs(unit_value(cache, r, k, in_dtype)))
            else:
                for r in T.unroll(cached):
                    j = lane + r * tpt
                    if token < num_tokens and j < units:
                        for w in T.vectorized(nw):
                            cache[r, w] = _view(x, x_words, "uint32")[token, j * nw + w]
                        for k in T.unroll(8):
                            amax = T.max(amax, T.abs(unit_value(cache, r, k, in_dtype)))
            for it in T.serial(T.max(T.ceildiv(units, tpt) - cached, 0)):
                j = lane + (it + cached) * tpt
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
            for r in T.unroll(cached):
                j = lane + r * tpt
                if token < num_tokens and j < units:
                    for k in T.unroll(8):
                        fv = unit_value(cache, r, k, in_dtype) * sf_inv
                        codes[k] = truncated_code(fv)
                        codes[k] = rounded_code(codes[k], fv)
                    _pack_store(out, out_words, token, j, codes)
            for it in T.serial(T.max(T.ceildiv(units, tpt) - cached, 0)):
                j = lane + (it + cached) * tpt
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


__all__ = ["IN_WORDS", "SF_KINDS", "THREADS", "e5m6_kernel", "e5m6_scales", "rounded_code", "truncated_code",
           "unit_value"]
