"""``mhc._pre_apply_mix_fwd_candidate`` (round 1, register ring) and
``mhc._pre_apply_mix_fwd_candidate_cp`` / ``_cpwide`` / ``_persist`` (round 2, a ``cp.async``
shared-memory ring: ``pre_apply_mix_fwd_candidate_cp``): speed candidates for
``mhc.pre_apply_mix_fwd`` (issue 9):
same parameters, variants (``mhc`` 4, 2, 8) and bits; the bench and
``tests/gpu/test_gpu_cand_mhc.py`` launch it directly
(``runtime.unchecked_launcher("mhc._pre_apply_mix_fwd_candidate", mhc=M)``).

``(x, mix, out)``: ``x`` bf16 ``[num_tokens, mhc, hidden]``, ``mix`` fp32 ``[num_tokens, mhc]``,
``out`` bf16 ``[num_tokens, hidden]``.  Per token and element, in fp32 (the shipped kernel's
operations in its order)::

    acc = w_0 * x_0;  acc = fma(w_m, x_m, acc) for m = 1 .. mhc-1;  out = bf16(acc)

``num_tokens`` and ``hidden`` (``% 8 == 0``) are run-time symbols; contiguous, 16-byte aligned
tensors.

Why: the shipped kernel's block loads one 2048-value segment of a token (8 ``LDG.E.128`` per
thread at M = 4), computes, stores and exits, so nothing within a block overlaps its load
latency, and at hidden 7168 every fourth block is half idle (896 vectors in 256-vector
segments).  Here a block owns a token and walks its row in chunks of ``THREADS`` 16-byte vectors
(one per thread and stream; 4 chunks at hidden 4096, 7 at 7168, none partly idle) through a
``DEPTH``-deep register ring: chunk ``k + DEPTH - 1``'s loads are issued before chunk ``k``'s
math and store, so each thread keeps ``DEPTH - 1`` to ``DEPTH`` chunks of ``mhc`` vectors in
flight along its whole row, with 2x-4x fewer blocks than the shipped grid.  Ring slots are
compile-time indices (the chunk loop is unrolled ``DEPTH`` times); int32 vector indices.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
MHC_VALUES = (4, 2, 8)
DEPTH = {2: 4, 4: 3, 8: 2}  # chunks in the register ring
MIN_BLOCKS = {2: 8, 4: 6, 8: 4}  # __launch_bounds__ minimum blocks per SM
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded
# round 2, the shared-memory ring (``pre_apply_mix_fwd_candidate_cp``)
SM_COUNT = 132  # H200: the persistent grid is SM_COUNT * CP_BLOCKS[mhc] blocks at most
CP_STAGES = {2: 4, 4: 4, 8: 3}  # items (chunks) per block's ring: S - 1 in flight during one's math
CP_BLOCKS = {2: 8, 4: 6, 8: 4}  # blocks per SM (shared memory S * mhc * 2 KB a block)
# a thread reads only the ring bytes it copied: no block barriers (cp.async.wait_group suffices)
# the "wide" variant: (stages, blocks per SM): fewer slots, more resident warps
CP_WIDE = {2: (3, 12), 4: (3, 8), 8: (2, 6)}
CP_PASS_CONFIGS = dict(PASS_CONFIGS, **{"tl.disable_thread_storage_sync": True})


def pre_apply_mix_fwd_candidate(mhc: int):
    """Build the forward PrimFunc for ``mhc`` streams."""
    D = DEPTH[mhc]
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
    x_flat = (num_tokens * mhc * nvec * V,)
    o_flat = (num_tokens * nvec * V,)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        mix: T.Tensor((num_tokens, mhc), "float32"),
        out: T.Tensor((num_tokens, hidden), "bfloat16"),
    ):
        with T.Kernel(num_tokens, threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(MIN_BLOCKS[mhc])
            tid = T.get_thread_binding()
            ring = T.alloc_local((D * mhc * V,), "bfloat16")
            w = T.alloc_local((mhc,), "float32")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((V,), "bfloat16")
            xv = T.alloc_var("int32")  # vector index of the thread's stream-0 vector in chunk 0
            ov = T.alloc_var("int32")  # ... and of its output vector
            xv = bx * mhc * nvec + tid
            ov = bx * nvec + tid
            for m in T.unroll(mhc):
                w[m] = mix[bx, m]
            # prologue: chunks 0 .. D-2 into slots 0 .. D-2
            for j in T.unroll(D - 1):
                if j * THREADS + tid < nvec:
                    for m in T.unroll(mhc):
                        for i in T.vectorized(V):
                            ring[(j * mhc + m) * V + i] = T.Tensor(x_flat, "bfloat16", x.data)[
                                (xv + m * nvec + j * THREADS) * V + i]
            for p in T.serial(T.ceildiv(T.ceildiv(nvec, THREADS), D)):
                for j in T.unroll(D):
                    # issue chunk p*D + j + D - 1 into slot (j + D - 1) % D, then chunk p*D + j from slot j
                    if (p * D + j + D - 1) * THREADS + tid < nvec:
                        for m in T.unroll(mhc):
                            for i in T.vectorized(V):
                                ring[(((j + D - 1) % D) * mhc + m) * V + i] = T.Tensor(x_flat, "bfloat16", x.data)[
                                    (xv + m * nvec + (p * D + j + D - 1) * THREADS) * V + i]
                    if (p * D + j) * THREADS + tid < nvec:
                        for i in T.unroll(V):
                            acc[i] = T.ieee_mul(w[0], T.Cast("float32", ring[(j * mhc) * V + i]))
                        for m in T.unroll(mhc - 1):
                            for i in T.unroll(V):
                                acc[i] = T.ieee_fmaf(w[m + 1], T.Cast("float32", ring[(j * mhc + m + 1) * V + i]),
                                                     acc[i])
                        for i in T.vectorized(V):
                            ob[i] = T.Cast("bfloat16", acc[i])
                        T.stg128(T.Tensor(o_flat, "bfloat16", out.data)[(ov + (p * D + j) * THREADS) * V],
                                 T.Tensor((1,), "uint32x4", ob.data)[0])

    return main


def cp_async(dst, src, n, pred):
    """One 16-byte ``cp.async`` of ``n`` elements into shared memory, zero-filling when ``pred`` is false."""
    return T.ptx_cp_async(T.access_ptr(dst, "w", n), T.access_ptr(src, "r", n), n, pred)


def pre_apply_mix_fwd_candidate_cp(mhc: int, persistent: bool = False, stages: int = 0, blocks: int = 0):
    """Build the shared-memory-ring forward for ``mhc`` streams: a block per token, or with
    ``persistent`` a grid of at most ``SM_COUNT * B`` blocks, each taking a contiguous 1/G of the
    flat (token, chunk) list (balanced to one item).  A block walks its *items* in order; item
    ``j``'s ``mhc`` vectors per thread are copied by ``cp.async`` (16 bytes, zero-filled past the row) into ring
    slot ``j % S``, ``S - 1`` items ahead of the math.  A thread reads only the slot bytes it
    copied itself, so ``cp.async.wait_group`` is the only wait (no block barrier).  ``stages`` /
    ``blocks`` (0: ``CP_STAGES`` / ``CP_BLOCKS``) set ``S`` and ``__launch_bounds__``' blocks per SM."""
    S = stages or CP_STAGES[mhc]
    B = blocks or CP_BLOCKS[mhc]
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
    nch = T.ceildiv(nvec, THREADS)  # chunks (items) per token
    G = T.min(num_tokens * nch, SM_COUNT * B) if persistent else num_tokens
    x_flat = (num_tokens * mhc * nvec * V,)
    o_flat = (num_tokens * nvec * V,)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        mix: T.Tensor((num_tokens, mhc), "float32"),
        out: T.Tensor((num_tokens, hidden), "bfloat16"),
    ):
        with T.Kernel(G, threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(B)
            tid = T.get_thread_binding()
            ring = T.alloc_shared((S, mhc, THREADS * V), "bfloat16")
            buf = T.alloc_local((mhc * V,), "bfloat16")
            w = T.alloc_local((mhc,), "float32")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((V,), "bfloat16")
            items = T.alloc_var("int32")
            ti = T.alloc_var("int32")  # the issue cursor: token and chunk of item j (no division per item)
            ci = T.alloc_var("int32")
            tc = T.alloc_var("int32")  # the compute cursor: token and chunk of item j - (S - 1)
            cc = T.alloc_var("int32")
            items = T.ceildiv(num_tokens * nch, G)  # per: block bx takes items bx * per .. (bx + 1) * per - 1
            ti = T.truncdiv(bx * items, nch)
            ci = T.truncmod(bx * items, nch)
            items = T.max(T.min(items, num_tokens * nch - bx * items), 0)  # (clipped at the end)
            tc = ti
            cc = ci
            # iteration j issues item j and computes item j - (S - 1)
            for j in T.serial(items + S - 1):
                T.sync_warp()  # a compiler fence: the last reads of slot j % S stay before its refill
                vi = ci * THREADS + tid
                ok = j < items and vi < nvec
                for m in T.unroll(mhc):
                    cp_async(ring[j % S, m, tid * V], T.Tensor(x_flat, "bfloat16", x.data)[
                        ((ti * mhc + m) * nvec + vi) * V], V, ok)
                T.ptx_commit_group()  # one group per iteration, possibly empty
                ci = ci + 1
                if ci == nch:
                    ci = 0
                    ti = ti + 1
                if j >= S - 1:
                    jc = j - (S - 1)
                    vc = cc * THREADS + tid
                    if jc == 0 or cc == 0:  # the block's first item or a chunk 0: a new token's mix
                        for m in T.unroll(mhc):
                            w[m] = mix[tc, m]
                    T.ptx_wait_group(S - 1)  # item jc's copies (this thread's) have landed
                    T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                    if vc < nvec:
                        for m in T.unroll(mhc):
                            for i in T.vectorized(V):
                                buf[m * V + i] = ring[jc % S, m, tid * V + i]
                        for i in T.unroll(V):
                            acc[i] = T.ieee_mul(w[0], T.Cast("float32", buf[i]))
                        for m in T.unroll(mhc - 1):
                            for i in T.unroll(V):
                                acc[i] = T.ieee_fmaf(w[m + 1], T.Cast("float32", buf[(m + 1) * V + i]), acc[i])
                        for i in T.vectorized(V):
                            ob[i] = T.Cast("bfloat16", acc[i])
                        T.stg128(T.Tensor(o_flat, "bfloat16", out.data)[(tc * nvec + vc) * V],
                                 T.Tensor((1,), "uint32x4", ob.data)[0])
                    cc = cc + 1
                    if cc == nch:
                        cc = 0
                        tc = tc + 1

    return main


def pre_apply_mix_fwd_candidate_persist(mhc: int):
    """``pre_apply_mix_fwd_candidate_cp(mhc, persistent=True)``."""
    return pre_apply_mix_fwd_candidate_cp(mhc, True)



def pre_apply_mix_fwd_candidate_cpwide(mhc: int):
    """``pre_apply_mix_fwd_candidate_cp(mhc)`` with ``CP_WIDE[mhc]`` (stages, blocks per SM)."""
    stages, blocks = CP_WIDE[mhc]
    return pre_apply_mix_fwd_candidate_cp(mhc, False, stages, blocks)


KERNELS = (
    KernelDecl(
        name="mhc._pre_apply_mix_fwd_candidate",
        factory=pre_apply_mix_fwd_candidate,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("out",),
        pass_configs=PASS_CONFIGS,
        doc="Speed candidate for mhc.pre_apply_mix_fwd (same parameters, variants and bits): a block per token, "
            "register ring.",
    ),
    KernelDecl(
        name="mhc._pre_apply_mix_fwd_candidate_cp",
        factory=pre_apply_mix_fwd_candidate_cp,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("out",),
        pass_configs=CP_PASS_CONFIGS,
        doc="Speed candidate for mhc.pre_apply_mix_fwd: a block per token, cp.async shared-memory ring.",
    ),
    KernelDecl(
        name="mhc._pre_apply_mix_fwd_candidate_persist",
        factory=pre_apply_mix_fwd_candidate_persist,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("out",),
        pass_configs=CP_PASS_CONFIGS,
        doc="Speed candidate for mhc.pre_apply_mix_fwd: a persistent grid (132 x blocks per SM), cp.async ring.",
    ),
    KernelDecl(
        name="mhc._pre_apply_mix_fwd_candidate_cpwide",
        factory=pre_apply_mix_fwd_candidate_cpwide,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("out",),
        pass_configs=CP_PASS_CONFIGS,
        doc="Speed candidate for mhc.pre_apply_mix_fwd: a block per token, cp.async ring of fewer slots, more "
            "blocks per SM.",
    ),
)

__all__ = ["KERNELS", "MHC_VALUES", "THREADS", "pre_apply_mix_fwd_candidate", "pre_apply_mix_fwd_candidate_cp",
           "pre_apply_mix_fwd_candidate_cpwide",
           "pre_apply_mix_fwd_candidate_persist"]
