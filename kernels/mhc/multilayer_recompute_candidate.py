"""Speed candidates for ``mhc.multilayer_recompute`` (issue 9, round 3): ``_tm``, ``_pf``, ``_tmpf``.

Same parameters (``initial_residual`` bf16 ``[n, M, hidden]``, ``ptrs`` int64 ``[6, num_layers]``,
``num_post``), variants (``mhc_mult`` 4, 2, 8), per-thread work split (128 threads, ``U`` = 2
vectors per thread and stream, ``__launch_bounds__`` as shipped) and per-element expressions as
the shipped kernel (``multilayer_recompute.py``): bit-identical outputs.  Launched directly
(``runtime.unchecked_launcher("mhc._multilayer_recompute_candidate_<tag>", mhc_mult=M)``) with
the op's pointer table; ``tests/gpu/test_gpu_cand_mhc_recompute.py`` checks them bit for bit.

Measured before (H200, 2 layers, M = 4): the kernel's time against the bytes it moves is a line
with a ~8 µs intercept (145.4 / 282.4 µs at 4096 / 8192 x 4096 tokens; ``expand_to_mhc`` fwd,
80 % stores too, has 3-5 µs) and ~3.92 TB/s of slope (expand 3.91-3.99).  So the loss is mostly
per-block latency (ramp, tail) and locality, not steady-state streaming.  Two hypotheses:

``tm`` (token-major blocks): the shipped grid ``(tokens, segments)`` runs blockIdx.x = token
fastest, so all tokens' segment 0 are streamed before any segment 1: co-resident blocks touch
every token row in 4 KB pieces 8 KB apart (hidden 4096) and a token's second segment re-fetches
its 6 mix lines (pre / post / comb of 2 layers) from DRAM half a kernel later (its layer-1 mix
load is a dependent DRAM round trip mid-block).  Here a 1D grid of ``tokens * segments`` blocks,
``tok = bx / segments`` (one int32 division per block): co-resident blocks cover whole,
contiguous token rows (as ``expand_fwd``, ``post_fwd`` and ``pre_apply_mix_fwd`` do, which reach
89-95 % of copy) and a token's segments share their mix lines in L2.

``pf`` (mix prefetch through shared memory): per layer the shipped loop loads ``ptrs`` then that
layer's pre / post / comb mixes (``LD.E.128``) and the math waits on them, so layer ``i + 1``'s
mixes are a dependent round trip after layer ``i``'s stores (one per block at 2 layers, about a
memory latency of idle block life, and the last wave's drain is that much longer).  Here layer
``i + 1``'s mixes are copied by ``cp.async`` (lanes 0.. of each warp, one 16-byte unit each: M = 4
6 units, M = 2 4 of 8 bytes, M = 8 20; a private replica per warp, two slots) before layer ``i``'s
math, next to the next layer output's early load; layer 0's with the residual loads.  No
register holds them in flight (the shipped kernel sits at 123 of 128 registers for M = 4), and
only ``cp.async.wait_group`` + ``__syncwarp`` order them (no block barrier).  ``tmpf`` combines
both.

SASS (nvcc 13.0, sm_90a; M = 4 / 2 / 8 registers, spills; shipped 123 / 96 / 251, none): ``tm`` 126 /
94 / 247, none (same 8 LDG.E.128 + 11 LD.E.128 + 12 STG.E.128, 448 FMUL + 352 FADD as shipped; +~20
instructions once for the division); ``pf`` 128 / 100 / 219, none (4 LD.E.128: the mix loads
become one LDGSTS.E.BYPASS.128 per lane < 6 per layer, 6 broadcast LDS.128 per layer read where used;
768 B shared per block for M = 4); ``tmpf`` 128 / 103 / 219, M = 4 spills one 4-byte word (1 STL, 1
LDL per layer on lanes < 6, outside the math).  Blocks per SM as shipped (4; 2 for M = 8).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
WARPS = THREADS // 32
U = 2  # vectors per thread and stream (as shipped)
V = 8  # bf16 per 16-byte vector
MULTS = (4, 2, 8)
# every global access is guarded; the shared mix replica is per warp (__syncwarp orders it)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}


def recompute_candidate(mhc_mult: int, token_major: bool, prefetch: bool):
    """The shipped kernel with a token-major 1D grid (``token_major``) and/or the next layer's
    mixes prefetched by ``cp.async`` into a per-warp shared replica (``prefetch``)."""
    m = mhc_mult
    vm = 4 if m % 4 == 0 else m  # fp32 per vector load of a mix row (and per cp.async unit)
    npre = m // vm  # cp.async units of a pre (or post) row
    nunits = 2 * npre + m * m // vm  # units of a layer's mixes: pre, post, comb (in the slot in that order)
    NM = 2 * m + m * m  # fp32 per slot: pre [0, m), post [m, 2m), comb [2m, 2m + m * m)
    n, hidden, layers = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_layers")
    hv = hidden // V  # vectors per token row
    PH = THREADS * U  # vectors per segment
    nseg = T.ceildiv(hv, PH)
    min_blocks = 4 if m <= 4 else 2  # as shipped

    # ptxas fits either form of the lane's mix unit (ptrs row, fp32 element) in 128 registers for M = 4
    # only with one grid order: kept in two registers (token-major: 1 spilled word, reloaded per layer
    # by lanes < nunits), else recomputed from tok per layer (no spill)
    unit_vars = token_major

    @T.macro
    def issue_mixes(ptrs, mixs, slot, layer, w, lane, tok, mrow, moff, num_post):
        """Lane ``l < nunits`` of each warp copies unit ``l`` of ``layer``'s mixes (pre, post,
        comb in that order) into the warp's replica in ``slot``; a unit past the layer's mixes
        (post / comb of layer num_post, pre of layer num_layers) is zero-filled instead, never
        read.  One commit group per call (empty on the other lanes)."""
        if lane < nunits:
            if unit_vars:
                row = mrow
                off = moff
            else:
                row = T.if_then_else(lane < npre, 0, T.if_then_else(lane < 2 * npre, 3, 4))
                off = T.if_then_else(lane < npre, tok * m + lane * vm, T.if_then_else(
                    lane < 2 * npre, tok * m + (lane - npre) * vm, tok * (m * m) + (lane - 2 * npre) * vm))
            ok = T.if_then_else(lane < npre, layer < layers, layer < num_post)
            T.ptx_cp_async(T.access_ptr(mixs[slot, w, lane * vm], "w", vm), T.access_ptr(
                T.make_tensor_from_addr(ptrs[row, T.min(layer, layers - 1)], (n * m * m,), "float32")[off], "r", vm),
                vm, ok)
        T.ptx_commit_group()

    @T.prim_func
    def main(
        initial_residual: T.Tensor((n, m, hidden), "bfloat16"),
        ptrs: T.Tensor((6, layers), "int64"),
        num_post: T.int32,
    ):
        with T.Kernel(n * nseg if token_major else n, 1 if token_major else nseg, threads=THREADS) as (bx, by):
            T.annotate_min_blocks_per_sm(min_blocks)
            tid = T.get_thread_binding()
            rb = T.alloc_local((U, m, V), "bfloat16")  # the residual entering the layer (bf16 exactly)
            nb = T.alloc_local((m, V), "bfloat16")  # the residual leaving it (one vector at a time)
            lb = T.alloc_local((V,), "bfloat16")
            ob = T.alloc_local((U, V), "bfloat16")  # this layer's output
            obn = T.alloc_local((U, V), "bfloat16")  # the next layer's, loaded early (in flight during the math)
            acc = T.alloc_local((V,), "float32")
            pre = T.alloc_local((m,), "float32")
            post = T.alloc_local((m,), "float32")
            comb = T.alloc_local((m * m,), "float32")
            mixs = T.alloc_shared((2, WARPS, NM), "float32")  # prefetch: slot layer % 2, a replica per warp
            tok = T.alloc_var("int32")
            g = T.alloc_var("int32")
            mrow = T.alloc_var("int32")  # prefetch: this lane's mix unit, ptrs row and fp32 element
            moff = T.alloc_var("int32")
            if token_major:
                tok = T.truncdiv(bx, nseg)
                g = bx - tok * nseg
            else:
                tok = bx
                g = by
            w = tid // 32
            lane = tid % 32
            for u in T.unroll(U):
                if g * PH + u * THREADS + tid < hv:
                    for j in T.unroll(m):
                        for e in T.vectorized(V):
                            rb[u, j, e] = T.Tensor((n, m, hv * V), "bfloat16", initial_residual.data)[
                                tok, j, (g * PH + u * THREADS + tid) * V + e]
            if prefetch:  # this lane's mix unit (ptrs row, element); layer 0's into slot 0 (with the residual loads)
                if unit_vars:
                    mrow = T.if_then_else(lane < npre, 0, T.if_then_else(lane < 2 * npre, 3, 4))
                    moff = T.if_then_else(lane < npre, tok * m + lane * vm, T.if_then_else(
                        lane < 2 * npre, tok * m + (lane - npre) * vm, tok * (m * m) + (lane - 2 * npre) * vm))
                issue_mixes(ptrs, mixs, 0, 0, w, lane, tok, mrow, moff, num_post)
            if num_post > 0:
                for u in T.unroll(U):
                    if g * PH + u * THREADS + tid < hv:
                        for e in T.vectorized(V):
                            ob[u, e] = T.make_tensor_from_addr(ptrs[2, 0], (n, hv * V), "bfloat16")[
                                tok, (g * PH + u * THREADS + tid) * V + e]
            for i in T.serial(num_post):
                if prefetch:
                    T.sync_warp()  # every lane's reads of slot (i + 1) % 2 (layer i - 1) precede its refill
                    issue_mixes(ptrs, mixs, (i + 1) % 2, i + 1, w, lane, tok, mrow, moff, num_post)
                if i + 1 < num_post:  # no output overlaps an input (the op checks), so reading early is safe
                    for u in T.unroll(U):
                        if g * PH + u * THREADS + tid < hv:
                            for e in T.vectorized(V):
                                obn[u, e] = T.make_tensor_from_addr(ptrs[2, i + 1], (n, hv * V), "bfloat16")[
                                    tok, (g * PH + u * THREADS + tid) * V + e]
                if prefetch:  # the mixes are read from the slot where they are used (fewer live registers)
                    T.ptx_wait_group(1)  # this thread's copies of layer i have landed
                    T.sync_warp()  # ... and every lane's (the wait asm has no memory clobber: a fence too)
                else:
                    for c in T.unroll(m // vm):
                        for k in T.vectorized(vm):
                            pre[c * vm + k] = T.make_tensor_from_addr(ptrs[0, i], (n, m), "float32")[tok, c * vm + k]
                    for c in T.unroll(m // vm):
                        for k in T.vectorized(vm):
                            post[c * vm + k] = T.make_tensor_from_addr(ptrs[3, i], (n, m), "float32")[
                                tok, c * vm + k]
                    for c in T.unroll(m * m // 4):
                        for k in T.vectorized(4):
                            comb[c * 4 + k] = T.make_tensor_from_addr(ptrs[4, i], (n, m * m), "float32")[
                                tok, c * 4 + k]
                for u in T.unroll(U):
                    if g * PH + u * THREADS + tid < hv:
                        # the layer's input from the residual entering it
                        if prefetch:
                            for e in T.unroll(V):
                                acc[e] = T.ieee_mul(mixs[i % 2, w, 0], T.Cast("float32", rb[u, 0, e]))
                            for j in T.unroll(m - 1):
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_add(acc[e], T.ieee_mul(mixs[i % 2, w, j + 1],
                                                                           T.Cast("float32", rb[u, j + 1, e])))
                        else:
                            for e in T.unroll(V):
                                acc[e] = T.ieee_mul(pre[0], T.Cast("float32", rb[u, 0, e]))
                            for j in T.unroll(m - 1):
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_add(acc[e], T.ieee_mul(pre[j + 1],
                                                                           T.Cast("float32", rb[u, j + 1, e])))
                        for e in T.unroll(V):
                            lb[e] = T.Cast("bfloat16", acc[e])
                        T.stg128(T.make_tensor_from_addr(ptrs[1, i], (n, hv * V), "bfloat16")[
                            tok, (g * PH + u * THREADS + tid) * V], T.Tensor((1,), "uint32x4", lb.data)[0])
                        # the residual leaving it, one output stream at a time
                        for o in T.unroll(m):
                            if prefetch:
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_mul(mixs[i % 2, w, m + o], T.Cast("float32", ob[u, e]))
                                for j in T.unroll(m):
                                    for e in T.unroll(V):
                                        acc[e] = T.ieee_add(acc[e], T.ieee_mul(mixs[i % 2, w, 2 * m + j * m + o],
                                                                               T.Cast("float32", rb[u, j, e])))
                            else:
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_mul(post[o], T.Cast("float32", ob[u, e]))
                                for j in T.unroll(m):
                                    for e in T.unroll(V):
                                        acc[e] = T.ieee_add(acc[e], T.ieee_mul(comb[j * m + o],
                                                                               T.Cast("float32", rb[u, j, e])))
                            for e in T.unroll(V):
                                nb[o, e] = T.Cast("bfloat16", acc[e])
                        for o in T.unroll(m):
                            T.stg128(T.make_tensor_from_addr(ptrs[5, i], (n, m, hv * V), "bfloat16")[
                                tok, o, (g * PH + u * THREADS + tid) * V], T.Tensor((m,), "uint32x4", nb.data)[o])
                        for o in T.unroll(m):
                            for e in T.unroll(V):
                                rb[u, o, e] = nb[o, e]
                        for e in T.unroll(V):
                            ob[u, e] = obn[u, e]
            if num_post < layers:
                if prefetch:
                    T.ptx_wait_group(0)
                    T.sync_warp()
                    for c in T.unroll(m // vm):
                        for k in T.vectorized(vm):
                            pre[c * vm + k] = mixs[num_post % 2, w, c * vm + k]
                else:
                    for c in T.unroll(m // vm):
                        for k in T.vectorized(vm):
                            pre[c * vm + k] = T.make_tensor_from_addr(ptrs[0, num_post], (n, m), "float32")[
                                tok, c * vm + k]
                for u in T.unroll(U):
                    if g * PH + u * THREADS + tid < hv:
                        for e in T.unroll(V):
                            acc[e] = T.ieee_mul(pre[0], T.Cast("float32", rb[u, 0, e]))
                        for j in T.unroll(m - 1):
                            for e in T.unroll(V):
                                acc[e] = T.ieee_add(acc[e], T.ieee_mul(pre[j + 1], T.Cast("float32", rb[u, j + 1, e])))
                        for e in T.unroll(V):
                            lb[e] = T.Cast("bfloat16", acc[e])
                        T.stg128(T.make_tensor_from_addr(ptrs[1, num_post], (n, hv * V), "bfloat16")[
                            tok, (g * PH + u * THREADS + tid) * V], T.Tensor((1,), "uint32x4", lb.data)[0])

    return main


def recompute_candidate_tm(mhc_mult: int):
    """Token-major 1D grid, mixes loaded as shipped."""
    return recompute_candidate(mhc_mult, True, False)


def recompute_candidate_pf(mhc_mult: int):
    """The shipped grid, the next layer's mixes prefetched by cp.async."""
    return recompute_candidate(mhc_mult, False, True)


def recompute_candidate_tmpf(mhc_mult: int):
    """Token-major 1D grid and the mix prefetch."""
    return recompute_candidate(mhc_mult, True, True)


def _decl(tag: str, factory, doc: str) -> KernelDecl:
    return KernelDecl(
        name=f"mhc._multilayer_recompute_candidate_{tag}",
        factory=factory,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=(),  # it writes only through ptrs (the op checks those tensors)
        pass_configs=PASS_CONFIGS,
        doc=f"Speed candidate for mhc.multilayer_recompute: {doc}.",
    )


KERNELS = (
    _decl("tm", recompute_candidate_tm, "token-major 1D grid (a token's segments adjacent)"),
    _decl("pf", recompute_candidate_pf, "next layer's mixes prefetched by cp.async into a per-warp shared replica"),
    _decl("tmpf", recompute_candidate_tmpf, "token-major 1D grid and the cp.async mix prefetch"),
)

__all__ = ["KERNELS", "MULTS", "THREADS", "U", "recompute_candidate"]
