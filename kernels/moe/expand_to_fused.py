"""``moe.expand_to_fused`` and ``moe.expand_to_fused_with_sf``: copy each token's row (and
scales) to its top-k slots of the fused expert layout.

Parameters, in order (bracketed: ``moe.expand_to_fused_with_sf`` only): ``x`` ``[num_tokens,
hidden]`` of ``dtype``; [``x_sf`` ``[num_tokens, sf_cols]`` of ``sf`` (fp32 scales, or int32
packed UE8M0 words: copied as raw 4-byte words)]; ``out`` ``[num_expanded_tokens, hidden]`` of
``dtype``; [``out_sf`` ``[num_expanded_tokens, sf_cols]`` with run-time strides ``(sf_s0,
sf_s1)``: row-major, or the column-major view tile_kernels returns with
``use_tma_aligned_col_major_sf``]; ``token_topk_to_pos`` int32 ``[num_tokens, num_topk]``;
``pos_to_expert`` int32 ``[num_expanded_tokens]``.  Token count, hidden size, top-k and strides
are run-time values.

``out[token_topk_to_pos[t, k]] = x[t]`` (and the same for the scales) for every slot ``>= 0``
(slots ``>= num_expanded_tokens`` are skipped); rows whose ``pos_to_expert`` is negative are
zero-filled (data and scales); other rows are left as they are.  Needs ``hidden * itemsize % 16
== 0`` and 16-byte aligned rows (the op checks).

``moe.expand_to_fused`` (a streaming copy, 16-byte vectors): block ``b`` zero-fills the padding
rows among slots ``[16 b, 16 b + 16)`` and, when ``b < num_tokens``, copies token ``b``: per chunk
of ``THREADS x U`` vectors every thread loads its ``U`` vectors once (all in flight), then stores
them to each of the token's slots.  Grid ``max(num_tokens, ceil(num_expanded_tokens / 16))``
blocks of 128 threads.

``moe.expand_to_fused_with_sf`` issues every read a block needs at once: blocks of 64 threads,
each owning ``ZR`` = 2 slots (1 below ``ZR_SLOTS`` slots: decode, e.g. 64 blocks for 128 slots;
4001 x 8 ranks: one block per token).  Before any store a block issues, together, its slots'
``pos_to_expert`` entries, the token's top-k slots (lane ``k`` holds slot ``k``), the first scale
chunk and the first ``SF_U`` = 8 vectors per thread of the row (hidden <= 8192 e4m3 is one
chunk): one DRAM round trip, then stores only.  The padding mask is a ``__ballot_sync``, each
top-k step takes its slot with a ``__shfl_sync``.  (Walking the padding slots one by one, a
dependent ``pos_to_expert`` load per slot, and re-reading ``token_topk_to_pos`` per top-k step
would expose a DRAM latency each; at decode one block zero-filling 15 padding rows alone
dominates.)
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
U = 4  # 16-byte vectors per thread per chunk
ZERO_ROWS = 16  # slots each block checks for padding
_VEC = {"bfloat16": 8, "float32": 4, "float8_e4m3fn": 16}  # elements per 16 bytes
DTYPES = tuple(_VEC)
SF_THREADS = 64  # two warps: 32 resident blocks per SM
SF_U = 8  # 16-byte vectors per thread per chunk (prefetched together)
ZR = 2  # slots each block checks for padding (from ZR_SLOTS slots on; 1 below: decode)
ZR_SLOTS = 8192
WARP = 32


def expand_to_fused(dtype: str, sf: str):
    """Build the PrimFunc of one variant (see the module docstring)."""
    if dtype not in _VEC or sf != "none":
        raise ValueError(f"expand_to_fused: bad variant dtype={dtype!r} sf={sf!r}")
    V = _VEC[dtype]
    num_tokens, hidden, num_topk = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_topk")
    num_slots = T.dynamic("num_expanded_tokens")
    nvec = hidden // V
    # uint32 views whose row length is a multiple of 4 words: every vector is 16-byte aligned
    x_words = (num_tokens, nvec * 4)
    out_words = (num_slots, nvec * 4)

    @T.macro
    def zero_rows(out, pos_to_expert, bx, tid):
        for r in T.serial(ZERO_ROWS):
            if bx * ZERO_ROWS + r < num_slots:
                if pos_to_expert[bx * ZERO_ROWS + r] < 0:
                    for c in T.serial(T.ceildiv(nvec, THREADS)):
                        if c * THREADS + tid < nvec:
                            for w in T.vectorized(4):
                                T.Tensor(out_words, "uint32", out.data)[bx * ZERO_ROWS + r,
                                                                        (c * THREADS + tid) * 4 + w] = T.uint32(0)

    @T.macro
    def copy_rows(x, out, token_topk_to_pos, words, bx, tid):
        for c in T.serial(T.ceildiv(nvec, THREADS * U)):
            for u in T.unroll(U):
                if (c * U + u) * THREADS + tid < nvec:
                    for w in T.vectorized(4):
                        words[u * 4 + w] = T.Tensor(x_words, "uint32", x.data)[bx, ((c * U + u) * THREADS + tid) * 4 + w]
            for k in T.serial(num_topk):
                if token_topk_to_pos[bx, k] >= 0 and token_topk_to_pos[bx, k] < num_slots:
                    for u in T.unroll(U):
                        if (c * U + u) * THREADS + tid < nvec:
                            for w in T.vectorized(4):
                                T.Tensor(out_words, "uint32", out.data)[
                                    token_topk_to_pos[bx, k], ((c * U + u) * THREADS + tid) * 4 + w] = words[u * 4 + w]

    grid = T.max(num_tokens, T.ceildiv(num_slots, ZERO_ROWS))

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), dtype),
        out: T.Tensor((num_slots, hidden), dtype),
        token_topk_to_pos: T.Tensor((num_tokens, num_topk), "int32"),
        pos_to_expert: T.Tensor((num_slots,), "int32"),
    ):
        with T.Kernel(grid, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            words = T.alloc_local((U * 4,), "uint32")
            zero_rows(out, pos_to_expert, bx, tid)
            if bx < num_tokens:
                copy_rows(x, out, token_topk_to_pos, words, bx, tid)

    return main


def expand_to_fused_with_sf(dtype: str, sf: str):
    """Build the PrimFunc of one ``moe.expand_to_fused_with_sf`` variant (see the module docstring)."""
    if dtype not in _VEC or sf not in ("float32", "int32"):
        raise ValueError(f"expand_to_fused_with_sf: bad variant dtype={dtype!r} sf={sf!r}")
    num_tokens, hidden, num_topk = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_topk")
    num_slots = T.dynamic("num_expanded_tokens")
    sf_cols, sf_s0, sf_s1 = T.dynamic("sf_cols"), T.dynamic("sf_s0"), T.dynamic("sf_s1")
    nvec = hidden // _VEC[dtype]
    x_words = (num_tokens, nvec * 4)
    out_words = (num_slots, nvec * 4)
    zr = T.min(ZR, 1 + num_slots // ZR_SLOTS)
    grid = T.max(num_tokens, T.ceildiv(num_slots, zr))

    @T.prim_func
    def main_sf(
        x: T.Tensor((num_tokens, hidden), dtype),
        x_sf: T.Tensor((num_tokens, sf_cols), sf),
        out: T.Tensor((num_slots, hidden), dtype),
        out_sf: T.StridedTensor((num_slots, sf_cols), (sf_s0, sf_s1), sf),
        token_topk_to_pos: T.Tensor((num_tokens, num_topk), "int32"),
        pos_to_expert: T.Tensor((num_slots,), "int32"),
    ):
        with T.Kernel(grid, threads=SF_THREADS) as bx:
            tid = T.get_thread_binding()
            lane = tid % WARP
            words = T.alloc_local((SF_U * 4,), "uint32")
            sfv = T.alloc_local((1,), sf)
            sf0 = T.alloc_local((1,), sf)
            expert = T.alloc_var("int32")
            pos0 = T.alloc_var("int32")
            my_pos = T.alloc_var("int32")
            pos = T.alloc_var("int32")
            # every read issued before the first store: one round trip
            pos0 = -1
            if bx < num_tokens:
                if lane < num_topk:
                    pos0 = token_topk_to_pos[bx, lane]
                if tid < sf_cols:
                    sf0[0] = x_sf[bx, tid]
                for u in T.unroll(SF_U):
                    if u * SF_THREADS + tid < nvec:
                        for w in T.vectorized(4):
                            words[u * 4 + w] = T.Tensor(x_words, "uint32", x.data)[bx, (u * SF_THREADS + tid) * 4 + w]
            # last: nvcc waits for this load where its branch closes
            expert = 0
            if lane < zr and bx * zr + lane < num_slots:
                expert = pos_to_expert[bx * zr + lane]
            mask = T.Cast("int32", T.ballot_sync(T.Cast("int32", expert < 0)))
            for r in T.unroll(ZR):
                if (mask >> r) & 1 != 0:
                    for c in T.serial(T.ceildiv(nvec, SF_THREADS)):
                        if c * SF_THREADS + tid < nvec:
                            for w in T.vectorized(4):
                                T.Tensor(out_words, "uint32", out.data)[bx * zr + r,
                                                                        (c * SF_THREADS + tid) * 4 + w] = T.uint32(0)
                    for c in T.serial(T.ceildiv(sf_cols, SF_THREADS)):
                        if c * SF_THREADS + tid < sf_cols:
                            out_sf[bx * zr + r, c * SF_THREADS + tid] = T.Cast(sf, 0)
            if bx < num_tokens:
                for c in T.serial(T.ceildiv(nvec, SF_THREADS * SF_U)):
                    if c > 0:
                        for u in T.unroll(SF_U):
                            if (c * SF_U + u) * SF_THREADS + tid < nvec:
                                for w in T.vectorized(4):
                                    words[u * 4 + w] = T.Tensor(x_words, "uint32", x.data)[
                                        bx, ((c * SF_U + u) * SF_THREADS + tid) * 4 + w]
                    for kc in T.serial(T.ceildiv(num_topk, WARP)):
                        my_pos = pos0
                        if kc > 0:
                            my_pos = -1
                            if kc * WARP + lane < num_topk:
                                my_pos = token_topk_to_pos[bx, kc * WARP + lane]
                        for k in T.serial(T.min(WARP, num_topk - kc * WARP)):
                            pos = T.shfl_sync(my_pos, k)
                            if pos >= 0 and pos < num_slots:
                                for u in T.unroll(SF_U):
                                    if (c * SF_U + u) * SF_THREADS + tid < nvec:
                                        for w in T.vectorized(4):
                                            T.Tensor(out_words, "uint32", out.data)[
                                                pos, ((c * SF_U + u) * SF_THREADS + tid) * 4 + w] = words[u * 4 + w]
                for c in T.serial(T.ceildiv(sf_cols, SF_THREADS)):
                    sfv[0] = sf0[0]
                    if c > 0 and c * SF_THREADS + tid < sf_cols:
                        sfv[0] = x_sf[bx, c * SF_THREADS + tid]
                    for kc in T.serial(T.ceildiv(num_topk, WARP)):
                        my_pos = pos0
                        if kc > 0:
                            my_pos = -1
                            if kc * WARP + lane < num_topk:
                                my_pos = token_topk_to_pos[bx, kc * WARP + lane]
                        for k in T.serial(T.min(WARP, num_topk - kc * WARP)):
                            pos = T.shfl_sync(my_pos, k)
                            if pos >= 0 and pos < num_slots and c * SF_THREADS + tid < sf_cols:
                                out_sf[pos, c * SF_THREADS + tid] = sfv[0]

    return main_sf


GRID = tuple({"dtype": d, "sf": "none"} for d in DTYPES)
GRID_SF = tuple({"dtype": d, "sf": s} for d in ("float8_e4m3fn", "bfloat16") for s in ("float32", "int32"))
_PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded above

KERNELS = (
    KernelDecl(
        name="moe.expand_to_fused",
        factory=expand_to_fused,
        grid=GRID,
        outputs=("out",),
        align=16,
        pass_configs=_PASS_CONFIGS,
        doc="Copy token rows to their top-k slots of the fused layout, zero the padding rows "
            "(tile_kernels.moe.expand_to_fused).",
    ),
    KernelDecl(
        name="moe.expand_to_fused_with_sf",
        factory=expand_to_fused_with_sf,
        grid=GRID_SF,
        outputs=("out", "out_sf"),
        align=16,
        pass_configs=_PASS_CONFIGS,
        doc="expand_to_fused of a (data, sf) pair; sf fp32 or packed UE8M0 int32, row- or column-major "
            "output (tile_kernels.moe.expand_to_fused_with_sf); every read issued before the first store, "
            "64-thread blocks of up to 2 padding slots.",
    ),
)

__all__ = ["DTYPES", "GRID", "GRID_SF", "KERNELS", "THREADS", "ZERO_ROWS", "expand_to_fused",
           "expand_to_fused_with_sf"]
