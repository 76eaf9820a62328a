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

Design.  Why this shape: an earlier version ran one block of 128 threads per token that streamed the
residual and then kept its SM slot while thread 0 alone ran post and the Sinkhorn (ncu at 4096 x 4096: 17.5
active threads per warp, 101 registers, 4 blocks and 15 % occupancy per SM, DRAM 36 %).

Here the grid is ``(ceil(T / 128) + T, ceil(hidden / (8 * 128 * U)))`` blocks of 128 threads
(``U = max(1, 8 / M)``), in two roles:

* blocks ``(bx < ceil(T / 128), 0)`` (scheduled first; the rest of that column exits at once):
  one thread per token ``bx * 128 + tid`` sums the split-K partials of the post and comb mixes
  and of the squares in split order, applies the RMS factor, writes ``post_mix`` and runs the
  Sinkhorn in registers with that earlier version's thread-0 code (``_sinkhorn_math``'s
  IEEE builders, the same order), so ``post_mix`` / ``comb_mix`` keep their bits; these few
  blocks run beside the streaming ones;
* block ``(ceil(T / 128) + t, g)`` streams segment ``g`` of token ``t``, as
  ``mhc.pre_apply_mix_fwd`` (95 % of copy on the H200): each thread issues its ``U * M``
  16-byte residual loads first, then threads ``c < M`` reduce the partials of pre mix ``c``
  (split order) into ``pre[c]`` in shared memory while the loads fly,
  one barrier, and every thread runs ``acc = pre[0] * x_0; acc = fma(pre[m], x_m, acc)`` into
  16-byte stores of ``layer_input``.  ``__launch_bounds__(128, 8)`` for M = 4: 64 registers,
  no spills, 8 blocks (32 warps) per SM keep the loads in flight.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from . import _sinkhorn_math as sm

THREADS = 128  # threads per block; also tokens per Sinkhorn block
V = 8  # bf16 per 16-byte vector
MULTS = (4, 2, 8)
# every access is guarded; the one shared hand-off (pre_sh) has its own barrier
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}
MIN_BLOCKS = {2: 6, 4: 8, 8: 4}  # blocks per SM the register cap allows (__launch_bounds__)


def pre_big_fuse(mhc_mult: int):
    m = mhc_mult
    mm = m * m
    n = m * (m + 2)
    nq = n - m  # post + comb mixes
    U = max(1, 8 // m)
    PH = THREADS * U
    num_tokens, n_splits, hidden = T.dynamic("num_tokens"), T.dynamic("n_splits"), T.dynamic("hidden")
    nvec = hidden // V
    x_vec = (num_tokens, m, nvec * V)
    o_vec = (num_tokens, nvec * V)
    nsk = T.ceildiv(num_tokens, THREADS)

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
        with T.Kernel(nsk + num_tokens, T.ceildiv(nvec, PH), threads=THREADS) as (bx, by):
            T.annotate_min_blocks_per_sm(MIN_BLOCKS[m])  # M = 4: <= 64 registers, 32 warps per SM
            tid = T.get_thread_binding()
            pre_sh = T.alloc_shared((m,), "float32")
            w = T.alloc_local((m,), "float32")
            xs = T.alloc_local((U * m * V,), "bfloat16")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((U * V,), "bfloat16")
            q = T.alloc_local((nq,), "float32")
            p = T.alloc_local((mm,), "float32")
            s = T.alloc_local((m,), "float32")
            inv = T.alloc_local((m,), "float32")  # 1 / (sum + eps) of a Sinkhorn step
            s_sq = T.alloc_var("float32")
            s_mul = T.alloc_var("float32")
            if bx < nsk:  # post and Sinkhorn: one thread per token (row by == 0 only)
                if by == 0 and bx * THREADS + tid < num_tokens:
                    s_sq = part_sq[0, bx * THREADS + tid]
                    for c in T.unroll(nq):
                        q[c] = part_mul[0, bx * THREADS + tid, m + c]
                    for sp in T.serial(n_splits - 1):
                        s_sq = s_sq + part_sq[sp + 1, bx * THREADS + tid]
                        for c in T.unroll(nq):
                            q[c] = q[c] + part_mul[sp + 1, bx * THREADS + tid, m + c]
                    rms_q = T.rsqrt(s_sq / T.Cast("float32", m * hidden) + rms_eps)
                    for c in T.unroll(m):
                        post_mix[bx * THREADS + tid, c] = T.sigmoid(
                            T.ieee_add(T.ieee_mul(q[c] * rms_q, scale[1]), base[m + c])) * post_mult_value
                    for c in T.unroll(mm):
                        p[c] = T.ieee_add(T.ieee_mul(q[m + c] * rms_q, scale[2]), base[2 * m + c])
                    # the Sinkhorn of mhc.pre_big_fuse, in its operation order
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
                        comb_mix[bx * THREADS + tid, c] = p[c]
            elif by * PH < nvec:  # stream segment by of token bx - nsk
                for u in T.unroll(U):
                    if by * PH + tid + u * THREADS < nvec:
                        for c in T.unroll(m):
                            for i in T.vectorized(V):
                                xs[(u * m + c) * V + i] = T.Tensor(x_vec, "bfloat16", residual.data)[
                                    bx - nsk, c, (by * PH + tid + u * THREADS) * V + i]
                if tid < m:  # the pre mixes, while the loads are in flight
                    s_sq = part_sq[0, bx - nsk]
                    s_mul = part_mul[0, bx - nsk, tid]
                    for sp in T.serial(n_splits - 1):
                        s_sq = s_sq + part_sq[sp + 1, bx - nsk]
                        s_mul = s_mul + part_mul[sp + 1, bx - nsk, tid]
                    rms_w = T.rsqrt(s_sq / T.Cast("float32", m * hidden) + rms_eps)
                    pre_sh[tid] = T.sigmoid(T.ieee_add(T.ieee_mul(s_mul * rms_w, scale[0]), base[tid])) + pre_eps
                T.sync_threads()
                for c in T.unroll(m):
                    w[c] = pre_sh[c]
                for u in T.unroll(U):
                    if by * PH + tid + u * THREADS < nvec:
                        for i in T.unroll(V):
                            acc[i] = T.ieee_mul(w[0], T.Cast("float32", xs[(u * m) * V + i]))
                        for c in T.unroll(m - 1):
                            for i in T.unroll(V):
                                acc[i] = T.ieee_fmaf(w[c + 1], T.Cast("float32", xs[(u * m + c + 1) * V + i]), acc[i])
                        for i in T.vectorized(V):
                            ob[u * V + i] = T.Cast("bfloat16", acc[i])
                        T.stg128(T.Tensor(o_vec, "bfloat16", layer_input.data)[bx - nsk, (by * PH + tid + u * THREADS) * V],
                                 T.Tensor((U,), "uint32x4", ob.data)[u])

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
