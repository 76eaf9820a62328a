"""``moe.reduce_fused_few_tokens``: ``moe.reduce_fused`` for fewer than 1024 tokens (the op's
``_REDUCE_SPLIT_TOKENS``), with the top-k rows loaded together and the hidden dimension split
over blocks.  Same parameters, variants and output bits as ``moe.reduce_fused`` (see
``reduce_fused.py`` for the contract: per token, fp32 ``acc = 0``, one ``T.ieee_fmaf`` per valid
top-k slot in top-k order, ``* sf[0]`` with ``T.ieee_mul``, cast).

Design: grid ``(num_tokens, ceil(hidden / (THREADS * ELEMS)))``, every thread owning ``ELEMS`` = 8
channels of one token; per batch of ``KB`` = 8 top-k slots it loads the slots and weights (one
round trip), then all ``KB`` rows' vectors (one round trip, 8 back-to-back ``LDG.E.128``, row
addresses from a flat view: ~10 instructions per row), then runs the FMAs in top-k order.

Why two kernels: ``moe.reduce_fused`` runs one block per token, and inside a chunk its run-time
top-k loop reads ``token_topk_to_pos[t, k]``, then the row, then FMAs before the next slot: at
decode (a single block for 1 token) that is ~32 dependent DRAM round trips per token.  H200,
hidden 7168 bf16, top-k 8: this kernel 2.2-7.6 us at 1-128 tokens (``moe.reduce_fused`` 20.0-23.4),
still ahead at 1024 tokens (38.7 vs 42.3); at ~17k tokens (hidden 2048-7168, top-k 6) it moves
bytes 1.6x slower than ``moe.reduce_fused``, whose block reads one row at a time, so the op
launches this kernel below 1024 tokens only.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .reduce_fused import _VEC, GRID

THREADS = 128
ELEMS = 8  # channels per thread (bf16: one 16-byte vector, fp32: two)
KB = 8  # top-k slots whose rows are in flight together


def reduce_fused_few_tokens(in_dtype: str, out_dtype: str):
    """Build the PrimFunc of one variant (see the module docstring)."""
    if in_dtype not in _VEC or out_dtype not in (in_dtype, "float8_e4m3fn"):
        raise ValueError(f"reduce_fused_few_tokens: bad variant in_dtype={in_dtype!r} out_dtype={out_dtype!r}")
    V = _VEC[in_dtype]
    U = ELEMS // V
    num_tokens, hidden, num_topk = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_topk")
    num_slots, x_sf_len = T.dynamic("num_expanded_tokens"), T.dynamic("x_sf_len")
    nvec = hidden // V
    x_flat = (num_slots * nvec * V,)  # row length a multiple of V: every vector is 16-byte aligned
    out_vec = (num_tokens, nvec * V)

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
        with T.Kernel(num_tokens, T.ceildiv(nvec, U * THREADS), threads=THREADS) as (bx, by):
            tid = T.get_thread_binding()
            acc = T.alloc_local((ELEMS,), "float32")
            xin = T.alloc_local((KB * ELEMS,), in_dtype)
            res = T.alloc_local((ELEMS,), out_dtype)
            pos = T.alloc_local((KB,), "int32")
            w = T.alloc_local((KB,), "float32")
            s = T.alloc_var("float32")
            sfv = T.alloc_var("float32")
            col = T.alloc_var("int32")  # the thread's first vector
            col = by * (U * THREADS) + tid
            sfv = T.float32(1)
            if with_sf != 0:
                sfv = sf[0]
            for i in T.unroll(ELEMS):
                acc[i] = T.float32(0)
            for kc in T.serial(T.ceildiv(num_topk, KB)):
                # the batch's slots and weights: independent loads, one round trip
                for j in T.unroll(KB):
                    pos[j] = -1
                    w[j] = T.float32(1)
                    if kc * KB + j < num_topk:
                        pos[j] = token_topk_to_pos[bx, kc * KB + j]
                        if with_weights != 0:
                            w[j] = topk_weights[bx, kc * KB + j]
                # every valid slot's row: all in flight before the first FMA
                for j in T.unroll(KB):
                    if pos[j] >= 0 and pos[j] < num_slots:
                        for u in T.unroll(U):
                            if col + u * THREADS < nvec:
                                for v in T.vectorized(V):
                                    xin[(j * U + u) * V + v] = T.Tensor(x_flat, in_dtype, x.data)[
                                        (T.Cast("int64", pos[j]) * nvec + col + u * THREADS) * V + v]
                # the FMAs in top-k order (the shipped kernel's rounding sequence)
                for j in T.unroll(KB):
                    if pos[j] >= 0 and pos[j] < num_slots:
                        s = w[j]
                        if with_x_sf != 0:
                            s = T.ieee_mul(s, x_sf[pos[j]])
                        for u in T.unroll(U):
                            if col + u * THREADS < nvec:
                                for v in T.unroll(V):
                                    acc[u * V + v] = T.ieee_fmaf(T.Cast("float32", xin[(j * U + u) * V + v]), s,
                                                                 acc[u * V + v])
            for u in T.unroll(U):
                if col + u * THREADS < nvec:
                    for v in T.unroll(V):
                        if with_sf != 0:
                            acc[u * V + v] = T.ieee_mul(acc[u * V + v], sfv)
                    for v in T.vectorized(V):
                        res[u * V + v] = T.Cast(out_dtype, acc[u * V + v])
                    for v in T.vectorized(V):
                        T.Tensor(out_vec, out_dtype, out.data)[bx, (col + u * THREADS) * V + v] = res[u * V + v]

    return main


KERNELS = (
    KernelDecl(
        name="moe.reduce_fused_few_tokens",
        factory=reduce_fused_few_tokens,
        grid=GRID,
        outputs=("out",),
        align=16,
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="moe.reduce_fused (same parameters and bits) for the op's calls below 1024 tokens: hidden split "
            "over blocks, a batch of 8 top-k rows loaded together before the in-order FMAs.",
    ),
)

__all__ = ["KERNELS", "reduce_fused_few_tokens"]
