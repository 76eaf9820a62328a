"""``engram.engram_gate_bwd``: gradients of ``engram_gate_fwd`` for x, k, v and the fused weight.

Parameters, in order: ``grad_out`` and ``hidden_states`` bf16 ``[num_tokens, hc, hidden]``
(contiguous), ``k`` bf16 ``[num_tokens, hc, hidden]`` (strides ``(k_stride_s, k_stride_h, 1)``),
``v`` bf16 ``[num_tokens, hidden]`` (strides ``(v_stride_s, 1)``), ``weight_fused`` fp32 ``[hc,
hidden]``, the forward's saved ``dot``, ``gate_score``, ``rstd_x``, ``rstd_k`` fp32
``[num_tokens, hc]``; outputs ``grad_x``, ``grad_k`` bf16 ``[num_tokens, hc, hidden]``,
``grad_v`` bf16 ``[num_tokens, hidden]``, ``grad_w_partial`` fp32 ``[num_blocks, hc, hidden]``
(all contiguous); scalars ``clamp_value`` and ``scalar`` (= hidden**-0.5), fp32.  Extents and
strides are runtime symbols; ``hidden % 8 == 0``, ``hidden <= MAX_HIDDEN``, strides multiples
of 8 elements, pointers 16-byte aligned.

Per token ``t`` and head ``h``, in fp32, with ``go = grad_out[t, h]``, ``d = dot[t, h]``,
``g = gate_score[t, h]``, ``rx``, ``rk``, ``w = weight_fused[h]``::

    s = ((d * rx) * rk) * scalar                     (the forward's pre-activation)
    G = 0 if |s| < clamp_value else (sum go*v) * g * (1 - g) * 0.5 / sqrt(|s|) * ((rx * rk) * scalar)
    grad_x = bf16(go + G * (k*w - x * (d * rx * rx / hidden)))
    grad_k = bf16(G * (x*w - k * (d * rk * rk / hidden)))
    grad_v[t] = bf16(sum_h go_h * g_h)               (heads in order)
    grad_w_partial[p, h] = sum over block p's tokens of G * x * k

Partial row ``p < num_blocks`` covers the consecutive tokens ``[p * per, (p + 1) * per)``,
``per = ceil(num_tokens / num_blocks)``; a row with none is zeros, so ``grad_w_partial.sum(0)`` is
the fused-weight gradient (``grad_w_reduce``).  Deterministic: fixed summation orders for any
launch, and grad_x/grad_k/grad_v do not depend on ``num_blocks``.

Design: rows (token, head) are laid out as in ``engram_gate_fwd``: two halves of 128 threads,
``rpb = 2`` heads per block (one per half) at ``hidden <= 4096``, else ``rpb = 1`` (a 512-vector
segment of the row per half), chosen at run time from hidden; block ``bx = p * G + g`` (``G =
ceil(hc / rpb)``) runs heads ``g * rpb + j`` over the tokens of range ``p``, so the blocks of one
range run together and share v and grad_out rows through L2.  Thread ``tr`` of a half owns the
vectors ``base + u * 128`` (``base = seg * 512 + tr``, ``u < U``; a constant step, so its global
accesses are one address plus immediate offsets per stream): it keeps its slice of
the fused weight (loaded once) and of the weight gradient in registers, and streams its tokens
through a two-stage shared-memory ring of *private* slots: while it computes token ``t`` from
one stage, the cp.async copies of token ``t + 1`` (grad_out, v, x, k, the four saved
statistics, and the grad_v operands below) are in flight into the other stage (a thread only
reads what it copied itself, so ``cp.async.wait_group`` suffices; the one barrier per token is
the ``sum go*v`` exchange, double-buffered).  About ``THREADS * U`` 16-byte vectors per stream
are in flight per block (56-64 KB at hidden 4096-8192) during the whole token loop; one block per
SM (shared memory).  grad_v: vector ``i`` of the row is summed (heads in order) by the thread
that owns it (in slot ``u``) in the row of head ``u % hc``; for the slot ``u == h`` the first
``HEADS_IN_FLIGHT`` heads' grad_out vectors and gates come through the ring, any others (hc > 4,
or the extra slots when hc < U) are loaded directly.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .engram_gate_fwd import MAX_HIDDEN, PASS_CONFIGS, THREADS, U, V, WARPS


HALF = THREADS // 2  # threads per segment (as in the forward; defined here so either file reverts alone)
SEG = HALF * U  # vectors per segment
HEADS_IN_FLIGHT = 4  # grad_v: grad_out vectors of this many heads staged per token
GO, VV, XX, KK = 0, 1, 2, 3  # the staged streams
NSCAL = 4 + HEADS_IN_FLIGHT  # staged fp32 scalars: dot, gate, rstd_x, rstd_k of the row, then gate[t, q]
PASS_CONFIGS_BWD = dict(PASS_CONFIGS, **{"tl.disable_thread_storage_sync": True})  # private slots: see above


def _f(x):
    return T.Cast("float32", x)


def _cp(dst, src, n):
    """One cp.async of ``n`` elements (16 bytes of bf16, or one fp32) into shared memory."""
    return T.ptx_cp_async(T.access_ptr(dst, "w", n), T.access_ptr(src, "r", n), n)


def engram_gate_bwd():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, hc, hidden = T.dynamic("num_tokens"), T.dynamic("hc_mult"), T.dynamic("hidden")
    ks0, ks1, vs0 = T.dynamic("k_stride_s"), T.dynamic("k_stride_h"), T.dynamic("v_stride_s")
    num_blocks = T.dynamic("num_blocks")
    nvec = hidden // V
    # as in the forward: segments per row (1 or 2), rows (heads) per block (2 or 1)
    nseg = T.max(1, (nvec + SEG - 1) // SEG)
    rows_per_block = 2 // nseg
    x_vec = (num_tokens, hc, nvec * V)
    w_vec = (hc, nvec * V)
    p_vec = (num_blocks, hc, nvec * V)
    k_flat = ((num_tokens - 1) * (ks0 // V) * V + (hc - 1) * (ks1 // V) * V + nvec * V,)
    v_flat = ((num_tokens - 1) * (vs0 // V) * V + nvec * V,)
    gv_vec = (num_tokens, nvec * V)

    @T.prim_func
    def main(
        grad_out: T.Tensor((num_tokens, hc, hidden), "bfloat16"),
        hidden_states: T.Tensor((num_tokens, hc, hidden), "bfloat16"),
        k: T.StridedTensor((num_tokens, hc, hidden), (ks0, ks1, 1), "bfloat16"),
        v: T.StridedTensor((num_tokens, hidden), (vs0, 1), "bfloat16"),
        weight_fused: T.Tensor((hc, hidden), "float32"),
        dot: T.Tensor((num_tokens, hc), "float32"),
        gate_score: T.Tensor((num_tokens, hc), "float32"),
        rstd_x: T.Tensor((num_tokens, hc), "float32"),
        rstd_k: T.Tensor((num_tokens, hc), "float32"),
        grad_x: T.Tensor((num_tokens, hc, hidden), "bfloat16"),
        grad_k: T.Tensor((num_tokens, hc, hidden), "bfloat16"),
        grad_v: T.Tensor((num_tokens, hidden), "bfloat16"),
        grad_w_partial: T.Tensor((num_blocks, hc, hidden), "float32"),
        clamp_value: T.float32,
        scalar: T.float32,
    ):
        with T.Kernel(num_blocks * T.ceildiv(hc, rows_per_block), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            stg = T.alloc_shared((2, 4, U, THREADS * V), "bfloat16")
            gvs = T.alloc_shared((2, HEADS_IN_FLIGHT, THREADS * V), "bfloat16")
            scl = T.alloc_shared((2, NSCAL, THREADS), "float32")
            red = T.alloc_shared((2, WARPS), "float32")
            ws = T.alloc_local((U * V,), "float32")
            gw = T.alloc_local((U * V,), "float32")
            gol = T.alloc_local((V,), "bfloat16")
            vl = T.alloc_local((V,), "bfloat16")
            xl = T.alloc_local((V,), "bfloat16")
            kl = T.alloc_local((V,), "bfloat16")
            ogx = T.alloc_local((V,), "bfloat16")
            ogk = T.alloc_local((V,), "bfloat16")
            gvo = T.alloc_local((V,), "bfloat16")
            gva = T.alloc_local((V,), "float32")
            fx = T.alloc_local((V,), "float32")
            fk = T.alloc_local((V,), "float32")
            acc = T.alloc_var("float32")
            tot = T.alloc_var("float32")
            gg = T.alloc_var("float32")
            rx = T.alloc_var("float32")
            rk = T.alloc_var("float32")
            d = T.alloc_var("float32")
            sg = T.alloc_var("float32")
            big = T.alloc_var("float32")
            cx = T.alloc_var("float32")
            ck = T.alloc_var("float32")
            wide = T.alloc_var("int32")
            rpb = T.alloc_var("int32")
            j = T.alloc_var("int32")
            base = T.alloc_var("int32")
            h = T.alloc_var("int32")
            ok = T.alloc_var("int32")
            p = T.alloc_var("int32")
            per = T.alloc_var("int32")
            t0 = T.alloc_var("int32")
            n = T.alloc_var("int32")
            tn = T.alloc_var("int32")
            t = T.alloc_var("int32")
            sn = T.alloc_var("int32")
            sc = T.alloc_var("int32")
            wide = nseg - 1  # 0: two heads per block; 1: one head, a segment per half
            rpb = rows_per_block
            j = (tid // HALF) * (1 - wide)  # this half's row in the block
            base = (tid // HALF) * wide * SEG + tid % HALF  # the thread's first vector
            p = T.truncdiv(bx, T.ceildiv(hc, rpb))
            h = T.truncmod(bx, T.ceildiv(hc, rpb)) * rpb + j
            ok = T.if_then_else(h < hc, 1, 0)
            h = h * ok
            per = T.truncdiv(num_tokens + num_blocks - 1, num_blocks)
            t0 = T.min(p * per, num_tokens)
            n = T.min(per, num_tokens - t0)
            for u in T.unroll(U):
                if ok != 0 and base + u * HALF < nvec:
                    for i in T.vectorized(V):
                        ws[u * V + i] = T.Tensor(w_vec, "float32", weight_fused.data)[h, (base + u * HALF) * V + i]
            for i in T.unroll(U * V):
                gw[i] = T.float32(0)
            # iteration ``it`` stages token t0 + it and computes token t0 + it - 1
            for it in T.serial(n + 1):
                tn = t0 + it
                sn = it % 2
                T.sync_warp()  # a compiler fence: last iteration's reads of stage sn stay before its refill
                if ok != 0 and it < n:
                    for u in T.unroll(U):
                        if base + u * HALF < nvec:
                            _cp(stg[sn, GO, u, tid * V], T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                tn, h, (base + u * HALF) * V], V)
                            _cp(stg[sn, VV, u, tid * V], T.Tensor(v_flat, "bfloat16", v.data)[
                                tn * (vs0 // V) * V + (base + u * HALF) * V], V)
                            _cp(stg[sn, XX, u, tid * V], T.Tensor(x_vec, "bfloat16", hidden_states.data)[
                                tn, h, (base + u * HALF) * V], V)
                            _cp(stg[sn, KK, u, tid * V], T.Tensor(k_flat, "bfloat16", k.data)[
                                tn * (ks0 // V) * V + h * (ks1 // V) * V + (base + u * HALF) * V], V)
                    if h < U and base + h * HALF < nvec:  # this thread's first grad_v slot, u == h
                        for q in T.unroll(HEADS_IN_FLIGHT):
                            if q < hc:
                                _cp(gvs[sn, q, tid * V], T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                    tn, q, (base + h * HALF) * V], V)
                                _cp(scl[sn, 4 + q, tid], gate_score[tn, q], 1)
                    _cp(scl[sn, 0, tid], dot[tn, h], 1)
                    _cp(scl[sn, 1, tid], gate_score[tn, h], 1)
                    _cp(scl[sn, 2, tid], rstd_x[tn, h], 1)
                    _cp(scl[sn, 3, tid], rstd_k[tn, h], 1)
                T.ptx_commit_group()  # one group per iteration, possibly empty
                if it > 0:
                    t = tn - 1
                    sc = 1 - sn
                    T.ptx_wait_group(1)  # token t's copies (this thread's) have landed
                    T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                    acc = T.float32(0)
                    for u in T.unroll(U):
                        if ok != 0 and base + u * HALF < nvec:
                            for i in T.vectorized(V):
                                gol[i] = stg[sc, GO, u, tid * V + i]
                            for i in T.vectorized(V):
                                vl[i] = stg[sc, VV, u, tid * V + i]
                            for i in T.unroll(V):
                                acc += _f(gol[i]) * _f(vl[i])
                    for r in T.unroll(5):
                        acc += T.shfl_xor(acc, 16 >> r)
                    if tid % 32 == 0:
                        red[sc, tid // 32] = acc
                    T.sync_threads()
                    if ok != 0:
                        tot = red[sc, j * 4]
                        for q in T.unroll(3):  # the row's warps, in order
                            tot += red[sc, j * 4 + q + 1]
                        if wide != 0:
                            for q in T.unroll(4):
                                tot += red[sc, 4 + q]
                        d = scl[sc, 0, tid]
                        gg = scl[sc, 1, tid]
                        rx = scl[sc, 2, tid]
                        rk = scl[sc, 3, tid]
                        sg = T.ieee_mul(T.ieee_mul(T.ieee_mul(d, rx), rk), scalar)
                        big = T.if_then_else(T.abs(sg) < clamp_value, T.float32(0),
                                             tot * gg * (T.float32(1) - gg) * T.float32(0.5) / T.sqrt(T.abs(sg))
                                             * (rx * rk * scalar))
                        cx = d * rx * rx / _f(hidden)
                        ck = d * rk * rk / _f(hidden)
                        for u in T.unroll(U):
                            if base + u * HALF < nvec:
                                for i in T.vectorized(V):
                                    gol[i] = stg[sc, GO, u, tid * V + i]
                                for i in T.vectorized(V):
                                    xl[i] = stg[sc, XX, u, tid * V + i]
                                for i in T.vectorized(V):
                                    kl[i] = stg[sc, KK, u, tid * V + i]
                                for i in T.unroll(V):
                                    fx[i] = _f(gol[i]) + big * (_f(kl[i]) * ws[u * V + i] - _f(xl[i]) * cx)
                                    fk[i] = big * (_f(xl[i]) * ws[u * V + i] - _f(kl[i]) * ck)
                                    gw[u * V + i] += big * _f(xl[i]) * _f(kl[i])
                                # packed bf16x2 converts, then one explicit 16-byte store (T.stg128):
                                # a vectorized copy from the bf16 array was split by LLVM into four
                                # 4-byte STGs for every slot but the first
                                for i in T.vectorized(V):
                                    ogx[i] = T.Cast("bfloat16", fx[i])
                                for i in T.vectorized(V):
                                    ogk[i] = T.Cast("bfloat16", fk[i])
                                T.stg128(T.Tensor(x_vec, "bfloat16", grad_x.data)[t, h, (base + u * HALF) * V],
                                         T.Tensor((1,), "uint32x4", ogx.data)[0])
                                T.stg128(T.Tensor(x_vec, "bfloat16", grad_k.data)[t, h, (base + u * HALF) * V],
                                         T.Tensor((1,), "uint32x4", ogk.data)[0])
                        # grad_v on the vectors base + u * HALF with u % hc == h (heads in order)
                        for u in T.unroll(U):
                            if T.truncmod(u, hc) == h and base + u * HALF < nvec:
                                for i in T.unroll(V):
                                    gva[i] = T.float32(0)
                                if u == h:  # the staged heads
                                    for q in T.unroll(HEADS_IN_FLIGHT):
                                        if q < hc:
                                            for i in T.vectorized(V):
                                                gol[i] = gvs[sc, q, tid * V + i]
                                            for i in T.unroll(V):
                                                gva[i] = T.ieee_add(gva[i], T.ieee_mul(_f(gol[i]), scl[sc, 4 + q, tid]))
                                for q in T.serial(T.if_then_else(u == h, T.max(hc - HEADS_IN_FLIGHT, 0), hc)):
                                    for i in T.vectorized(V):
                                        gol[i] = T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                            t, q + T.if_then_else(u == h, HEADS_IN_FLIGHT, 0), (base + u * HALF) * V + i]
                                    for i in T.unroll(V):
                                        gva[i] = T.ieee_add(gva[i], T.ieee_mul(
                                            _f(gol[i]), gate_score[t, q + T.if_then_else(u == h, HEADS_IN_FLIGHT, 0)]))
                                for i in T.vectorized(V):
                                    gvo[i] = T.Cast("bfloat16", gva[i])
                                T.stg128(T.Tensor(gv_vec, "bfloat16", grad_v.data)[t, (base + u * HALF) * V],
                                         T.Tensor((1,), "uint32x4", gvo.data)[0])
            for u in T.unroll(U):
                if ok != 0 and base + u * HALF < nvec:
                    for i in T.vectorized(V):
                        T.Tensor(p_vec, "float32", grad_w_partial.data)[p, h, (base + u * HALF) * V + i] = gw[u * V + i]

    return main


KERNELS = (
    KernelDecl(
        name="engram.engram_gate_bwd",
        factory=engram_gate_bwd,
        grid=({},),
        outputs=("grad_x", "grad_k", "grad_v", "grad_w_partial"),
        pass_configs=PASS_CONFIGS_BWD,
        doc="Gradients of engram_gate_fwd: grad_x, grad_k, grad_v (bf16) and per-block fused-weight partials (fp32).",
    ),
)

__all__ = ["KERNELS", "MAX_HIDDEN", "engram_gate_bwd"]
