"""``moe._expand_to_fused_with_sf_candidate``: the same parameters, variants and output bits as
``moe.expand_to_fused_with_sf`` (see ``expand_to_fused.py`` for the contract), with the index
reads taken off the critical path (issue 12).

Why (SASS of the current kernel, e4m3 data with fp32 scales, nvcc 13.0): before a block copies
its token it walks its ``ZERO_ROWS`` = 16 slots one by one, each step a global load of
``pos_to_expert`` followed by a branch on it: 16 dependent load latencies, then the same 16 again
for the scales (L1 hits), and every top-k step of the data and of the scale copy re-reads
``token_topk_to_pos[t, k]`` before its stores.  A block's life is mostly those serial latencies
(the copy is 1.5 16-byte vectors per thread at hidden 3072 e4m3); tile_kernels' block reads one
``pos_to_expert`` entry and its top-k row once.
The candidate reads each index once, in parallel: lanes 0-15 of every warp load the 16
``pos_to_expert`` entries together and a ``__ballot_sync`` gives every thread the padding mask
(no shared memory, no barrier); lane ``k`` of every warp loads ``token_topk_to_pos[t, k]`` (32 at
a time) and each top-k step takes its slot with a ``__shfl_sync``.  Stores, vectors and grid are
the current kernel's.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .expand_to_fused import _PASS_CONFIGS, _VEC, GRID_SF, THREADS, U, ZERO_ROWS

WARP = 32


def expand_to_fused_with_sf_candidate(dtype: str, sf: str):
    """Build the PrimFunc of one variant (see the module docstring)."""
    if dtype not in _VEC or sf not in ("float32", "int32"):
        raise ValueError(f"expand_to_fused_with_sf_candidate: bad variant dtype={dtype!r} sf={sf!r}")
    V = _VEC[dtype]
    num_tokens, hidden, num_topk = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_topk")
    num_slots = T.dynamic("num_expanded_tokens")
    sf_cols, sf_s0, sf_s1 = T.dynamic("sf_cols"), T.dynamic("sf_s0"), T.dynamic("sf_s1")
    nvec = hidden // V
    x_words = (num_tokens, nvec * 4)
    out_words = (num_slots, nvec * 4)
    grid = T.max(num_tokens, T.ceildiv(num_slots, ZERO_ROWS))

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
            pad = T.alloc_var("int32")
            my_pos = T.alloc_var("int32")
            pos = T.alloc_var("int32")
            # padding rows among slots [16 bx, 16 bx + 16): one parallel read, a warp-wide mask
            pad = 0
            if lane < ZERO_ROWS and bx * ZERO_ROWS + lane < num_slots:
                if pos_to_expert[bx * ZERO_ROWS + lane] < 0:
                    pad = 1
            mask = T.Cast("int32", T.ballot_sync(pad))
            for r in T.serial(ZERO_ROWS):
                if (mask >> r) & 1 != 0:
                    for c in T.serial(T.ceildiv(nvec, THREADS)):
                        if c * THREADS + tid < nvec:
                            for w in T.vectorized(4):
                                T.Tensor(out_words, "uint32", out.data)[bx * ZERO_ROWS + r,
                                                                        (c * THREADS + tid) * 4 + w] = T.uint32(0)
                    for c in T.serial(T.ceildiv(sf_cols, THREADS)):
                        if c * THREADS + tid < sf_cols:
                            out_sf[bx * ZERO_ROWS + r, c * THREADS + tid] = T.Cast(sf, 0)
            if bx < num_tokens:
                for c in T.serial(T.ceildiv(nvec, THREADS * U)):
                    for u in T.unroll(U):
                        if (c * U + u) * THREADS + tid < nvec:
                            for w in T.vectorized(4):
                                words[u * 4 + w] = T.Tensor(x_words, "uint32", x.data)[
                                    bx, ((c * U + u) * THREADS + tid) * 4 + w]
                    for kc in T.serial(T.ceildiv(num_topk, WARP)):
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
                    if c * THREADS + tid < sf_cols:
                        sfv[0] = x_sf[bx, c * THREADS + tid]
                    for kc in T.serial(T.ceildiv(num_topk, WARP)):
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
        doc="Candidate of moe.expand_to_fused_with_sf (same parameters and bits): each index read once, "
            "in parallel (ballot of the padding rows, shuffled top-k slots).",
    ),
)

__all__ = ["KERNELS", "expand_to_fused_with_sf_candidate"]
