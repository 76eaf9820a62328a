"""``quant.per_block_cast``: bf16 / fp32 -> e4m3 or packed e2m1 with one scale per
``block x block`` tile (block 128 or 32), its sf-only form and its precomputed-sf form.

Parameters, in order:

* ``x``: ``[num_tokens, hidden]`` bfloat16 or float32, contiguous.
* ``out``: e4m3 ``[num_tokens, hidden]``; e2m1 int8 ``[num_tokens, out_cols]`` with
  ``out_cols = hidden // 2`` (low nibble = even channel).  sf-only variants never touch it
  (any ``[out_rows, out_cols]`` tensor of the dtype, e.g. ``[1, 16]``).
* ``sf``: the scales as the op returns them (``ops/quant/_sf.py``), 4-byte words ``[sf_rows,
  sf_cols]`` with run-time strides ``(sf_s0, sf_s1)`` (elements): fp32 ``row`` or ``col``
  ``[M, G]`` (strides tell them apart), or packed ``ue8m0`` int32 ``[M, ceil(G / 4)]`` (byte
  ``g % 4`` of word ``g // 4``; the kernel parameter is float32 and takes int32 as its bits).
  ``M = ceil(num_tokens / block)``, ``G = ceil(hidden / block)``.
* ``sf_kind``: 0 row, 1 col, 2 ue8m0 (ue8m0 needs ``round_sf``; the op checks it).
* ``round_sf``: 1 rounds each scale up to a power of two.
* ``precomputed``: 1 reads row-layout fp32 scales from ``sf`` instead of computing them
  (``sf_kind`` must be 0) and casts with ``1 / sf``.

Rules the op checks: ``hidden % 64 == 0``; 16-byte aligned pointers; int32 element counts.

Math (bit-exact with ``tile_kernels.torch.cast``): ``amax`` = max |x| over the tile (rows and
channels past the edges excluded); ``c = max(amax, clamp_min)``; ``sf = c / fmt_max`` and
``sf_inv = fmt_max / c`` (two IEEE fp32 divisions; nvcc's default -prec-div=true); with
``round_sf`` the bits of ``sf`` are rounded up to a power of two and ``sf_inv`` is its exact
inverse.  ``q = x * sf_inv`` (fp32); e4m3: ``cvt.rn.satfinite`` (== clamp to +-448, then RNE);
e2m1: round-to-nearest-even onto {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating, sign kept.  With
``ue8m0`` the byte is the exponent of the rounded scale; the (up to 3) unused bytes of the
last group of four are written as 0, as the reference does.

Design: a block of 256 threads owns a ``block x TN`` tile (``TN = max(block, 8192 // block)``:
128 x 128, or 32 x 256), i.e. ``TN / block`` scales.  Lanes run along channels, one 16-byte
vector each (8 bf16 or 4 fp32), so every warp-wide load is 512 contiguous bytes; a thread owns
``K`` such vectors in rows ``g, g + R, ...`` of the tile, all loaded before the first use.
A thread's vectors share one scale; the tile amax is a max over the thread's values, then
xor-shuffles across the lanes of one scale (and across row groups inside a warp), then one
shared-memory exchange between warps.  The scale writer is the first lane of each scale.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl, product
from ._formats import e2m1_code  # shared RNE encoder (re-exported: part of this module's names)

THREADS = 256
TILE_ELEMENTS = 8192
FMT_MAX = {"e4m3": 448.0, "e2m1": 6.0}
# clamp_min as fp32 bits: e4m3 fp32(1e-4), e2m1 6 * 2**-126 (spelled as bits: no decimal round trip)
CLAMP_BITS = {"e4m3": 0x38D1B717, "e2m1": 0x01C00000}
IN_BYTES = {"bfloat16": 2, "float32": 4}
OUT_DTYPES = {"e4m3": "float8_e4m3fn", "e2m1": "int8"}
BLOCKS = (128, 32)


def _view(buf, shape, dtype: str):
    """A reinterpreting view of ``buf``'s data.  Build it inline at each use: binding it to a name
    in the PrimFunc renames the data pointer, hence the kernel parameter."""
    return T.Tensor(shape, dtype, buf.data)


def _f32(bits):
    return T.reinterpret(bits, "float32")


def _u32(value):
    return T.reinterpret(value, "uint32")


def unpack_word(word, in_dtype: str, j):
    """Element ``j`` (0 or 1 for bf16; ignored for fp32) of a 32-bit word of input, as fp32 (exact).
    ``j`` may be an unrolled loop variable: the shift folds to a constant."""
    if in_dtype == "float32":
        return _f32(word)
    return _f32((word << T.Cast("uint32", 16 - 16 * j)) & T.uint32(0xFFFF0000))


def tile_plan(in_dtype: str, block: int, vec: int | None = None, threads: int = THREADS) -> dict:
    """Thread layout of one tile: lanes along channels, one vector of ``vec`` elements each."""
    vec = vec or 16 // IN_BYTES[in_dtype]
    tn = max(block, TILE_ELEMENTS // block)
    lanes_per_row = tn // vec  # C
    row_groups = threads // lanes_per_row  # R
    rows_per_thread = block // row_groups  # K
    lanes_per_sf = block // vec  # L
    return {
        "vec": vec, "tm": block, "tn": tn, "C": lanes_per_row, "R": row_groups, "K": rows_per_thread,
        "L": lanes_per_sf, "NB": tn // block, "slots": row_groups if lanes_per_row >= 32 else threads // 32,
        "masks": shuffle_masks(lanes_per_row, lanes_per_sf),
    }


def shuffle_masks(lanes_per_row: int, lanes_per_sf: int) -> list[int]:
    """xor distances joining the lanes of a warp that share a scale: the lanes of one scale along a
    row (distances < L), and the row groups that share the warp (distances C, 2C, ... < 32)."""
    masks, m = [], 1
    while m < min(lanes_per_sf, 32):
        masks.append(m)
        m *= 2
    m = lanes_per_row
    while m < 32:
        masks.append(m)
        m *= 2
    return masks


def per_block_cast(in_dtype: str, fmt: str, block: int, sf_only: bool):
    """Build the PrimFunc for one (input dtype, format, block, sf-only) variant."""
    if in_dtype not in IN_BYTES or fmt not in FMT_MAX or block not in BLOCKS:
        raise ValueError(f"per_block_cast: unsupported variant in_dtype={in_dtype!r} fmt={fmt!r} block={block!r}")
    p = tile_plan(in_dtype, block)
    vec, tm, tn, C, R, K, L, NB, slots = (p[k] for k in ("vec", "tm", "tn", "C", "R", "K", "L", "NB", "slots"))
    assert C * R == THREADS and K * R == tm and L * NB == C and (C >= 32 or 32 % C == 0)
    fmt_max = FMT_MAX[fmt]
    ib = IN_BYTES[in_dtype]
    words_per_vec = 4  # 16 bytes
    per_word = 4 // ib  # input elements per 32-bit word
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    sf_rows, sf_cols, sf_s0, sf_s1 = (T.dynamic(n) for n in ("sf_rows", "sf_cols", "sf_s0", "sf_s1"))
    if sf_only:
        out_shape = (T.dynamic("out_rows"), T.dynamic("out_cols"))
    elif fmt == "e4m3":
        out_shape = (num_tokens, hidden)
    else:
        out_shape = (num_tokens, T.dynamic("out_cols"))
    # Views whose row length is provably a multiple of the vector (hidden % 64 == 0 is checked).
    x_words = (num_tokens, hidden // 64 * (16 * ib))
    out_e4m3 = (num_tokens, hidden // 64 * 64)
    out_e2m1 = (num_tokens, hidden // 64 * (64 // vec))  # one e2m1 word (vec / 2 bytes) per vector
    e2m1_word = "uint32" if vec == 8 else "uint16"
    sf_bytes = (((sf_rows - 1) * sf_s0 + (sf_cols - 1) * sf_s1 + 1) * 4,)  # the words' extent, as bytes
    num_sf = T.ceildiv(hidden, block)
    n_masks = len(p["masks"])
    n_low = sum(1 for m in p["masks"] if m < L)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), in_dtype),
        out: T.Tensor(out_shape, OUT_DTYPES[fmt]),
        sf: T.StridedTensor((sf_rows, sf_cols), (sf_s0, sf_s1), "float32"),
        sf_kind: T.int32,
        round_sf: T.int32,
        precomputed: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, tm), T.ceildiv(hidden, tn), threads=THREADS) as (bx, by):
            tid = T.get_thread_binding()
            red = T.alloc_shared((slots, NB), "float32")
            xw = T.alloc_local((K, words_per_vec), "uint32")
            fp8 = T.alloc_local((vec,), "float8_e4m3fn")
            amax = T.alloc_var("float32")
            clamped = T.alloc_var("float32")
            sf_val = T.alloc_var("float32")
            sf_inv = T.alloc_var("float32")
            sf_bits = T.alloc_var("uint32")
            packed = T.alloc_var("uint32")
            c = tid % C
            g = tid // C
            cv = by * C + c  # this thread's vector index along the row
            gidx = by * NB + c // L  # this thread's scale column
            vec_ok = cv < hidden // vec
            for k in T.unroll(K):
                if vec_ok and bx * tm + g + R * k < num_tokens:
                    for w in T.vectorized(words_per_vec):
                        xw[k, w] = _view(x, x_words, "uint32")[bx * tm + g + R * k, cv * words_per_vec + w]
                else:
                    for w in T.unroll(words_per_vec):
                        xw[k, w] = T.uint32(0)
            if precomputed == 0:
                amax = T.float32(0)
                for k in T.unroll(K):
                    for e in T.unroll(vec):
                        amax = T.max(amax, T.abs(unpack_word(xw[k, e // per_word], in_dtype, e % per_word)))
                for i in T.unroll(n_masks):
                    amax = T.max(amax, T.shfl_xor(amax, T.if_then_else(i < n_low, 1 << i, C << (i - n_low))))
                if C >= 32:
                    if c % L == 0:
                        red[g, c // L] = amax
                else:
                    if c % L == 0 and tid % 32 < C:
                        red[tid // 32, c // L] = amax
                T.sync_threads()
                for s in T.unroll(slots):
                    amax = T.max(amax, red[s, c // L])
                clamped = T.max(amax, _f32(T.uint32(CLAMP_BITS[fmt])))
                sf_val = clamped / T.float32(fmt_max)
                if round_sf != 0:
                    sf_bits = (_u32(sf_val) + T.uint32(0x7FFFFF)) & T.uint32(0x7F800000)
                    sf_val = _f32(sf_bits)
                    sf_inv = _f32(T.uint32(254 << 23) - sf_bits)
                else:
                    sf_inv = T.float32(fmt_max) / clamped
                if g == 0 and c % L == 0 and gidx < num_sf:
                    if sf_kind != 2:  # row or col: the strides place it
                        sf[bx, gidx] = sf_val
                    else:
                        _view(sf, sf_bytes, "uint8")[(bx * sf_s0 + (gidx // 4) * sf_s1) * 4 + gidx % 4] = T.Cast(
                            "uint8", _u32(sf_val) >> T.uint32(23))
                        if gidx == num_sf - 1:  # zero the unused bytes of the last group of four
                            for e in T.unroll(3):
                                if gidx % 4 + e + 1 < 4:
                                    _view(sf, sf_bytes, "uint8")[(bx * sf_s0 + (gidx // 4) * sf_s1) * 4 + gidx % 4 + e + 1] = T.uint8(0)
            else:
                sf_inv = T.float32(1.0)
                if gidx < num_sf:
                    sf_inv = T.float32(1.0) / sf[bx, gidx]
            if not sf_only:
                for k in T.unroll(K):
                    if vec_ok and bx * tm + g + R * k < num_tokens:
                        if fmt == "e4m3":
                            for e in T.unroll(vec):
                                fp8[e] = T.Cast("float8_e4m3fn", unpack_word(xw[k, e // per_word], in_dtype, e % per_word) * sf_inv)
                            for e in T.vectorized(vec):
                                _view(out, out_e4m3, "float8_e4m3fn")[bx * tm + g + R * k, cv * vec + e] = fp8[e]
                        else:
                            packed = T.uint32(0)
                            for e in T.unroll(vec):
                                packed = packed | (e2m1_code(unpack_word(xw[k, e // per_word], in_dtype, e % per_word) * sf_inv)
                                                   << T.uint32(4 * e))
                            _view(out, out_e2m1, e2m1_word)[bx * tm + g + R * k, cv] = T.Cast(e2m1_word, packed)

    return main


KERNELS = (
    KernelDecl(
        name="quant.per_block_cast",
        factory=per_block_cast,
        grid=product(in_dtype=["bfloat16", "float32"], fmt=["e4m3", "e2m1"], block=list(BLOCKS), sf_only=[False, True]),
        outputs=("out", "sf"),
        also_dtypes={"sf": ("int32",)},  # packed UE8M0 scales, as the op returns them
        doc="bf16/fp32 -> e4m3/e2m1 with (block x block) scales; sf as returned, with run-time strides; "
            "sf_kind 0 row / 1 col / 2 ue8m0, round_sf, precomputed at run time.",
    ),
)

__all__ = ["KERNELS", "per_block_cast", "tile_plan", "shuffle_masks", "e2m1_code", "unpack_word"]
