"""``mhc.post_fwd`` / ``mhc.post_bwd``: merge a sublayer's output back into the mHC streams, and
the gradients of that merge.

``mhc.post_fwd(x, residual, post_mix, comb_mix, out)``: ``x`` bf16 ``[num_tokens, hidden]``,
``residual`` bf16 ``[num_tokens, mhc, hidden]``, ``post_mix`` fp32 ``[num_tokens, mhc]``,
``comb_mix`` fp32 ``[num_tokens, mhc, mhc]``, ``out`` bf16 like residual.  Stream ``n`` of the
output takes column ``n`` of the token's comb matrix (``comb_mix[t, m, n]`` weighs input stream
``m``).  Per element, in fp32 with ``r_m = float(residual[t, m, i])``::

    acc = post_mix[t, n] * float(x[t, i])
    acc = fma(comb_mix[t, m, n], r_m, acc) for m = 0 .. mhc-1;   out[t, n, i] = bf16(acc)

``mhc.post_bwd(grad_out, x, residual, post_mix, comb_mix, grad_x, grad_residual, grad_post_mix,
grad_comb_mix)``: ``grad_out`` bf16 like residual; outputs ``grad_x`` bf16 like x,
``grad_residual`` bf16 like residual, ``grad_post_mix`` fp32 ``[num_tokens, mhc]``,
``grad_comb_mix`` fp32 ``[num_tokens, mhc, mhc]``.  With ``g_n = float(grad_out[t, n, i])``::

    grad_residual[t, m, i] = bf16(sum_n comb_mix[t, m, n] * g_n)   (fma chain over n in order)
    grad_x[t, i]           = bf16(sum_n post_mix[t, n] * g_n)      (fma chain over n in order)
    grad_comb_mix[t, m, n] = sum_i r_m * g_n                        (fp32 sums over hidden)
    grad_post_mix[t, n]    = sum_i float(x[t, i]) * g_n

``mhc`` is the compile-time key; ``num_tokens`` and ``hidden`` are run-time symbols
(``hidden % 8 == 0``).  Contiguous, 16-byte aligned tensors.

Forward design: a token's row is cut into *items* of ``THREADS`` = 128 16-byte vectors (one per
thread, of x and of every stream: 4 items at hidden 4096, 7, none partly idle, at 7168); a block of
``THREADS`` threads walks ``ITEMS[mhc]`` consecutive items of the flat (token, chunk) list (mhc 4:
2, so a block may span two tokens) or, where that is 0, one token's items (mhc 2 and 8; grid
``num_tokens``).  Item ``j``'s ``mhc + 1`` vectors per thread are copied by ``cp.async``
(``LDGSTS``, L1 bypassed, no register held per byte in flight; 16 bytes, zero-filled past the row)
into slot ``j % S`` of a shared-memory ring, ``S - 1`` items ahead of the math (``S`` =
``STAGES[mhc]``, ``__launch_bounds__`` ``BLOCKS[mhc]`` blocks per SM; M = 4: S = 2, 8 blocks, 20 KB
shared per block, up to 160 KB of loads in flight per SM).  A thread reads only the slot bytes it
copied itself, so ``cp.async.wait_group S-1`` is the only wait (no block barrier:
``tl.disable_thread_storage_sync``).  The (token, chunk) of the issued and of the computed item are
int32 cursors stepped per item (no division per item).  A token's mix coefficients are loaded at
the block's first item and at each chunk 0 (broadcast reads).  Why 2-item blocks at M = 4 (H200,
2026-12-02 12:05 UTC): the one-token blocks (S = 4, 5 per SM) copied a whole 4096-row up front and
then only computed and stored, in lock step across the first wave; the 2-item blocks interleave
loads and stores of more blocks per SM and halve the tail unit: 76.0 / 128.0 / 145.9 / 251.3 us
against 76.4 / 130.2 / 146.8 / 255.8 at 4096 x 4096 / 4096 x 7168 / 8192 x 4096 / 8192 x 7168
(tile_kernels 76.6 / 130.4 / 147.8 / 256.5).  M = 2 and 8 keep the measured-before configuration.

Backward design: blocks of ``THREADS`` threads, one per token, walk the row in *segments* of
``THREADS * U`` 16-byte vectors (a run-time loop); in a segment thread ``tr`` owns the vectors
``base + tr + u * THREADS`` (``U = max(1, 4 // mhc)``, a compile-time step: immediate address
offsets) of x and of every stream.  All of a segment's loads (``U * (2 * mhc + 1)`` vectors: 9-18
per thread) are issued before any arithmetic, leaving registers for several blocks per SM (whose
loads cover one block's reduction and tail).  The token's mix coefficients are loaded once per
thread (broadcast reads).  The ``mhc * (mhc + 1)`` sums: a thread adds its products in (segment,
vector, element) order, each warp combines its lanes by xor-shuffles (16, 8, 4, 2, 1) and the
four warps' sums are added in warp order: deterministic for a given hidden.
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
STAGES = {2: 4, 4: 2, 8: 3}  # forward: items (chunks) per block's ring: S - 1 in flight during one's math
BLOCKS = {2: 8, 4: 8, 8: 3}  # forward: blocks per SM (shared memory S * (mhc + 1) * 2 KB a block)
ITEMS = {2: 0, 4: 2, 8: 0}  # forward: items per block (0: all of one token's)
# the forward: a thread reads only the ring bytes it copied: no block barriers (cp.async.wait_group suffices)
FWD_PASS_CONFIGS = dict(PASS_CONFIGS, **{"tl.disable_thread_storage_sync": True})


def bwd_vectors(mhc: int) -> int:
    """Vectors per thread and segment of the backward for ``mhc`` streams."""
    return max(1, 4 // mhc)


def post_fwd(mhc: int):
    """Build the forward PrimFunc for ``mhc`` streams: a block walks its items in order (see ITEMS);
    item ``j``'s ``mhc + 1`` vectors per thread are copied by ``cp.async`` (16 bytes, zero-filled
    past the row) into ring slot ``j % S``, ``S - 1`` items ahead of the math.  A thread reads only
    the slot bytes it copied itself, so ``cp.async.wait_group`` is the only wait (no block barrier)."""
    S, K = STAGES[mhc], mhc + 1
    B = BLOCKS[mhc]
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
    nch = T.ceildiv(nvec, THREADS)  # chunks (items) per token
    # blocks: one per token, or one per ITEMS[mhc] consecutive items of the flat (token, chunk) list (a
    # block may span two tokens; the cursors reload the mixes at each chunk 0)
    G = T.ceildiv(num_tokens * nch, ITEMS[mhc]) if ITEMS[mhc] else num_tokens
    x_flat = (num_tokens * nvec * V,)
    r_flat = (num_tokens * mhc * nvec * V,)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), "bfloat16"),
        residual: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        post_mix: T.Tensor((num_tokens, mhc), "float32"),
        comb_mix: T.Tensor((num_tokens, mhc, mhc), "float32"),
        out: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
    ):
        with T.Kernel(G, threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(B)
            tid = T.get_thread_binding()
            ring = T.alloc_shared((S, K, THREADS * V), "bfloat16")
            buf = T.alloc_local((K * V,), "bfloat16")
            pw = T.alloc_local((mhc,), "float32")
            cw = T.alloc_local((mhc * mhc,), "float32")
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
                cp_async(ring[j % S, 0, tid * V], T.Tensor(x_flat, "bfloat16", x.data)[
                    (ti * nvec + vi) * V], V, ok)
                for m in T.unroll(mhc):
                    cp_async(ring[j % S, 1 + m, tid * V], T.Tensor(r_flat, "bfloat16", residual.data)[
                        ((ti * mhc + m) * nvec + vi) * V], V, ok)
                T.ptx_commit_group()  # one group per iteration, possibly empty
                ci = ci + 1
                if ci == nch:
                    ci = 0
                    ti = ti + 1
                if j >= S - 1:
                    jc = j - (S - 1)
                    vc = cc * THREADS + tid
                    if jc == 0 or cc == 0:  # the block's first item or a chunk 0: a new token's mixes
                        for m in T.unroll(mhc):
                            pw[m] = post_mix[tc, m]
                            for n in T.unroll(mhc):
                                cw[m * mhc + n] = comb_mix[tc, m, n]
                    T.ptx_wait_group(S - 1)  # item jc's copies (this thread's) have landed
                    T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                    if vc < nvec:
                        for k in T.unroll(K):
                            for i in T.vectorized(V):
                                buf[k * V + i] = ring[jc % S, k, tid * V + i]
                        for n in T.unroll(mhc):
                            for i in T.unroll(V):
                                acc[i] = T.ieee_mul(pw[n], T.Cast("float32", buf[i]))
                            for m in T.unroll(mhc):
                                for i in T.unroll(V):
                                    acc[i] = T.ieee_fmaf(cw[m * mhc + n], T.Cast("float32", buf[(1 + m) * V + i]),
                                                         acc[i])
                            for i in T.vectorized(V):
                                ob[i] = T.Cast("bfloat16", acc[i])
                            T.stg128(T.Tensor(r_flat, "bfloat16", out.data)[((tc * mhc + n) * nvec + vc) * V],
                                     T.Tensor((1,), "uint32x4", ob.data)[0])
                    cc = cc + 1
                    if cc == nch:
                        cc = 0
                        tc = tc + 1

    return main


def post_bwd(mhc: int):
    """Build the backward PrimFunc for ``mhc`` streams."""
    U = bwd_vectors(mhc)
    PH = THREADS * U
    NS = mhc * mhc + mhc  # sums per token: grad_comb_mix (m, n) at m * mhc + n, then grad_post_mix n
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
    r_vec = (num_tokens, mhc, nvec * V)
    x_vec = (num_tokens, nvec * V)

    @T.prim_func
    def main(
        grad_out: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        x: T.Tensor((num_tokens, hidden), "bfloat16"),
        residual: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        post_mix: T.Tensor((num_tokens, mhc), "float32"),
        comb_mix: T.Tensor((num_tokens, mhc, mhc), "float32"),
        grad_x: T.Tensor((num_tokens, hidden), "bfloat16"),
        grad_residual: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        grad_post_mix: T.Tensor((num_tokens, mhc), "float32"),
        grad_comb_mix: T.Tensor((num_tokens, mhc, mhc), "float32"),
    ):
        with T.Kernel(num_tokens, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            gs = T.alloc_local((U * mhc * V,), "bfloat16")
            rs = T.alloc_local((U * mhc * V,), "bfloat16")
            xs = T.alloc_local((U * V,), "bfloat16")
            pw = T.alloc_local((mhc,), "float32")
            cw = T.alloc_local((mhc * mhc,), "float32")
            part = T.alloc_local((NS,), "float32")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((mhc * V,), "bfloat16")
            xb = T.alloc_local((V,), "bfloat16")
            red = T.alloc_shared((NS, WARPS), "float32")
            tot = T.alloc_var("float32")
            for m in T.unroll(mhc):
                pw[m] = post_mix[bx, m]
                for n in T.unroll(mhc):
                    cw[m * mhc + n] = comb_mix[bx, m, n]
            for s in T.unroll(NS):
                part[s] = T.float32(0)
            for ph in T.serial(T.ceildiv(nvec, PH)):
                for u in T.unroll(U):
                    if ph * PH + tid + u * THREADS < nvec:
                        for n in T.unroll(mhc):
                            for i in T.vectorized(V):
                                gs[(u * mhc + n) * V + i] = T.Tensor(r_vec, "bfloat16", grad_out.data)[
                                    bx, n, (ph * PH + tid + u * THREADS) * V + i]
                        for m in T.unroll(mhc):
                            for i in T.vectorized(V):
                                rs[(u * mhc + m) * V + i] = T.Tensor(r_vec, "bfloat16", residual.data)[
                                    bx, m, (ph * PH + tid + u * THREADS) * V + i]
                        for i in T.vectorized(V):
                            xs[u * V + i] = T.Tensor(x_vec, "bfloat16", x.data)[bx, (ph * PH + tid + u * THREADS) * V + i]
                for u in T.unroll(U):
                    if ph * PH + tid + u * THREADS < nvec:
                        # the reductions over hidden
                        for m in T.unroll(mhc):
                            for n in T.unroll(mhc):
                                for i in T.unroll(V):
                                    part[m * mhc + n] = T.ieee_fmaf(T.Cast("float32", rs[(u * mhc + m) * V + i]),
                                                                    T.Cast("float32", gs[(u * mhc + n) * V + i]),
                                                                    part[m * mhc + n])
                        for n in T.unroll(mhc):
                            for i in T.unroll(V):
                                part[mhc * mhc + n] = T.ieee_fmaf(T.Cast("float32", xs[u * V + i]),
                                                                  T.Cast("float32", gs[(u * mhc + n) * V + i]),
                                                                  part[mhc * mhc + n])
                        # grad_residual: row m of the comb matrix against the output streams
                        for m in T.unroll(mhc):
                            for i in T.unroll(V):
                                acc[i] = T.ieee_mul(cw[m * mhc], T.Cast("float32", gs[(u * mhc) * V + i]))
                            for n in T.unroll(mhc - 1):
                                for i in T.unroll(V):
                                    acc[i] = T.ieee_fmaf(cw[m * mhc + n + 1],
                                                         T.Cast("float32", gs[(u * mhc + n + 1) * V + i]), acc[i])
                            for i in T.vectorized(V):
                                ob[m * V + i] = T.Cast("bfloat16", acc[i])
                        for m in T.unroll(mhc):
                            T.stg128(T.Tensor(r_vec, "bfloat16", grad_residual.data)[
                                bx, m, (ph * PH + tid + u * THREADS) * V], T.Tensor((mhc,), "uint32x4", ob.data)[m])
                        # grad_x
                        for i in T.unroll(V):
                            acc[i] = T.ieee_mul(pw[0], T.Cast("float32", gs[(u * mhc) * V + i]))
                        for n in T.unroll(mhc - 1):
                            for i in T.unroll(V):
                                acc[i] = T.ieee_fmaf(pw[n + 1], T.Cast("float32", gs[(u * mhc + n + 1) * V + i]), acc[i])
                        for i in T.vectorized(V):
                            xb[i] = T.Cast("bfloat16", acc[i])
                        T.stg128(T.Tensor(x_vec, "bfloat16", grad_x.data)[bx, (ph * PH + tid + u * THREADS) * V],
                                 T.Tensor((1,), "uint32x4", xb.data)[0])
            for s in T.unroll(NS):
                for r in T.unroll(5):
                    part[s] += T.shfl_xor(part[s], 16 >> r)
            if tid % 32 == 0:
                for s in T.unroll(NS):
                    red[s, tid // 32] = part[s]
            T.sync_threads()
            if tid < NS:
                tot = red[tid, 0]
                for q in T.unroll(WARPS - 1):
                    tot += red[tid, q + 1]
                if tid < mhc * mhc:
                    grad_comb_mix[bx, tid // mhc, tid % mhc] = tot
                else:
                    grad_post_mix[bx, tid - mhc * mhc] = tot

    return main


KERNELS = (
    KernelDecl(
        name="mhc.post_fwd",
        factory=post_fwd,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("out",),
        pass_configs=FWD_PASS_CONFIGS,
        doc="out[t, n, :] = bf16(post_mix[t, n] * x[t, :] + sum over m of comb_mix[t, m, n] * residual[t, m, :]); "
            "blocks of ITEMS[mhc] items (or a token), cp.async shared-memory ring.",
    ),
    KernelDecl(
        name="mhc.post_bwd",
        factory=post_bwd,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("grad_x", "grad_residual", "grad_post_mix", "grad_comb_mix"),
        pass_configs=PASS_CONFIGS,
        doc="Gradients of mhc.post_fwd for x, residual (bf16), post_mix and comb_mix (fp32 sums over hidden).",
    ),
)

__all__ = ["ITEMS", "KERNELS", "MHC_VALUES", "THREADS", "bwd_vectors", "post_bwd", "post_fwd"]
