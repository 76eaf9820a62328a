"""``quant.per_token_cast*``: cast rows to e4m3 / packed e2m1 with one scale per group of channels.

One TileLang factory, four kernels of four signatures (every variant of a kernel takes the same
parameters): ``quant.per_token_cast`` (bf16 / fp32 input), ``quant.per_token_cast_quantized``
(a quantized pair), ``quant.per_token_cast_sf_only`` and ``quant.per_token_cast_precomputed``;
the token count, hidden size and strides are runtime values.  ``x`` is ``[num_tokens, hidden]`` (bf16 / fp32, any row
stride that keeps rows 16-byte aligned) or a quantized ``(data, x_sf)`` pair (e4m3, or e2m1
packed two per int8 byte, with fp32 or UE8M0 scales of runtime block ``2**m_shift x 2**k_shift``)
that is dequantized (``data * x_sf``, fp32) first.  Parameters, in order:

* ``mode="cast"``:        x, [x_sf], out, out_sf, group_shift, whole_row, round_sf, sf_col,
  col_blocks, [in_sf_col, in_m_shift, in_k_shift]  (bracketed: quantized inputs only)
* ``mode="sf_only"``:     x, out_sf, group_shift, whole_row, round_sf, sf_col, col_blocks
* ``mode="precomputed"``: x, sf, out, group_shift, sf_col, col_blocks  (``out = x * (1 / sf)``)

Scalars: ``group_shift = log2(channels per scale)`` (16..128), or 31 with ``whole_row = 1`` for
one scale per row (any hidden; in ``precomputed`` mode 31 alone reads scale 0 of each row);
``round_sf`` (0/1); ``sf_col``: the fp32 scale tensor is kernel-side column-major ``[groups,
tokens]`` (1) or row-major ``[tokens, groups]`` (0); ``col_blocks`` = the grid's y extent,
``ceil(hidden / CHUNK)``, or 1 with ``whole_row``.  UE8M0 scales are ``[ceil(groups / 4), 4 *
tokens]`` bytes (see ``_formats``).  ``hidden % 16 == 0``; x's row stride a multiple of 16 bytes.
Arithmetic and rounding: ``_formats`` (bit-exact with ``quant_ref.cast``).

Design (a streaming kernel: every byte is read once and written once, in 16-byte vectors):

* A warp owns one row; lane ``l`` owns 16-byte input vectors (``V`` = 8 bf16, 4 fp32, 16 e4m3;
  8 bytes = 16 e2m1) at ``chunk * CHUNK + u * 32 V + l V`` for ``u < U`` (4 for bf16 / fp32, 2
  for quantized inputs): each load instruction of the warp reads 512 (e2m1: 256) contiguous
  bytes, and all ``U`` loads are issued before the first use (64 / 32 bytes in flight per lane).
* A scale group of ``G`` channels is ``G / V`` consecutive lanes of one ``u``: its absolute
  maximum is one in-register max over the lane's ``V`` values plus ``log2(G / V)`` xor-shuffles
  (a runtime count, uniform across the warp), no shared memory.  The group's first lane stores
  the scale.  Lanes past ``hidden`` load nothing and count as zeros (576 = 4.5 groups of 128).
* Outputs leave as one store per vector (e4m3: V bytes, e2m1: V / 2 bytes), coalesced across
  the warp.  Grid: ``(ceil(tokens / 8), col_blocks)``, 8 warps (rows) per block.
* ``whole_row``: the warp walks its row twice (max, then cast; the second read hits L2).
* Packed UE8M0: the lane storing a row's last scale also zeroes the rest of its 4-byte word, as
  the reference does (tile_kernels leaves those bytes unwritten).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from . import _formats as F

# input dtype (torch name) -> (TileLang dtype, elements per vector, uint32 words per vector,
# storage elements per vector)
_INPUTS = {
    "bfloat16": ("bfloat16", 8, 4, 8),
    "float32": ("float32", 4, 4, 4),
    "float8_e4m3fn": ("float8_e4m3fn", 16, 4, 16),
    "int8": ("int8", 16, 2, 8),  # packed e2m1: 16 values in 8 bytes
}
_LOG2 = {4: 2, 8: 3, 16: 4}
# vectors per lane per chunk: 64 bytes of loads in flight per lane for bf16 / fp32; 32 for the
# quantized inputs, whose 16 values per vector would otherwise need ~128 registers
_U = {"bfloat16": 4, "float32": 4, "float8_e4m3fn": 2, "int8": 2}
WARPS = 8  # rows per block
MODES = ("cast", "sf_only", "precomputed")


def chunk_elems(in_dtype: str) -> int:
    """Channels one block covers along a row (the op's ``col_blocks = ceil(hidden / this)``)."""
    return 32 * _U[in_dtype] * _INPUTS[in_dtype][1]


def _check(in_dtype, fmt, sf, mode, in_sf):
    if in_dtype not in _INPUTS or fmt not in F.FMT_MAX or sf not in ("f32", "ue8m0") or mode not in MODES:
        raise ValueError(f"per_token_cast: bad variant in_dtype={in_dtype!r} fmt={fmt!r} sf={sf!r} mode={mode!r}")
    quantized = in_dtype in ("float8_e4m3fn", "int8")
    if quantized != (in_sf != "none") or (quantized and mode != "cast") or in_sf not in ("none", "f32", "ue8m0"):
        raise ValueError(f"per_token_cast: in_sf={in_sf!r} does not fit in_dtype={in_dtype!r}, mode={mode!r}")
    if mode == "precomputed" and sf != "f32":
        raise ValueError("per_token_cast: precomputed scales are fp32")


def per_token_cast(in_dtype: str, fmt: str, sf: str, mode: str, in_sf: str = "none"):
    """Build the PrimFunc of one variant (see the module docstring)."""
    _check(in_dtype, fmt, sf, mode, in_sf)
    tl_in, V, NW, VS = _INPUTS[in_dtype]
    U = _U[in_dtype]
    LV = _LOG2[V]
    STEP = 32 * V  # channels per u
    CHUNK = STEP * U
    out_bytes = V if fmt == "e4m3" else V // 2  # output bytes per vector
    sf_dtype = "uint8" if sf == "ue8m0" else "float32"
    in_sf_dtype = "uint8" if in_sf == "ue8m0" else "float32"
    e2m1_out_dtype, e2m1_out_n = {2: ("uint16", 1), 4: ("uint32", 1), 8: ("uint32", 2)}[V // 2]

    tokens = T.dynamic("num_tokens")
    if in_dtype == "int8":  # packed e2m1 input: the symbol is its byte count (TileLang binds it)
        x_cols = T.dynamic("x_cols")
        hidden = x_cols * 2
    else:
        x_cols = hidden = T.dynamic("hidden")
    xs = T.dynamic("x_stride")  # row stride of x in its own elements
    sd0, sd1, ss = T.dynamic("sf_d0"), T.dynamic("sf_d1"), T.dynamic("sf_stride")
    id0, id1, iss = T.dynamic("x_sf_d0"), T.dynamic("x_sf_d1"), T.dynamic("x_sf_stride")
    out_phys = hidden if fmt == "e4m3" else (x_cols if in_dtype == "int8" else hidden // 2)
    # views that prove 16-byte (8-byte) alignment of every vector to TileLang
    xw_shape = (tokens, (xs // VS) * NW)
    o8_shape = (tokens, (hidden // V) * V)
    o4_shape = (tokens, (hidden // V) * e2m1_out_n)

    @T.macro
    def load(x, x_sf, words, vals, row, base, lane, in_sf_col, in_m_shift, in_k_shift):
        """Vectors ``u < U`` of this lane from channel ``base``, decoded (and dequantized) to fp32."""
        for u in T.unroll(U):
            ld_col = base + u * STEP + lane * V
            if ld_col < hidden:
                for w in T.vectorized(NW):
                    words[u * NW + w] = T.Tensor(xw_shape, "uint32", x.data)[row, (ld_col // V) * NW + w]
            else:
                for w in T.unroll(NW):
                    words[u * NW + w] = T.uint32(0)
        for u in T.unroll(U):
            for w in T.unroll(NW):
                if in_dtype == "bfloat16":
                    vals[u * V + 2 * w] = F.bf16_lo(words[u * NW + w])
                    vals[u * V + 2 * w + 1] = F.bf16_hi(words[u * NW + w])
                elif in_dtype == "float32":
                    vals[u * V + w] = T.reinterpret(words[u * NW + w], "float32")
                elif in_dtype == "float8_e4m3fn":
                    for j in T.unroll(4):
                        vals[u * V + 4 * w + j] = F.e4m3_byte_to_float(F.word_byte(words[u * NW + w], j))
                else:
                    for j in T.unroll(8):
                        vals[u * V + 8 * w + j] = F.e2m1_nibble_to_float(F.word_nibble(words[u * NW + w], j))
            if in_sf != "none":
                ld_col = base + u * STEP + lane * V
                scale = T.alloc_var("float32")
                scale = F.load_sf_f32(x_sf, "ue8m0" if in_sf == "ue8m0" else "f32",
                                      row >> in_m_shift, T.min(ld_col, hidden - 1) >> in_k_shift, in_sf_col)
                for k in T.unroll(V):
                    vals[u * V + k] = vals[u * V + k] * scale

    @T.macro
    def store(out, vals, inv, o8, row, base, lane):
        """Quantize vectors ``u < U`` with their ``inv[u]`` and store those inside the row
        (``vals`` is scaled in place)."""
        for u in T.unroll(U):
            st_col = base + u * STEP + lane * V
            if st_col < hidden:
                for k in T.unroll(V):
                    vals[u * V + k] = vals[u * V + k] * inv[u]
                if fmt == "e4m3":
                    for k in T.vectorized(V):
                        o8[k] = F.to_e4m3(vals[u * V + k])
                    for k in T.vectorized(V):
                        T.Tensor(o8_shape, "float8_e4m3fn", out.data)[row, st_col + k] = o8[k]
                elif e2m1_out_dtype == "uint16":
                    T.Tensor(o4_shape, "uint16", out.data)[row, st_col // V] = T.Cast(
                        "uint16",
                        F.e2m1_code(vals[u * V]) | (F.e2m1_code(vals[u * V + 1]) << T.uint32(4))
                        | (F.e2m1_code(vals[u * V + 2]) << T.uint32(8)) | (F.e2m1_code(vals[u * V + 3]) << T.uint32(12)),
                    )
                else:
                    for w in T.vectorized(e2m1_out_n):
                        T.Tensor(o4_shape, "uint32", out.data)[row, (st_col // V) * e2m1_out_n + w] = F.e2m1_pack_word(
                            [vals[u * V + 8 * w + j] for j in range(8)])

    @T.macro
    def zero_pad_bytes(out_sf, row, grp):
        """UE8M0: after the row's last group ``grp``, zero the rest of its 4-byte word (as the
        reference does), so the returned int32 scales are deterministic."""
        for j in T.unroll(3):
            if grp % 4 + j + 1 < 4:
                out_sf[grp // 4, row * 4 + grp % 4 + j + 1] = T.uint8(0)

    @T.macro
    def group_scales(out_sf, vals, inv, row, base, lane, group_shift, round_sf, sf_col):
        """Per ``u``: the group's amax (lane values, then shuffles), its scale stored by the
        group's first lane, ``inv[u]`` = the inverse scale."""
        amax = T.alloc_var("float32")
        for u in T.unroll(U):
            amax = T.float32(0)
            for k in T.unroll(V):
                amax = T.max(amax, T.abs(vals[u * V + k]))
            for d in T.unroll(5):
                if d + LV < group_shift:
                    amax = T.max(amax, T.shfl_xor(amax, 1 << d))
            sfv, sf_inv = F.sf_from_amax(amax, fmt, True if sf == "ue8m0" else round_sf)
            inv[u] = sf_inv
            gs_col = base + u * STEP + lane * V
            if gs_col < hidden and (lane & ((1 << (group_shift - LV)) - 1)) == 0:
                out_sf[F.sf_index(sf, row, gs_col >> group_shift, sf_col)] = F.sf_store_value(sf, sfv)
                if sf == "ue8m0":
                    if gs_col >> group_shift == (hidden - 1) >> group_shift:
                        zero_pad_bytes(out_sf, row, gs_col >> group_shift)

    @T.macro
    def row_scale(x, x_sf, out_sf, words, vals, inv, row, lane, round_sf, sf_col, in_sf_col, in_m_shift,
                  in_k_shift):
        """``whole_row``: the row's amax over every chunk, its scale (stored by lane 0), ``inv``."""
        amax = T.alloc_var("float32")
        amax = T.float32(0)
        for c in T.serial(T.ceildiv(hidden, CHUNK)):
            load(x, x_sf, words, vals, row, c * CHUNK, lane, in_sf_col, in_m_shift, in_k_shift)
            for k in T.unroll(U * V):
                amax = T.max(amax, T.abs(vals[k]))
        for d in T.unroll(5):
            amax = T.max(amax, T.shfl_xor(amax, 1 << d))
        sfv, sf_inv = F.sf_from_amax(amax, fmt, True if sf == "ue8m0" else round_sf)
        for u in T.unroll(U):
            inv[u] = sf_inv
        if lane == 0:
            out_sf[F.sf_index(sf, row, 0, sf_col)] = F.sf_store_value(sf, sfv)
            if sf == "ue8m0":
                zero_pad_bytes(out_sf, row, 0)

    @T.macro
    def body(x, x_sf, out, out_sf, group_shift, whole_row, round_sf, sf_col, col_blocks, in_sf_col, in_m_shift,
             in_k_shift):
        with T.Kernel(T.ceildiv(tokens, WARPS), col_blocks, threads=32 * WARPS) as (bm, bc):
            tid = T.get_thread_binding()
            lane = tid % 32
            row = bm * WARPS + tid // 32
            words = T.alloc_local((U * NW,), "uint32")
            vals = T.alloc_local((U * V,), "float32")
            inv = T.alloc_local((U,), "float32")
            o8 = T.alloc_local((V,), "float8_e4m3fn")
            if row < tokens:  # uniform per warp: shuffles below see every lane
                if mode == "precomputed":
                    load(x, x_sf, words, vals, row, bc * CHUNK, lane, in_sf_col, in_m_shift, in_k_shift)
                    for u in T.unroll(U):
                        pc_col = bc * CHUNK + u * STEP + lane * V
                        inv[u] = T.ieee_fdiv(T.float32(1.0), F.load_sf(
                            out_sf, "f32", row, T.min(pc_col, hidden - 1) >> group_shift, sf_col))
                    store(out, vals, inv, o8, row, bc * CHUNK, lane)
                elif whole_row != 0:
                    row_scale(x, x_sf, out_sf, words, vals, inv, row, lane, round_sf, sf_col, in_sf_col,
                              in_m_shift, in_k_shift)
                    if mode == "cast":
                        for c in T.serial(T.ceildiv(hidden, CHUNK)):
                            load(x, x_sf, words, vals, row, c * CHUNK, lane, in_sf_col, in_m_shift, in_k_shift)
                            store(out, vals, inv, o8, row, c * CHUNK, lane)
                else:
                    load(x, x_sf, words, vals, row, bc * CHUNK, lane, in_sf_col, in_m_shift, in_k_shift)
                    group_scales(out_sf, vals, inv, row, bc * CHUNK, lane, group_shift, round_sf, sf_col)
                    if mode == "cast":
                        store(out, vals, inv, o8, row, bc * CHUNK, lane)

    XT = T.StridedTensor((tokens, x_cols), (xs, 1), tl_in)
    OT = T.Tensor((tokens, out_phys), F.OUT_DTYPE[fmt])
    ST = T.StridedTensor((sd0, sd1), (ss, 1), sf_dtype)
    IST = T.StridedTensor((id0, id1), (iss, 1), in_sf_dtype)

    if mode == "precomputed":

        @T.prim_func
        def main(x: XT, sf: ST, out: OT, group_shift: T.int32, sf_col: T.int32, col_blocks: T.int32):
            body(x, None, out, sf, group_shift, 0, 0, sf_col, col_blocks, 0, 0, 0)

    elif mode == "sf_only":

        @T.prim_func
        def main(x: XT, out_sf: ST, group_shift: T.int32, whole_row: T.int32, round_sf: T.int32, sf_col: T.int32,
                 col_blocks: T.int32):
            body(x, None, None, out_sf, group_shift, whole_row, round_sf, sf_col, col_blocks, 0, 0, 0)

    elif in_sf == "none":

        @T.prim_func
        def main(x: XT, out: OT, out_sf: ST, group_shift: T.int32, whole_row: T.int32, round_sf: T.int32,
                 sf_col: T.int32, col_blocks: T.int32):
            body(x, None, out, out_sf, group_shift, whole_row, round_sf, sf_col, col_blocks, 0, 0, 0)

    else:

        @T.prim_func
        def main(x: XT, x_sf: IST, out: OT, out_sf: ST, group_shift: T.int32, whole_row: T.int32,
                 round_sf: T.int32, sf_col: T.int32, col_blocks: T.int32, in_sf_col: T.int32, in_m_shift: T.int32,
                 in_k_shift: T.int32):
            body(x, x_sf, out, out_sf, group_shift, whole_row, round_sf, sf_col, col_blocks, in_sf_col, in_m_shift,
                 in_k_shift)

    return main


def _grid(mode: str, quantized: bool = False):
    grid = []
    for fmt in ("e4m3", "e2m1"):
        if quantized:
            for in_dtype in ("float8_e4m3fn", "int8"):
                for in_sf in ("f32", "ue8m0"):
                    for sf in ("f32", "ue8m0"):
                        grid.append(dict(in_dtype=in_dtype, fmt=fmt, sf=sf, mode=mode, in_sf=in_sf))
            continue
        for in_dtype in ("bfloat16", "float32"):
            for sf in (("f32",) if mode == "precomputed" else ("f32", "ue8m0")):
                grid.append(dict(in_dtype=in_dtype, fmt=fmt, sf=sf, mode=mode, in_sf="none"))
    return tuple(grid)


_PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # the kernel guards every access itself

KERNELS = (
    KernelDecl(
        name="quant.per_token_cast",
        factory=per_token_cast,
        grid=_grid("cast"),
        outputs=("out", "out_sf"),
        pass_configs=_PASS_CONFIGS,
        doc="x [tokens, hidden] bf16 / fp32 -> e4m3 / packed e2m1 + per-group scales.",
        # channels one block covers per input dtype: the op sizes its grid (ceil(hidden / chunk)) by these
        meta={f"chunk_{d}": chunk_elems(d) for d in ("bfloat16", "float32", "float8_e4m3fn", "int8")},
    ),
    KernelDecl(
        name="quant.per_token_cast_quantized",
        factory=per_token_cast,
        grid=_grid("cast", quantized=True),
        outputs=("out", "out_sf"),
        pass_configs=_PASS_CONFIGS,
        doc="A quantized (data, x_sf) pair (e4m3 / packed e2m1) re-cast with per-group scales.",
    ),
    KernelDecl(
        name="quant.per_token_cast_sf_only",
        factory=per_token_cast,
        grid=_grid("sf_only"),
        outputs=("out_sf",),
        pass_configs=_PASS_CONFIGS,
        doc="The per-group scales per_token_cast would write, without the cast values.",
    ),
    KernelDecl(
        name="quant.per_token_cast_precomputed",
        factory=per_token_cast,
        grid=_grid("precomputed"),
        outputs=("out",),
        pass_configs=_PASS_CONFIGS,
        doc="out = x * (1 / sf) cast to e4m3 / packed e2m1 with given fp32 per-group scales.",
    ),
)

__all__ = ["KERNELS", "WARPS", "chunk_elems", "per_token_cast"]
