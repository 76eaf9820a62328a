"""``mhc.pre_apply_mix_fwd`` / ``mhc.pre_apply_mix_bwd``: the sublayer input as a mix of the
mHC streams, and its gradients.

``mhc.pre_apply_mix_fwd(x, mix, out)``: ``x`` bf16 ``[num_tokens, mhc, hidden]``, ``mix`` fp32
``[num_tokens, mhc]``, ``out`` bf16 ``[num_tokens, hidden]``.  Per token and element, in fp32
with ``x_m = float(x[t, m, i])`` and ``w_m = mix[t, m]``::

    acc = w_0 * x_0;  acc = fma(w_m, x_m, acc) for m = 1 .. mhc-1;  out = bf16(acc)

``mhc.pre_apply_mix_bwd(grad_out, x, mix, grad_x, grad_mix, accumulate)``: ``grad_out`` bf16
``[num_tokens, hidden]``; ``x``, ``mix`` as above; ``grad_x`` bf16 ``[num_tokens, mhc, hidden]``
(read too when ``accumulate`` is 1); ``grad_mix`` fp32 ``[num_tokens, mhc]``; ``accumulate``
int32 0/1.  With ``g = float(grad_out[t, i])``::

    grad_x[t, m, i] = bf16(w_m * g)                              (accumulate == 0)
    grad_x[t, m, i] = bf16(fma(w_m, g, float(grad_x[t, m, i])))  (accumulate == 1: adds in place)
    grad_mix[t, m] = sum_i g * x_m                               (fp32; order: see the design)

``mhc`` is the compile-time key (2, 4 or 8); ``num_tokens`` and ``hidden`` are run-time symbols
(``hidden % 8 == 0``).  Contiguous, 16-byte aligned tensors.

Forward design: a block of ``THREADS`` = 128 threads per token (grid ``num_tokens``) walks the
token's row in *items* of ``THREADS`` 16-byte vectors (one per thread and stream; 4 items at hidden
4096, 7, none partly idle, at 7168).  Item ``j``'s ``mhc`` vectors per thread are copied by
``cp.async`` (``LDGSTS``, L1 bypassed, no register held per byte in flight; 16 bytes, zero-filled
past the row) into slot ``j % S`` of a shared-memory ring, ``S - 1`` items ahead of the math
(``S`` = ``STAGES[mhc]``, ``__launch_bounds__`` ``BLOCKS[mhc]`` blocks per SM; M = 4: S = 4, 6
blocks, 32 KB shared per block, ~144 KB of loads in flight per SM all along the row).  A thread
reads only the slot bytes it copied itself, so ``cp.async.wait_group S-1`` is the only wait (no
block barrier: ``tl.disable_thread_storage_sync``).  The (token, chunk) of the issued and of the
computed item are int32 cursors stepped per item (no division per item).  The mixes are loaded
at the block's first item (broadcast reads).

Backward design: blocks of ``THREADS`` threads, one per token, walk the row in *segments* of
``THREADS * U`` 16-byte vectors (a run-time loop); in a segment thread ``tr`` owns the vectors
``base + tr + u * THREADS`` (``u < U = max(1, 4 // mhc)``, a compile-time step: immediate address
offsets), the same vector of every stream.  A thread issues all of a segment's loads (``U * mhc``
vectors of x, grad_out and, when accumulating, grad_x) before any arithmetic, leaving registers
for several blocks per SM.  ``grad_mix``: a thread adds its products in (segment, vector,
element) order, each warp combines its lanes by xor-shuffles (offsets 16, 8, 4, 2, 1) and the
four warps' sums are added in warp order; deterministic for a given hidden.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from ._ring import cp_async

THREADS = 128
WARPS = THREADS // 32
V = 8  # bf16 per 16-byte vector
MHC_VALUES = (4, 2, 8)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded
STAGES = {2: 4, 4: 4, 8: 3}  # forward: items (chunks) per block's ring: S - 1 in flight during one's math
BLOCKS = {2: 8, 4: 6, 8: 4}  # forward: blocks per SM (shared memory S * mhc * 2 KB a block)
# the forward: a thread reads only the ring bytes it copied: no block barriers (cp.async.wait_group suffices)
FWD_PASS_CONFIGS = dict(PASS_CONFIGS, **{"tl.disable_thread_storage_sync": True})


def bwd_vectors(mhc: int) -> int:
    """Vectors per thread and segment of the backward for ``mhc`` streams."""
    return max(1, 4 // mhc)


def pre_apply_mix_fwd(mhc: int):
    """Build the forward PrimFunc for ``mhc`` streams: a block per token walks its items in order;
    item ``j``'s ``mhc`` vectors per thread are copied by ``cp.async`` (16 bytes, zero-filled past
    the row) into ring slot ``j % S``, ``S - 1`` items ahead of the math.  A thread reads only the
    slot bytes it copied itself, so ``cp.async.wait_group`` is the only wait (no block barrier)."""
    S = STAGES[mhc]
    B = BLOCKS[mhc]
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
    nch = T.ceildiv(nvec, THREADS)  # chunks (items) per token
    G = num_tokens  # blocks (the item split below is general: block bx takes items bx * per ..)
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


def pre_apply_mix_bwd(mhc: int):
    """Build the backward PrimFunc for ``mhc`` streams."""
    U = bwd_vectors(mhc)
    PH = THREADS * U
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
    x_vec = (num_tokens, mhc, nvec * V)
    o_vec = (num_tokens, nvec * V)

    @T.prim_func
    def main(
        grad_out: T.Tensor((num_tokens, hidden), "bfloat16"),
        x: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        mix: T.Tensor((num_tokens, mhc), "float32"),
        grad_x: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        grad_mix: T.Tensor((num_tokens, mhc), "float32"),
        accumulate: T.int32,
    ):
        with T.Kernel(num_tokens, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            gs = T.alloc_local((U * V,), "bfloat16")
            xs = T.alloc_local((U * mhc * V,), "bfloat16")
            olds = T.alloc_local((U * mhc * V,), "bfloat16")
            w = T.alloc_local((mhc,), "float32")
            part = T.alloc_local((mhc,), "float32")
            ob = T.alloc_local((U * mhc * V,), "bfloat16")
            red = T.alloc_shared((mhc, WARPS), "float32")
            tot = T.alloc_var("float32")
            for m in T.unroll(mhc):
                w[m] = mix[bx, m]
                part[m] = T.float32(0)
            for ph in T.serial(T.ceildiv(nvec, PH)):
                for u in T.unroll(U):
                    if ph * PH + tid + u * THREADS < nvec:
                        for i in T.vectorized(V):
                            gs[u * V + i] = T.Tensor(o_vec, "bfloat16", grad_out.data)[bx, (ph * PH + tid + u * THREADS) * V + i]
                        for m in T.unroll(mhc):
                            for i in T.vectorized(V):
                                xs[(u * mhc + m) * V + i] = T.Tensor(x_vec, "bfloat16", x.data)[
                                    bx, m, (ph * PH + tid + u * THREADS) * V + i]
                        if accumulate != 0:
                            for m in T.unroll(mhc):
                                for i in T.vectorized(V):
                                    olds[(u * mhc + m) * V + i] = T.Tensor(x_vec, "bfloat16", grad_x.data)[
                                        bx, m, (ph * PH + tid + u * THREADS) * V + i]
                for u in T.unroll(U):
                    if ph * PH + tid + u * THREADS < nvec:
                        for m in T.unroll(mhc):
                            for i in T.unroll(V):
                                part[m] = T.ieee_fmaf(T.Cast("float32", gs[u * V + i]),
                                                      T.Cast("float32", xs[(u * mhc + m) * V + i]), part[m])
                        if accumulate != 0:
                            for m in T.unroll(mhc):
                                for i in T.unroll(V):
                                    ob[(u * mhc + m) * V + i] = T.Cast("bfloat16", T.ieee_fmaf(
                                        w[m], T.Cast("float32", gs[u * V + i]), T.Cast("float32", olds[(u * mhc + m) * V + i])))
                        else:
                            for m in T.unroll(mhc):
                                for i in T.unroll(V):
                                    ob[(u * mhc + m) * V + i] = T.Cast("bfloat16", T.ieee_mul(
                                        w[m], T.Cast("float32", gs[u * V + i])))
                        for m in T.unroll(mhc):
                            T.stg128(T.Tensor(x_vec, "bfloat16", grad_x.data)[bx, m, (ph * PH + tid + u * THREADS) * V],
                                     T.Tensor((U * mhc,), "uint32x4", ob.data)[u * mhc + m])
            for m in T.unroll(mhc):
                for r in T.unroll(5):
                    part[m] += T.shfl_xor(part[m], 16 >> r)
            if tid % 32 == 0:
                for m in T.unroll(mhc):
                    red[m, tid // 32] = part[m]
            T.sync_threads()
            if tid < mhc:
                tot = red[tid, 0]
                for q in T.unroll(WARPS - 1):
                    tot += red[tid, q + 1]
                grad_mix[bx, tid] = tot

    return main


KERNELS = (
    KernelDecl(
        name="mhc.pre_apply_mix_fwd",
        factory=pre_apply_mix_fwd,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("out",),
        pass_configs=FWD_PASS_CONFIGS,
        doc="out[t, :] = bf16(sum over m of mix[t, m] * x[t, m, :]) (fp32 fma chain in stream order); a block "
            "per token, cp.async shared-memory ring.",
    ),
    KernelDecl(
        name="mhc.pre_apply_mix_bwd",
        factory=pre_apply_mix_bwd,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("grad_x", "grad_mix"),
        pass_configs=PASS_CONFIGS,
        doc="grad_x = mix * grad_out (optionally added in place), grad_mix = sum over hidden of grad_out * x.",
    ),
)

__all__ = ["KERNELS", "MHC_VALUES", "THREADS", "bwd_vectors", "pre_apply_mix_bwd", "pre_apply_mix_fwd"]
