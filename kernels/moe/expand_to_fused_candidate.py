"""``moe._expand_to_fused_with_sf_candidate``: the same parameters, variants and output bits as
``moe.expand_to_fused_with_sf`` (see ``expand_to_fused.py`` for the contract), with every read a
block needs issued at once and the padding rows spread over more blocks (issue 12).

Why (SASS of the shipped kernel, e4m3 data with fp32 scales, nvcc 13.0): before a block copies
its token it walks its ``ZERO_ROWS`` = 16 slots one by one, a ``pos_to_expert`` load and a branch
per slot (16 dependent load latencies, again for the scales), and every top-k step re-reads
``token_topk_to_pos[t, k]`` before its stores.  A first candidate read each index once (a
ballot of the padding rows, shuffled top-k slots): bit-exact and 1-13 % faster, still behind
tile_kernels, because a block still ran three dependent round trips (padding mask, then the
row, then its scales) and, at decode, one block zero-filled 15 padding rows of 7 KB alone
(1 token, hidden 7168: 8 blocks for 128 slots; tile_kernels: a 64-thread block per slot).
This version: blocks of 64 threads, each owning ``ZR`` = 2 slots (decode: 64 blocks for 128
slots; 4001 x 8 ranks: still one block per token), and before any store it issues, together, its
slots' ``pos_to_expert`` entries, the token's top-k slots (lane ``k`` holds slot ``k``), the first
scale chunk and the first ``U`` = 8 vectors per thread of the row (hidden <= 8192 e4m3 is one
chunk): one DRAM round trip, then stores only.  The padding mask is a ``__ballot_sync``, each
top-k step takes its slot with a ``__shfl_sync``; stored values are the shipped kernel's.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .expand_to_fused import _PASS_CONFIGS, _VEC, GRID_SF

THREADS = 64  # two warps: 32 resident blocks per SM
U = 8  # 16-byte vectors per thread per chunk (prefetched together)
ZR = 2  # slots each block checks for padding (from ZR_SLOTS slots on; 1 below: decode)
ZR_SLOTS = 8192
WARP = 32


def expand_to_fused_with_sf_candidate(dtype: str, sf: str):
    """Build the PrimFunc of one variant (see the module docstring)."""
    if dtype not in _VEC or sf not in ("float32", "int32"):
        raise ValueError(f"expand_to_fused_with_sf_candidate: bad variant dtype={dtype!r} sf={sf!r}")
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
        with T.Kernel(grid, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            lane = tid % WARP
            words = T.alloc_local((U * 4,), "uint32")
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
                for u in T.unroll(U):
                    if u * THREADS + tid < nvec:
                        for w in T.vectorized(4):
                            words[u * 4 + w] = T.Tensor(x_words, "uint32", x.data)[bx, (u * THREADS + tid) * 4 + w]
            # last: nvcc waits for this load where its branch closes
            expert = 0
            if lane < zr and bx * zr + lane < num_slots:
                expert = pos_to_expert[bx * zr + lane]
            mask = T.Cast("int32", T.ballot_sync(T.Cast("int32", expert < 0)))
            for r in T.unroll(ZR):
                if (mask >> r) & 1 != 0:
                    for c in T.serial(T.ceildiv(nvec, THREADS)):
                        if c * THREADS + tid < nvec:
                            for w in T.vectorized(4):
                                T.Tensor(out_words, "uint32", out.data)[bx * zr + r,
                                                                        (c * THREADS + tid) * 4 + w] = T.uint32(0)
                    for c in T.serial(T.ceildiv(sf_cols, THREADS)):
                        if c * THREADS + tid < sf_cols:
                            out_sf[bx * zr + r, c * THREADS + tid] = T.Cast(sf, 0)
            if bx < num_tokens:
                for c in T.serial(T.ceildiv(nvec, THREADS * U)):
                    if c > 0:
                        for u in T.unroll(U):
                            if (c * U + u) * THREADS + tid < nvec:
                                for w in T.vectorized(4):
                                    words[u * 4 + w] = T.Tensor(x_words, "uint32", x.data)[
                                        bx, ((c * U + u) * THREADS + tid) * 4 + w]
                    for kc in T.serial(T.ceildiv(num_topk, WARP)):
                        my_pos = pos0
                        if kc > 0:
                            my_pos = -1
                            if kc * WARP + lane < num_topk:
                                my_pos = token_topk_to_pos[bx, kc * WARP + lane]
                        for k in T.serial(T.min(WARP, num_topk - kc * WARP)):
                            pos = T.shfl_sync(my_pos, k)
                            if pos >= 0 and pos < num_slots:
                                for u in T.unroll(U):
                                    if (c * U + u) * THREADS + tid < nvec:
                                        for w in T.vectorized(4):
                                            T.Tensor(out_words, "uint32", out.data)[
                                                pos, ((c * U + u) * THREADS + tid) * 4 + w] = words[u * 4 + w]
                for c in T.serial(T.ceildiv(sf_cols, THREADS)):
                    sfv[0] = sf0[0]
                    if c > 0 and c * THREADS + tid < sf_cols:
                        sfv[0] = x_sf[bx, c * THREADS + tid]
                    for kc in T.serial(T.ceildiv(num_topk, WARP)):
                        my_pos = pos0
                        if kc > 0:
                            my_pos = -1
                            if kc * WARP + lane < num_topk:
                                my_pos = token_topk_to_pos[bx, kc * WARP + lane]
                        for k in T.serial(T.min(WARP, num_topk - kc * WARP)):
                            pos = T.shfl_sync(my_pos, k)
                            if pos >= 0 and pos < num_slots and c * THREADS + tid < sf_cols:
                                out_sf[pos, c * THREADS + tid] = sfv[0]

    return main_sf


KERNELS = (
    KernelDecl(
        name="moe._expand_to_fused_with_sf_candidate",
        factory=expand_to_fused_with_sf_candidate,
        grid=GRID_SF,
        outputs=("out", "out_sf"),
        align=16,
        pass_configs=_PASS_CONFIGS,
        doc="Candidate of moe.expand_to_fused_with_sf (same parameters and bits): every read issued "
            "before the first store, 2 padding slots per 64-thread block.",
    ),
)

__all__ = ["KERNELS", "expand_to_fused_with_sf_candidate"]
