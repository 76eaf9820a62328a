"""``mhc._expand_fwd_candidate_persist{8,16}``: speed candidates for ``mhc.expand_fwd`` (issue 9):
same parameters, variant (``{}``) and bits; the bench and ``tests/gpu/test_gpu_cand_mhc.py``
launch them directly (``runtime.unchecked_launcher("mhc._expand_fwd_candidate_persist8")``).

``(x, out)``: ``x`` bf16 ``[num_tokens, hidden]``, ``out`` bf16 ``[num_tokens, mhc_mult,
hidden]``; ``out[t, m, :] = x[t, :]`` for every stream ``m`` (a bit copy).  ``num_tokens``,
``mhc_mult`` (>= 1) and ``hidden`` (``% 8 == 0``) are run-time symbols; contiguous, 16-byte
aligned tensors.

Why: the shipped kernel runs one block per token (80 registers, 6 blocks per SM; 40 KB moved
per block at mhc_mult 4), so 4096 tokens make ~5.2 waves of long blocks and the nearly empty
last wave leaves DRAM underused (88-89 % of copy at 4096 tokens, 92 % at 8192 x 7168).  The
round-1 candidate (a block per 128-vector segment, 16 blocks per SM) measured 3-5 % slower
than shipped everywhere and is replaced by these.  Here the grid is persistent: ``G = min(items,
132 * B)`` blocks (``B`` = 8 or 16 blocks per SM) walk the flat list of *items* (a token's
128-vector chunk: 2 KB in, ``mhc_mult`` x 2 KB out) with a grid stride (item ``bx + k * G``), so
every SM streams until the last ~1/25 of the work and no block turnover gaps the load stream.
Each thread's 16-byte vector of item ``k`` is copied by ``cp.async`` (zero-filled past the row)
into its private slot ``k % S`` of a shared ring ``S - 1`` items ahead of its ``mhc_mult``
``STG.E.128``; a thread reads only what it copied, so ``cp.async.wait_group`` is the only wait.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
SM_COUNT = 132  # H200: the persistent grid is SM_COUNT * blocks per SM blocks at most
STAGES = 4  # ring slots: 3 items' loads in flight during one item's stores
# a thread reads only the ring bytes it copied: no block barriers (cp.async.wait_group suffices)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}


def cp_async(dst, src, n, pred):
    """One 16-byte ``cp.async`` of ``n`` elements into shared memory, zero-filling when ``pred`` is false."""
    return T.ptx_cp_async(T.access_ptr(dst, "w", n), T.access_ptr(src, "r", n), n, pred)


def expand_fwd_candidate_persist(blocks: int):
    """Build the persistent forward with ``blocks`` blocks per SM (``__launch_bounds__(128, blocks)``)."""
    S = STAGES
    num_tokens, mhc, hidden = T.dynamic("num_tokens"), T.dynamic("mhc_mult"), T.dynamic("hidden")
    nvec = hidden // V
    nch = T.ceildiv(nvec, THREADS)  # items per token
    total = num_tokens * nch
    G = T.min(total, SM_COUNT * blocks)
    x_flat = (num_tokens * nvec * V,)
    o_flat = (num_tokens * mhc * nvec * V,)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), "bfloat16"),
        out: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
    ):
        with T.Kernel(G, threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(blocks)
            tid = T.get_thread_binding()
            ring = T.alloc_shared((S, THREADS * V), "bfloat16")
            buf = T.alloc_local((V,), "bfloat16")
            items = T.alloc_var("int32")
            ti = T.alloc_var("int32")  # the issue cursor: token and chunk of item bx + j * G (no division
            ci = T.alloc_var("int32")  # per item: it steps G = gq * nch + gr items)
            tc = T.alloc_var("int32")  # the store cursor: item bx + (j - (S - 1)) * G
            cc = T.alloc_var("int32")
            gq = T.alloc_var("int32")
            gr = T.alloc_var("int32")
            items = T.ceildiv(total - bx, G)
            gq = T.truncdiv(G, nch)
            gr = T.truncmod(G, nch)
            ti = T.truncdiv(bx, nch)
            ci = T.truncmod(bx, nch)
            tc = ti
            cc = ci
            # iteration j issues item bx + j * G and stores item bx + (j - (S - 1)) * G
            for j in T.serial(items + S - 1):
                T.sync_warp()  # a compiler fence: the last reads of slot j % S stay before its refill
                vi = ci * THREADS + tid
                cp_async(ring[j % S, tid * V], T.Tensor(x_flat, "bfloat16", x.data)[(ti * nvec + vi) * V], V,
                         j < items and vi < nvec)
                T.ptx_commit_group()  # one group per iteration, possibly empty
                ti = ti + gq
                ci = ci + gr
                if ci >= nch:
                    ci = ci - nch
                    ti = ti + 1
                if j >= S - 1:
                    vc = cc * THREADS + tid
                    T.ptx_wait_group(S - 1)  # the stored item's copy (this thread's) has landed
                    T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                    if vc < nvec:
                        for i in T.vectorized(V):
                            buf[i] = ring[(j - (S - 1)) % S, tid * V + i]
                        for m in T.serial(mhc):
                            T.stg128(T.Tensor(o_flat, "bfloat16", out.data)[((tc * mhc + m) * nvec + vc) * V],
                                     T.Tensor((1,), "uint32x4", buf.data)[0])
                    tc = tc + gq
                    cc = cc + gr
                    if cc >= nch:
                        cc = cc - nch
                        tc = tc + 1

    return main


def expand_fwd_candidate_persist8():
    """8 blocks (32 warps) per SM."""
    return expand_fwd_candidate_persist(8)


def expand_fwd_candidate_persist16():
    """16 blocks (64 warps, the SM's most) per SM."""
    return expand_fwd_candidate_persist(16)


KERNELS = (
    KernelDecl(
        name="mhc._expand_fwd_candidate_persist8",
        factory=expand_fwd_candidate_persist8,
        grid=({},),
        outputs=("out",),
        pass_configs=PASS_CONFIGS,
        doc="Speed candidate for mhc.expand_fwd: persistent grid (132 x 8), flat items, cp.async ring.",
    ),
    KernelDecl(
        name="mhc._expand_fwd_candidate_persist16",
        factory=expand_fwd_candidate_persist16,
        grid=({},),
        outputs=("out",),
        pass_configs=PASS_CONFIGS,
        doc="Speed candidate for mhc.expand_fwd: persistent grid (132 x 16), flat items, cp.async ring.",
    ),
)

__all__ = ["KERNELS", "THREADS", "expand_fwd_candidate_persist", "expand_fwd_candidate_persist16",
           "expand_fwd_candidate_persist8"]
