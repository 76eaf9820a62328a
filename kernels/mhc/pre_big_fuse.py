"""``mhc.pre_big_fuse``: the fused inference path of mHC pre (tile_kernels 1.0.0 ``mhc_pre_big_fuse``).

It runs after ``mhc.norm_fn_fwd_mul`` (see ``norm_fn.py``), whose split-K partials it reads,
and does in one pass per token what the unfused path does in four kernels
(``mhc.norm_fn_fwd_norm`` -> ``mhc.pre_split_mixes_fwd`` -> ``mhc.sinkhorn_fwd`` ->
``mhc.pre_apply_mix_fwd``), with the same operations in the same order, so its outputs equal
the unfused ones bit for bit:

1. mixes: ``mix[j] = (part_mul[0, t, j] + part_mul[1, t, j] + ...) * rms`` with
   ``rms = rsqrt((part_sq[0, t] + part_sq[1, t] + ...) / K + rms_eps)``, ``K = M * hidden``
   (partials added in split order, as ``mhc.norm_fn_fwd_norm``);
2. split: ``z[c] = mix[c] * scale[seg(c)] + base[c]`` (product and sum rounded apart),
   ``pre = sigmoid(z) + pre_eps``, ``post = sigmoid(z) * post_mult_value``, ``comb = z``
   (as ``mhc.pre_split_mixes_fwd``);
3. Sinkhorn of comb: row softmax (max in index order, ``exp(x - max)``, sums in index order)
   ``+ eps``, then ``2 * repeat - 1`` alternating column / row normalisations
   ``P * (1 / (sum + eps))``, sums in index order; every operation from ``_sinkhorn_math``'s
   IEEE expression builders in ``mhc.sinkhorn_fwd``'s order, so the bits are its bits;
4. apply: ``acc = pre[0] * x_0; acc = fma(pre[m], x_m, acc)``, ``layer_input = bf16(acc)``
   (as ``mhc.pre_apply_mix_fwd``).

Parameters, in order: ``part_mul`` fp32 ``[S, T, N]``, ``part_sq`` fp32 ``[S, T]``, ``scale``
fp32 ``[3]``, ``base`` fp32 ``[N]``, ``residual`` bf16 ``[T, M, hidden]``; outputs ``post_mix``
fp32 ``[T, M]``, ``comb_mix`` fp32 ``[T, M * M]``, ``layer_input`` bf16 ``[T, hidden]``;
scalars ``rms_eps``, ``pre_eps``, ``sinkhorn_eps``, ``post_mult_value`` (fp32), ``repeat``
(int32 >= 1).  ``M`` is the compile-time key; T, S and hidden (a multiple of 8) are run-time.

Design: one block of 128 threads per token.  Threads ``j < N`` reduce the partials of mix ``j``
into shared memory; after one barrier every thread derives the M pre mixes and streams the
token's ``M`` rows of the residual in 16-byte vectors (``U`` vectors per stream and thread per
phase, all loads issued before the arithmetic) into 16-byte stores of ``layer_input``; thread 0
then computes post and the Sinkhorn matrix in registers and stores them (the other warps are
already done: the serial Sinkhorn overlaps other blocks' streaming).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from . import _sinkhorn_math as sm

THREADS = 128
V = 8  # bf16 per 16-byte vector
MULTS = (4, 2, 8)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded


def pre_big_fuse(mhc_mult: int):
    m = mhc_mult
    mm = m * m
    n = m * (m + 2)
    U = max(1, 16 // m)
    PH = THREADS * U
    num_tokens, n_splits, hidden = T.dynamic("num_tokens"), T.dynamic("n_splits"), T.dynamic("hidden")
    nvec = hidden // V
    x_vec = (num_tokens, m, nvec * V)
    o_vec = (num_tokens, nvec * V)

    @T.prim_func
    def main(
        part_mul: T.Tensor((n_splits, num_tokens, n), "float32"),
        part_sq: T.Tensor((n_splits, num_tokens), "float32"),
        scale: T.Tensor((3,), "float32"),
        base: T.Tensor((n,), "float32"),
        residual: T.Tensor((num_tokens, m, hidden), "bfloat16"),
        post_mix: T.Tensor((num_tokens, m), "float32"),
        comb_mix: T.Tensor((num_tokens, mm), "float32"),
        layer_input: T.Tensor((num_tokens, hidden), "bfloat16"),
        rms_eps: T.float32,
        pre_eps: T.float32,
        sinkhorn_eps: T.float32,
        post_mult_value: T.float32,
        repeat: T.int32,
    ):
        with T.Kernel(num_tokens, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            mixes = T.alloc_shared((n,), "float32")
            w = T.alloc_local((m,), "float32")
            xs = T.alloc_local((U * m * V,), "bfloat16")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((U * V,), "bfloat16")
            p = T.alloc_local((mm,), "float32")
            s = T.alloc_local((m,), "float32")
            inv = T.alloc_local((m,), "float32")  # 1 / (sum + eps) of a Sinkhorn step
            s_sq = T.alloc_var("float32")
            s_mul = T.alloc_var("float32")
            if tid < n:
                s_sq = part_sq[0, bx]
                s_mul = part_mul[0, bx, tid]
                for q in T.serial(n_splits - 1):
                    s_sq = s_sq + part_sq[q + 1, bx]
                    s_mul = s_mul + part_mul[q + 1, bx, tid]
                rms = T.rsqrt(s_sq / T.Cast("float32", m * hidden) + rms_eps)
                mixes[tid] = s_mul * rms
            T.sync_threads()
            for c in T.unroll(m):
                w[c] = T.sigmoid(T.ieee_add(T.ieee_mul(mixes[c], scale[0]), base[c])) + pre_eps
            for ph in T.serial(T.ceildiv(nvec, PH)):
                for u in T.unroll(U):
                    if ph * PH + tid + u * THREADS < nvec:
                        for c in T.unroll(m):
                            for i in T.vectorized(V):
                                xs[(u * m + c) * V + i] = T.Tensor(x_vec, "bfloat16", residual.data)[
                                    bx, c, (ph * PH + tid + u * THREADS) * V + i]
                for u in T.unroll(U):
                    if ph * PH + tid + u * THREADS < nvec:
                        for i in T.unroll(V):
                            acc[i] = T.ieee_mul(w[0], T.Cast("float32", xs[(u * m) * V + i]))
                        for c in T.unroll(m - 1):
                            for i in T.unroll(V):
                                acc[i] = T.ieee_fmaf(w[c + 1], T.Cast("float32", xs[(u * m + c + 1) * V + i]), acc[i])
                        for i in T.vectorized(V):
                            ob[u * V + i] = T.Cast("bfloat16", acc[i])
                        T.stg128(T.Tensor(o_vec, "bfloat16", layer_input.data)[bx, (ph * PH + tid + u * THREADS) * V],
                                 T.Tensor((U,), "uint32x4", ob.data)[u])
            if tid == 0:
                for c in T.unroll(m):
                    post_mix[bx, c] = T.sigmoid(T.ieee_add(T.ieee_mul(mixes[m + c], scale[1]), base[m + c])) * post_mult_value
                for c in T.unroll(mm):
                    p[c] = T.ieee_add(T.ieee_mul(mixes[2 * m + c], scale[2]), base[2 * m + c])
                # softmax along each row, then + eps
                for r in T.unroll(m):
                    s[r] = p[r * m]
                    for j in T.unroll(m - 1):
                        s[r] = T.max(s[r], p[r * m + j + 1])
                for r in T.unroll(m):
                    for j in T.unroll(m):
                        p[r * m + j] = sm.shifted_exp(p[r * m + j], s[r])
                for r in T.unroll(m):
                    s[r] = p[r * m]
                    for j in T.unroll(m - 1):
                        s[r] = sm.add(s[r], p[r * m + j + 1])
                for r in T.unroll(m):
                    for j in T.unroll(m):
                        p[r * m + j] = sm.softmax_plus_eps(p[r * m + j], s[r], sinkhorn_eps)
                for k in T.serial(2 * repeat - 1):
                    if k % 2 == 0:  # columns
                        for j in T.unroll(m):
                            s[j] = p[j]
                            for r in T.unroll(m - 1):
                                s[j] = sm.add(s[j], p[(r + 1) * m + j])
                        for j in T.unroll(m):
                            inv[j] = sm.inv_sum(s[j], sinkhorn_eps)
                        for r in T.unroll(m):
                            for j in T.unroll(m):
                                p[r * m + j] = sm.scaled(p[r * m + j], inv[j])
                    else:  # rows
                        for r in T.unroll(m):
                            s[r] = p[r * m]
                            for j in T.unroll(m - 1):
                                s[r] = sm.add(s[r], p[r * m + j + 1])
                        for r in T.unroll(m):
                            inv[r] = sm.inv_sum(s[r], sinkhorn_eps)
                        for r in T.unroll(m):
                            for j in T.unroll(m):
                                p[r * m + j] = sm.scaled(p[r * m + j], inv[r])
                for c in T.unroll(mm):
                    comb_mix[bx, c] = p[c]

    return main


KERNELS = (
    KernelDecl(
        name="mhc.pre_big_fuse",
        factory=pre_big_fuse,
        grid=tuple({"mhc_mult": mm} for mm in MULTS),
        outputs=("post_mix", "comb_mix", "layer_input"),
        pass_configs=PASS_CONFIGS,
        doc="mixes from split-K partials, split, Sinkhorn, apply mix: post_mix, comb_mix, layer_input.",
    ),
)

__all__ = ["KERNELS", "MULTS", "pre_big_fuse"]
