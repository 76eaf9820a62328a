"""``moe.reduce_fused_paired``: ``moe.reduce_fused`` (same parameters, variants and output bits) with
a token's valid top-k slots found by one warp vote and the rows of two slots loaded together.

Contract: see ``reduce_fused.py`` (per token, fp32 ``acc = 0``, one ``T.ieee_fmaf`` per valid
top-k slot in top-k order with ``s = w * x_sf[p]`` by ``T.ieee_mul``, ``* sf[0]`` by
``T.ieee_mul``, cast).

Served by ``ops/moe/_routing.py``'s reduce_fused from ``_REDUCE_SPLIT_TOKENS`` tokens on when a row
has ``hidden * x.element_size() <= 12288`` bytes; wider rows keep ``moe.reduce_fused`` and fewer
tokens ``moe.reduce_fused_few_tokens``.

Why (issue 12, e4m3 + sf output at ~17k tokens, top-k 6, most slots -1): ``moe.reduce_fused``
walks the top-k in a run-time loop, a load of ``token_topk_to_pos[t, k]`` before each row and
the FMAs of that row before the next slot's load, repeats the walk per chunk of 2048 bytes of a
thread block's row, and loads ``sf[0]`` after the last FMA, so a block spends most of its life
waiting on dependent round trips with one row (or none) in flight.

Measured (H200, CUPTI kernel time, L2 flushed; ~17.6k rows = 4001 tokens x 8 EP ranks, top-k 6,
e4m3 output with sf; ``moe.reduce_fused`` -> this kernel, tile_kernels 1.0.0 in brackets):
hidden 2048 bf16 51.52 -> 44.70 us [41.4]; hidden 3072 fp32 103.98 -> 97.70 [92.4]; hidden 7168
fp32 213.42 -> 217.63 [204.7], slower: hence the 12288-byte rule (3072 fp32 rows are 12288
bytes, 7168 fp32 rows 28672).  Decode sizes (below ``_REDUCE_SPLIT_TOKENS``) never launch it.

Design: blocks of 128 threads, ``tpb`` = 1-4 consecutive tokens per block (``tpb`` grows with the
token count so that the grid stays >= 4096 blocks).  Lane ``k`` of every warp loads slot ``k``'s
position and weight (one round trip for the token, issued while the previous token's rows are in
flight), ``__ballot_sync`` gives the valid slots, and per chunk of ``THREADS x U`` vectors the
rows of ``B`` valid slots at a time (slot position by ``SHFL.IDX``) are loaded back to back
before their FMAs in top-k order.  ``sf[0]`` is loaded once per block, first.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .reduce_fused import _VEC, ACC, GRID

THREADS = 128
WARP = 32
B = 2  # valid top-k slots whose rows are in flight together
TPB = 4  # most tokens per block
SPREAD = 4096  # a block takes one more token per SPREAD tokens (up to TPB)
MIN_BLOCKS = {"bfloat16": 8, "float32": 7}  # __launch_bounds__(128, n): <= 64 / 72 registers


def _tokens_per_block(num_tokens):
    return T.max(1, T.min(TPB, num_tokens // SPREAD))


def reduce_fused_paired(in_dtype: str, out_dtype: str):
    """Build the PrimFunc of one variant (see the module docstring)."""
    if in_dtype not in _VEC or out_dtype not in (in_dtype, "float8_e4m3fn"):
        raise ValueError(f"moe.reduce_fused_paired: bad variant in_dtype={in_dtype!r} out_dtype={out_dtype!r}")
    V = _VEC[in_dtype]
    U = ACC // V
    num_tokens, hidden, num_topk = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_topk")
    num_slots, x_sf_len = T.dynamic("num_expanded_tokens"), T.dynamic("x_sf_len")
    nvec = hidden // V
    x_flat = (num_slots * nvec * V,)  # row length a multiple of V: every vector is 16-byte aligned
    out_flat = (num_tokens * nvec * V,)
    tpb = _tokens_per_block(num_tokens)

    @T.prim_func
    def main(
        x: T.Tensor((num_slots, hidden), in_dtype),
        topk_weights: T.Tensor((num_tokens, num_topk), "float32"),
        token_topk_to_pos: T.Tensor((num_tokens, num_topk), "int32"),
        out: T.Tensor((num_tokens, hidden), out_dtype),
        sf: T.Tensor((1,), "float32"),
        x_sf: T.Tensor((x_sf_len,), "float32"),
        with_weights: T.int32,
        with_x_sf: T.int32,
        with_sf: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, tpb), threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(MIN_BLOCKS[in_dtype])
            tid = T.get_thread_binding()
            lane = tid % WARP
            acc = T.alloc_local((ACC,), "float32")
            xin = T.alloc_local((B * ACC,), in_dtype)
            res = T.alloc_local((ACC,), out_dtype)
            lj = T.alloc_local((B,), "int32")  # the batch's slots (lanes), -1: none
            sj = T.alloc_local((B,), "float32")
            rj = T.alloc_local((B,), "int32")  # the batch's row offsets, in vectors (int32: no 64-bit math)
            col = T.alloc_var("int32")  # the thread's first vector of the chunk
            sfv = T.alloc_var("float32")
            nxt_pos = T.alloc_var("int32")  # lane k: slot k of the next token
            nxt_w = T.alloc_var("float32")
            my_pos = T.alloc_var("int32")  # lane k: slot k of this token (slot 32 kc + k in group kc)
            my_s = T.alloc_var("float32")
            g_pos = T.alloc_var("int32")
            g_s = T.alloc_var("float32")
            mask0 = T.alloc_var("int32")
            m = T.alloc_var("int32")  # the group's valid slots not yet loaded
            nb = T.alloc_var("int32")  # its batches (counted before m changes: nvcc re-tests the bound)
            t = T.alloc_var("int32")
            sfv = T.float32(1)
            if with_sf != 0:
                sfv = sf[0]
            nxt_pos = -1
            nxt_w = T.float32(1)
            if lane < num_topk:
                nxt_pos = token_topk_to_pos[bx * tpb, lane]
                if with_weights != 0:
                    nxt_w = topk_weights[bx * tpb, lane]
            for i in T.serial(tpb):
                t = bx * tpb + i
                if t < num_tokens:
                    my_pos = nxt_pos
                    my_s = nxt_w
                    # the next token's slots, in flight with this token's rows
                    nxt_pos = -1
                    nxt_w = T.float32(1)
                    if i + 1 < tpb and t + 1 < num_tokens and lane < num_topk:
                        nxt_pos = token_topk_to_pos[t + 1, lane]
                        if with_weights != 0:
                            nxt_w = topk_weights[t + 1, lane]
                    if with_x_sf != 0 and my_pos >= 0 and my_pos < num_slots:
                        my_s = T.ieee_mul(my_s, x_sf[my_pos])
                    mask0 = T.Cast("int32", T.ballot_sync(T.Cast("int32", my_pos >= 0 and my_pos < num_slots)))
                    for c in T.serial(T.ceildiv(nvec, THREADS * U)):
                        col = c * (U * THREADS) + tid
                        for e in T.unroll(ACC):
                            acc[e] = T.float32(0)
                        for kc in T.serial(T.ceildiv(num_topk, WARP)):
                            g_pos = my_pos
                            g_s = my_s
                            m = mask0
                            if kc > 0:  # top-k > 32: slots 32 kc + lane (rare; reloaded per chunk)
                                g_pos = -1
                                g_s = T.float32(1)
                                if kc * WARP + lane < num_topk:
                                    g_pos = token_topk_to_pos[t, kc * WARP + lane]
                                    if with_weights != 0:
                                        g_s = topk_weights[t, kc * WARP + lane]
                                if with_x_sf != 0 and g_pos >= 0 and g_pos < num_slots:
                                    g_s = T.ieee_mul(g_s, x_sf[g_pos])
                                m = T.Cast("int32", T.ballot_sync(T.Cast("int32", g_pos >= 0 and g_pos < num_slots)))
                            nb = T.ceildiv(T.call_extern("int32", "__popc", m), B)
                            for b in T.serial(nb):
                                for j in T.unroll(B):
                                    lj[j] = T.call_extern("int32", "__ffs", m) - 1
                                    m = m & (m - 1)
                                    rj[j] = T.shfl_sync(g_pos, T.max(lj[j], 0)) * nvec + col
                                # the batch's rows: all in flight before the first FMA
                                for j in T.unroll(B):
                                    if lj[j] >= 0:
                                        for u in T.unroll(U):
                                            if col + u * THREADS < nvec:
                                                for v in T.vectorized(V):
                                                    xin[(j * U + u) * V + v] = T.Tensor(x_flat, in_dtype, x.data)[
                                                        (rj[j] + u * THREADS) * V + v]
                                for j in T.unroll(B):
                                    if lj[j] >= 0:
                                        sj[j] = T.shfl_sync(g_s, T.max(lj[j], 0))
                                        for u in T.unroll(U):
                                            if col + u * THREADS < nvec:
                                                for v in T.unroll(V):
                                                    acc[u * V + v] = T.ieee_fmaf(
                                                        T.Cast("float32", xin[(j * U + u) * V + v]),
                                                        sj[j], acc[u * V + v])
                        for u in T.unroll(U):
                            if col + u * THREADS < nvec:
                                if with_sf != 0:
                                    for v in T.unroll(V):
                                        acc[u * V + v] = T.ieee_mul(acc[u * V + v], sfv)
                                for v in T.vectorized(V):
                                    res[u * V + v] = T.Cast(out_dtype, acc[u * V + v])
                                for v in T.vectorized(V):
                                    T.Tensor(out_flat, out_dtype, out.data)[
                                        (t * nvec + col + u * THREADS) * V + v] = res[u * V + v]

    return main


KERNELS = (
    KernelDecl(
        name="moe.reduce_fused_paired",
        factory=reduce_fused_paired,
        grid=GRID,
        outputs=("out",),
        align=16,
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="moe.reduce_fused (same parameters and bits) for many tokens and rows of <= 12288 bytes: valid "
            "top-k slots by one warp vote, 2 slots' rows in flight together, 1-4 tokens per block with the next "
            "token's slots prefetched.",
    ),
)

__all__ = ["KERNELS", "reduce_fused_paired"]
