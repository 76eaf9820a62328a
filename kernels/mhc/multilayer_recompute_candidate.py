"""``mhc._multilayer_recompute_candidate_cp`` / ``_persist``: speed candidates for
``mhc.multilayer_recompute`` (issue 9): same parameters, variants (``mhc_mult`` 4, 2, 8) and
bits; the bench and ``tests/gpu/test_gpu_cand_mhc.py`` launch them directly
(``runtime.unchecked_launcher("mhc._multilayer_recompute_candidate_cp", mhc_mult=M)`` with the
op's ``ptrs`` table).

Parameters (as the shipped kernel): ``initial_residual`` bf16 ``[n, M, hidden]``, ``ptrs`` int64
``[6, num_layers]`` (rows: pre_mix, layer_input, layer_output, post_mix, comb_mix, residual
data pointers), ``num_post`` (``num_layers - 1`` or ``num_layers``).  Per token and element, with
``r`` the fp32 residual, every product and sum rounded on its own in the shipped order::

    for i < num_post:
        layer_input[i] = bf16(sum_j pre_mix[i][j] * r[j])
        residual[i][o] = bf16(post_mix[i][o] * layer_output[i] + sum_j comb_mix[i][j, o] * r[j])
        r = fp32(residual[i])
    if num_post < num_layers:  layer_input[num_post] = bf16(sum_j pre_mix[num_post][j] * r[j])

Why: the shipped block (tokens x segments of 256 vectors, 2 per thread and stream, 123
registers, 4 blocks per SM) loads its residual and first layer output, runs the layers and
exits: nothing within a block overlaps the first loads' latency, every fourth block is half idle
at hidden 7168, and the SM's load stream gaps at each block turnover.  The round-1 candidate (a
two-slot register ring per token, 128 registers) measured 2-4 % slower everywhere and is
replaced by these.  Here a block walks its (token, 128-vector chunk) *items* (a block per token,
or with ``persistent`` at most ``132 * CP_BLOCKS`` blocks, each taking a contiguous 1/G of the
flat (token, chunk) list, balanced to one item);
item ``j``'s residual streams and first layer output (``M + 1`` 16-byte vectors per thread) are
copied by ``cp.async`` into the thread's private slot ``j % S`` of a shared ring, ``S - 1`` items
ahead of the layers' math (no registers held per byte in flight; ``cp.async.wait_group`` is the
only wait).  Later layer outputs are loaded before each layer's math, as shipped; the mixes are
reloaded per item and layer (16-byte loads, L1 hits after a token's first item).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
MULTS = (4, 2, 8)
SM_COUNT = 132  # H200: the persistent grid is SM_COUNT * CP_BLOCKS[m] blocks at most
CP_STAGES = {2: 4, 4: 4, 8: 3}  # ring slots: S - 1 items in flight during one item's layers
CP_BLOCKS = {2: 6, 4: 4, 8: 2}  # blocks per SM (shared memory S * (M + 1) * 2 KB a block)
# a thread reads only the ring bytes it copied: no block barriers; every access is guarded
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}


def cp_async(dst, src, n, pred):
    """One 16-byte ``cp.async`` of ``n`` elements into shared memory, zero-filling when ``pred`` is false."""
    return T.ptx_cp_async(T.access_ptr(dst, "w", n), T.access_ptr(src, "r", n), n, pred)


def multilayer_recompute_candidate_cp(mhc_mult: int, persistent: bool = False):
    """Build the PrimFunc for ``mhc_mult`` streams (a block per token, or a persistent grid)."""
    m = mhc_mult
    vm = 4 if m % 4 == 0 else m  # fp32 per vector load of a mix row
    S, K = CP_STAGES[m], m + 1  # ring slots; vectors per item and thread (streams, first layer output)
    n, hidden, layers = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_layers")
    hv = hidden // V  # vectors per token row
    nch = T.ceildiv(hv, THREADS)  # items per token
    G = T.min(n * nch, SM_COUNT * CP_BLOCKS[m]) if persistent else n
    r_flat = (n * m * hv * V,)
    o_flat = (n * hv * V,)

    @T.prim_func
    def main(
        initial_residual: T.Tensor((n, m, hidden), "bfloat16"),
        ptrs: T.Tensor((6, layers), "int64"),
        num_post: T.int32,
    ):
        with T.Kernel(G, threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(CP_BLOCKS[m])
            tid = T.get_thread_binding()
            ring = T.alloc_shared((S, K, THREADS * V), "bfloat16")
            rb = T.alloc_local((m * V,), "bfloat16")  # the residual entering the layer (bf16 exactly)
            nb = T.alloc_local((m * V,), "bfloat16")  # the residual leaving it
            ob = T.alloc_local((V,), "bfloat16")  # this layer's output
            obn = T.alloc_local((V,), "bfloat16")  # the next layer's, loaded early
            lb = T.alloc_local((V,), "bfloat16")
            acc = T.alloc_local((V,), "float32")
            pre = T.alloc_local((m,), "float32")
            post = T.alloc_local((m,), "float32")
            comb = T.alloc_local((m * m,), "float32")
            items = T.alloc_var("int32")
            ti = T.alloc_var("int32")  # the issue cursor: token and chunk of item j (no division per item)
            ci = T.alloc_var("int32")
            tok = T.alloc_var("int32")  # the compute cursor: token and chunk of item j - (S - 1)
            cc = T.alloc_var("int32")
            items = T.ceildiv(n * nch, G)  # per: block bx takes items bx * per .. (bx + 1) * per - 1
            ti = T.truncdiv(bx * items, nch)
            ci = T.truncmod(bx * items, nch)
            items = T.max(T.min(items, n * nch - bx * items), 0)  # (clipped at the end)
            tok = ti
            cc = ci
            # iteration j issues item j and computes item j - (S - 1)
            for j in T.serial(items + S - 1):
                T.sync_warp()  # a compiler fence: the last reads of slot j % S stay before its refill
                vi = ci * THREADS + tid
                ok = j < items and vi < hv
                for q in T.unroll(m):
                    cp_async(ring[j % S, q, tid * V], T.Tensor(r_flat, "bfloat16", initial_residual.data)[
                        ((ti * m + q) * hv + vi) * V], V, ok)
                cp_async(ring[j % S, m, tid * V], T.make_tensor_from_addr(ptrs[2, 0], o_flat, "bfloat16")[
                    (ti * hv + vi) * V], V, ok and num_post > 0)
                T.ptx_commit_group()  # one group per iteration, possibly empty
                ci = ci + 1
                if ci == nch:
                    ci = 0
                    ti = ti + 1
                if j >= S - 1:
                    jc = j - (S - 1)
                    vc = cc * THREADS + tid
                    T.ptx_wait_group(S - 1)  # item jc's copies (this thread's) have landed
                    T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                    if vc < hv:
                        for q in T.unroll(m):
                            for e in T.vectorized(V):
                                rb[q * V + e] = ring[jc % S, q, tid * V + e]
                        for e in T.vectorized(V):
                            ob[e] = ring[jc % S, m, tid * V + e]
                        for i in T.serial(num_post):
                            for c in T.unroll(m // vm):
                                for k in T.vectorized(vm):
                                    pre[c * vm + k] = T.make_tensor_from_addr(ptrs[0, i], (n, m), "float32")[
                                        tok, c * vm + k]
                            for c in T.unroll(m // vm):
                                for k in T.vectorized(vm):
                                    post[c * vm + k] = T.make_tensor_from_addr(ptrs[3, i], (n, m), "float32")[
                                        tok, c * vm + k]
                            for c in T.unroll(m * m // 4):
                                for k in T.vectorized(4):
                                    comb[c * 4 + k] = T.make_tensor_from_addr(ptrs[4, i], (n, m * m), "float32")[
                                        tok, c * 4 + k]
                            if i + 1 < num_post:  # no output overlaps an input (the op checks)
                                for e in T.vectorized(V):
                                    obn[e] = T.make_tensor_from_addr(ptrs[2, i + 1], o_flat, "bfloat16")[
                                        (tok * hv + vc) * V + e]
                            # the layer's input from the residual entering it
                            for e in T.unroll(V):
                                acc[e] = T.ieee_mul(pre[0], T.Cast("float32", rb[e]))
                            for q in T.unroll(m - 1):
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_add(acc[e], T.ieee_mul(pre[q + 1],
                                                                           T.Cast("float32", rb[(q + 1) * V + e])))
                            for e in T.unroll(V):
                                lb[e] = T.Cast("bfloat16", acc[e])
                            T.stg128(T.make_tensor_from_addr(ptrs[1, i], o_flat, "bfloat16")[(tok * hv + vc) * V],
                                     T.Tensor((1,), "uint32x4", lb.data)[0])
                            # the residual leaving it, one output stream at a time
                            for o in T.unroll(m):
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_mul(post[o], T.Cast("float32", ob[e]))
                                for q in T.unroll(m):
                                    for e in T.unroll(V):
                                        acc[e] = T.ieee_add(acc[e], T.ieee_mul(comb[q * m + o],
                                                                               T.Cast("float32", rb[q * V + e])))
                                for e in T.unroll(V):
                                    nb[o * V + e] = T.Cast("bfloat16", acc[e])
                            for o in T.unroll(m):
                                T.stg128(T.make_tensor_from_addr(ptrs[5, i], r_flat, "bfloat16")[
                                    ((tok * m + o) * hv + vc) * V], T.Tensor((m,), "uint32x4", nb.data)[o])
                            for e in T.unroll(m * V):
                                rb[e] = nb[e]
                            for e in T.unroll(V):
                                ob[e] = obn[e]
                        if num_post < layers:
                            for c in T.unroll(m // vm):
                                for k in T.vectorized(vm):
                                    pre[c * vm + k] = T.make_tensor_from_addr(ptrs[0, num_post], (n, m), "float32")[
                                        tok, c * vm + k]
                            for e in T.unroll(V):
                                acc[e] = T.ieee_mul(pre[0], T.Cast("float32", rb[e]))
                            for q in T.unroll(m - 1):
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_add(acc[e], T.ieee_mul(pre[q + 1],
                                                                           T.Cast("float32", rb[(q + 1) * V + e])))
                            for e in T.unroll(V):
                                lb[e] = T.Cast("bfloat16", acc[e])
                            T.stg128(T.make_tensor_from_addr(ptrs[1, num_post], o_flat, "bfloat16")[
                                (tok * hv + vc) * V], T.Tensor((1,), "uint32x4", lb.data)[0])
                    cc = cc + 1
                    if cc == nch:
                        cc = 0
                        tok = tok + 1

    return main


def multilayer_recompute_candidate_persist(mhc_mult: int):
    """``multilayer_recompute_candidate_cp(mhc_mult, persistent=True)``."""
    return multilayer_recompute_candidate_cp(mhc_mult, True)


KERNELS = (
    KernelDecl(
        name="mhc._multilayer_recompute_candidate_cp",
        factory=multilayer_recompute_candidate_cp,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=(),  # it writes only through ptrs (the op checks those tensors)
        pass_configs=PASS_CONFIGS,
        doc="Speed candidate for mhc.multilayer_recompute: a block per token, cp.async shared-memory ring.",
    ),
    KernelDecl(
        name="mhc._multilayer_recompute_candidate_persist",
        factory=multilayer_recompute_candidate_persist,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=(),
        pass_configs=PASS_CONFIGS,
        doc="Speed candidate for mhc.multilayer_recompute: a persistent grid (132 x blocks per SM), cp.async ring.",
    ),
)

__all__ = ["KERNELS", "MULTS", "THREADS", "multilayer_recompute_candidate_cp", "multilayer_recompute_candidate_persist"]
