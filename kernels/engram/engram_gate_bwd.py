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

How the work is issued (kernels/README.md, "Speed finding: engram.engram_gate_bwd": an earlier
version of this kernel executed 1.77x tile_kernels' instructions for the same bytes):

- addresses: each stream's row offset is one int32 vector index per token (``(tn * hc + h) *
  nvec + base``; k and v from their strides), the ``u`` slots are compile-time steps of it, so
  every cp.async / 16-byte store is one 64-bit address plus an immediate (the earlier version
  recomputed a 64-bit ``tn * hidden * hc + h * hidden + ...`` product chain per slot and stream);
  the ring copies of all slots are zero-fill cp.async (a slot past the row reads nothing and
  gets zeros nobody reads), so they are straight-line code instead of one branch per slot;
- bf16 -> fp32: the staged data are read as 32-bit words and widened with one shift or one AND
  per element (exact, like the cast; nvcc's cast of the upper half cost PRMT + SHL + MOV);
- the four statistics and the four heads' gates of a token are copied once per half (thread 0
  of the half, into a three-stage ring), not once per thread; that thread computes the row's
  factors that do not need ``sum go*v`` (s, cx, ck, sqrt|s|, rx*rk*scalar: the same expressions)
  while the others sum, and publishes them with the token's barrier, so each thread is left with
  one division (the clamp select and ``/ sqrt|s|``) instead of three divisions and a sqrt;
- grad_out, widened for ``sum go*v``, stays in registers for grad_x (one shared load and 8
  widenings less per vector); grad_v's slot ``u == h`` (the only one at hc >= 4) is its own
  branch, apart from the hc < 4 slots, whose direct-load setup nvcc otherwise hoisted into every
  step; the slot masks and ``float(hidden)`` are computed once, outside the token loop.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from ._gate_bwd_common import bf16_hi, bf16_lo, cp_async, f32
from .engram_gate_fwd import MAX_HIDDEN, PASS_CONFIGS, THREADS, U, V, WARPS

HALF = THREADS // 2  # threads per segment (as in the forward)
SEG = HALF * U  # vectors per segment
HEADS_IN_FLIGHT = 4  # grad_v: grad_out vectors of this many heads staged per token
PASS_CONFIGS_BWD = dict(PASS_CONFIGS, **{"tl.disable_thread_storage_sync": True})  # private slots: see above


W = V // 2  # 32-bit words (bf16 pairs) per 16-byte vector
GO, VV, XX, KK = 0, 1, 2, 3  # the staged streams
NS = 4 + HEADS_IN_FLIGHT  # per-half staged fp32 scalars: dot, gate, rstd_x, rstd_k of the row, then gate[t, q]
SR = 3  # scalar ring depth: read by every thread after the barrier, so a slot is refilled two tokens later


def engram_gate_bwd():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, hc, hidden = T.dynamic("num_tokens"), T.dynamic("hc_mult"), T.dynamic("hidden")
    ks0, ks1, vs0 = T.dynamic("k_stride_s"), T.dynamic("k_stride_h"), T.dynamic("v_stride_s")
    num_blocks = T.dynamic("num_blocks")
    nvec = hidden // V
    nseg = T.max(1, (nvec + SEG - 1) // SEG)
    rows_per_block = 2 // nseg
    x_vec = (num_tokens, hc, nvec * V)
    w_vec = (hc, nvec * V)
    p_vec = (num_blocks, hc, nvec * V)
    x_flat = (num_tokens * hc * nvec * V,)
    # 32-bit-word views of the bf16 inputs (cp.async copies words into the word-typed ring)
    x_w = (num_tokens * hc * nvec * W,)
    k_w = ((num_tokens - 1) * (ks0 // V) * W + (hc - 1) * (ks1 // V) * W + nvec * W,)
    v_w = ((num_tokens - 1) * (vs0 // V) * W + nvec * W,)
    gv_flat = (num_tokens * nvec * V,)

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
            stg = T.alloc_shared((2, 4, U, THREADS * W), "uint32")
            gvs = T.alloc_shared((2, HEADS_IN_FLIGHT, THREADS * W), "uint32")
            scl = T.alloc_shared((SR, 2, NS), "float32")
            red = T.alloc_shared((2, WARPS), "float32")
            der = T.alloc_shared((2, 2, 8), "float32")  # per half: gate, s, cx, ck, sqrt|s|, rx*rk*scalar
            ws = T.alloc_local((U * V,), "float32")
            gw = T.alloc_local((U * V,), "float32")
            gq = T.alloc_local((W,), "uint32")
            gof = T.alloc_local((U * V,), "float32")  # the token's grad_out as fp32, sum go*v -> grad_x
            vq = T.alloc_local((W,), "uint32")
            xq = T.alloc_local((W,), "uint32")
            kq = T.alloc_local((W,), "uint32")
            ogx = T.alloc_local((V,), "bfloat16")
            ogk = T.alloc_local((V,), "bfloat16")
            gvo = T.alloc_local((V,), "bfloat16")
            gol = T.alloc_local((V,), "bfloat16")
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
            fh = T.alloc_var("float32")
            xlo = T.alloc_var("float32")
            xhi = T.alloc_var("float32")
            klo = T.alloc_var("float32")
            khi = T.alloc_var("float32")
            wide = T.alloc_var("int32")
            rpb = T.alloc_var("int32")
            j = T.alloc_var("int32")
            tr = T.alloc_var("int32")
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
            ss = T.alloc_var("int32")
            sr = T.alloc_var("int32")
            nu = T.alloc_var("int32")
            gvm = T.alloc_var("int32")
            gvh = T.alloc_var("int32")
            stage = T.alloc_var("int32")
            rs = T.alloc_var("int32")
            rc = T.alloc_var("int32")
            rks = T.alloc_var("int32")
            rvs = T.alloc_var("int32")
            si = T.alloc_var("int32")
            rq = T.alloc_var("int32")
            wide = nseg - 1  # 0: two heads per block; 1: one head, a segment per half
            rpb = rows_per_block
            j = (tid // HALF) * (1 - wide)  # this half's row in the block
            tr = tid % HALF
            base = (tid // HALF) * wide * SEG + tr  # the thread's first vector
            p = T.truncdiv(bx, T.ceildiv(hc, rpb))
            h = T.truncmod(bx, T.ceildiv(hc, rpb)) * rpb + j
            ok = T.if_then_else(h < hc, 1, 0)
            h = h * ok
            per = T.truncdiv(num_tokens + num_blocks - 1, num_blocks)
            t0 = T.min(p * per, num_tokens)
            n = T.min(per, num_tokens - t0)
            fh = f32(hidden)
            # the thread's valid slots: base + u * HALF < nvec for u < nu
            nu = T.max(T.min(T.truncdiv(nvec - base + HALF - 1, HALF), U), 0) * ok
            # grad_v slots (u % hc == h, as in the current kernel), a bit mask
            gvm = 0
            for u in T.unroll(U):
                if u < nu and T.truncmod(u, hc) == h:
                    gvm = gvm | (1 << u)
            gvh = 0  # 1: the slot u == h is one of them (its first heads come through the ring)
            for u in T.unroll(U):
                if u == h and (gvm >> u) & 1 != 0:
                    gvh = 1
                    gvm = gvm & ~(1 << u)  # gvm: the other slots (hc < U only)
            for u in T.unroll(U):
                if u < nu:
                    for i in T.vectorized(V):
                        ws[u * V + i] = T.Tensor(w_vec, "float32", weight_fused.data)[h, (base + u * HALF) * V + i]
            for i in T.unroll(U * V):
                gw[i] = T.float32(0)
            # iteration ``it`` stages token t0 + it and computes token t0 + it - 1
            for it in T.serial(n + 1):
                tn = t0 + it
                sn = it % 2
                ss = it % SR
                rs = (tn * hc + h) * nvec + base  # vector index of the thread's first vector in [tn, h, :]
                T.sync_warp()  # a compiler fence: last iteration's reads of stage sn stay before its refill
                if ok != 0 and it < n:
                    rks = tn * (ks0 // V) + h * (ks1 // V) + base
                    rvs = tn * (vs0 // V) + base
                    for u in T.unroll(U):
                        cp_async(stg[sn, GO, u, tid * W], T.Tensor(x_w, "uint32", grad_out.data)[
                            (rs + u * HALF) * W], W, u < nu)
                        cp_async(stg[sn, VV, u, tid * W], T.Tensor(v_w, "uint32", v.data)[
                            (rvs + u * HALF) * W], W, u < nu)
                        cp_async(stg[sn, XX, u, tid * W], T.Tensor(x_w, "uint32", hidden_states.data)[
                            (rs + u * HALF) * W], W, u < nu)
                        cp_async(stg[sn, KK, u, tid * W], T.Tensor(k_w, "uint32", k.data)[
                            (rks + u * HALF) * W], W, u < nu)
                    # this thread's first grad_v slot (u == h): the first heads' grad_out vectors
                    rq = rs + h * (HALF - nvec)  # [tn, 0, base + h * HALF] in vectors
                    for q in T.unroll(HEADS_IN_FLIGHT):
                        cp_async(gvs[sn, q, tid * W], T.Tensor(x_w, "uint32", grad_out.data)[(rq + q * nvec) * W], W,
                            h < U and h < nu and q < hc)
                    # the row's statistics and the first heads' gates: one thread per half copies them
                    if tr == 0:
                        si = tn * hc + h
                        cp_async(scl[ss, tid // HALF, 0], T.Tensor((num_tokens * hc,), "float32", dot.data)[si], 1)
                        cp_async(scl[ss, tid // HALF, 1], T.Tensor((num_tokens * hc,), "float32", gate_score.data)[si], 1)
                        cp_async(scl[ss, tid // HALF, 2], T.Tensor((num_tokens * hc,), "float32", rstd_x.data)[si], 1)
                        cp_async(scl[ss, tid // HALF, 3], T.Tensor((num_tokens * hc,), "float32", rstd_k.data)[si], 1)
                        for q in T.unroll(HEADS_IN_FLIGHT):
                            cp_async(scl[ss, tid // HALF, 4 + q], T.Tensor((num_tokens * hc,), "float32", gate_score.data)[
                                si - h + q], 1, q < hc)
                T.ptx_commit_group()  # one group per iteration, possibly empty
                if it > 0:
                    t = tn - 1
                    sc = 1 - sn
                    sr = (it + SR - 1) % SR
                    rc = rs - hc * nvec  # [t, h, :]
                    T.ptx_wait_group(1)  # token t's copies (this thread's) have landed
                    T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                    if tr == 0 and ok != 0:  # the row's factors that do not need sum go*v, once per half
                        d = scl[sr, tid // HALF, 0]
                        gg = scl[sr, tid // HALF, 1]
                        rx = scl[sr, tid // HALF, 2]
                        rk = scl[sr, tid // HALF, 3]
                        der[sc, tid // HALF, 0] = gg
                        der[sc, tid // HALF, 1] = T.ieee_mul(T.ieee_mul(T.ieee_mul(d, rx), rk), scalar)  # s
                        der[sc, tid // HALF, 2] = d * rx * rx / fh  # cx
                        der[sc, tid // HALF, 3] = d * rk * rk / fh  # ck
                        der[sc, tid // HALF, 4] = T.sqrt(T.abs(T.ieee_mul(T.ieee_mul(T.ieee_mul(d, rx), rk), scalar)))
                        der[sc, tid // HALF, 5] = rx * rk * scalar
                    acc = T.float32(0)
                    for u in T.unroll(U):
                        if u < nu:
                            for i in T.vectorized(W):
                                gq[i] = stg[sc, GO, u, tid * W + i]
                            for i in T.vectorized(W):
                                vq[i] = stg[sc, VV, u, tid * W + i]
                            for i in T.unroll(W):  # elements 2i, 2i + 1 in order, as the current kernel
                                gof[u * V + 2 * i] = bf16_lo(gq[i])
                                gof[u * V + 2 * i + 1] = bf16_hi(gq[i])
                                acc += gof[u * V + 2 * i] * bf16_lo(vq[i])
                                acc += gof[u * V + 2 * i + 1] * bf16_hi(vq[i])
                    for r in T.unroll(5):
                        acc += T.shfl_xor(acc, 16 >> r)
                    if tid % 32 == 0:
                        red[sc, tid // 32] = acc
                    T.sync_threads()  # also publishes der and the gates staged by thread 0 of each half
                    if ok != 0:
                        tot = red[sc, j * 4]
                        for q in T.unroll(3):  # the row's warps, in order
                            tot += red[sc, j * 4 + q + 1]
                        if wide != 0:
                            for q in T.unroll(4):
                                tot += red[sc, 4 + q]
                        gg = der[sc, tid // HALF, 0]
                        sg = der[sc, tid // HALF, 1]
                        cx = der[sc, tid // HALF, 2]
                        ck = der[sc, tid // HALF, 3]
                        big = T.if_then_else(T.abs(sg) < clamp_value, T.float32(0),
                                             tot * gg * (T.float32(1) - gg) * T.float32(0.5) / der[sc, tid // HALF, 4]
                                             * der[sc, tid // HALF, 5])
                        for u in T.unroll(U):
                            if u < nu:
                                for i in T.vectorized(W):
                                    xq[i] = stg[sc, XX, u, tid * W + i]
                                for i in T.vectorized(W):
                                    kq[i] = stg[sc, KK, u, tid * W + i]
                                for i in T.unroll(W):
                                    xlo = bf16_lo(xq[i])
                                    xhi = bf16_hi(xq[i])
                                    klo = bf16_lo(kq[i])
                                    khi = bf16_hi(kq[i])
                                    fx[2 * i] = gof[u * V + 2 * i] + big * (klo * ws[u * V + 2 * i] - xlo * cx)
                                    fk[2 * i] = big * (xlo * ws[u * V + 2 * i] - klo * ck)
                                    gw[u * V + 2 * i] += big * xlo * klo
                                    fx[2 * i + 1] = gof[u * V + 2 * i + 1] + big * (khi * ws[u * V + 2 * i + 1] - xhi * cx)
                                    fk[2 * i + 1] = big * (xhi * ws[u * V + 2 * i + 1] - khi * ck)
                                    gw[u * V + 2 * i + 1] += big * xhi * khi
                                for i in T.vectorized(V):
                                    ogx[i] = T.Cast("bfloat16", fx[i])
                                for i in T.vectorized(V):
                                    ogk[i] = T.Cast("bfloat16", fk[i])
                                T.stg128(T.Tensor(x_flat, "bfloat16", grad_x.data)[(rc + u * HALF) * V],
                                         T.Tensor((1,), "uint32x4", ogx.data)[0])
                                T.stg128(T.Tensor(x_flat, "bfloat16", grad_k.data)[(rc + u * HALF) * V],
                                         T.Tensor((1,), "uint32x4", ogk.data)[0])
                        # grad_v on the vectors base + u * HALF with u % hc == h (heads in order).
                        # The slot u == h (the only one when hc >= U): the staged heads, then any
                        # further heads (hc > HEADS_IN_FLIGHT) loaded directly
                        if gvh != 0:
                            for i in T.unroll(V):
                                gva[i] = T.float32(0)
                            for q in T.unroll(HEADS_IN_FLIGHT):
                                if q < hc:
                                    for i in T.vectorized(W):
                                        vq[i] = gvs[sc, q, tid * W + i]
                                    for i in T.unroll(W):
                                        gva[2 * i] = T.ieee_add(gva[2 * i], T.ieee_mul(
                                            bf16_lo(vq[i]), scl[sr, tid // HALF, 4 + q]))
                                        gva[2 * i + 1] = T.ieee_add(gva[2 * i + 1], T.ieee_mul(
                                            bf16_hi(vq[i]), scl[sr, tid // HALF, 4 + q]))
                            for q in T.serial(hc - HEADS_IN_FLIGHT):
                                for i in T.vectorized(V):
                                    gol[i] = T.Tensor(x_flat, "bfloat16", grad_out.data)[
                                        ((t * hc + q + HEADS_IN_FLIGHT) * nvec + base + h * HALF) * V + i]
                                for i in T.unroll(V):
                                    gva[i] = T.ieee_add(gva[i], T.ieee_mul(
                                        f32(gol[i]), gate_score[t, q + HEADS_IN_FLIGHT]))
                            for i in T.vectorized(V):
                                gvo[i] = T.Cast("bfloat16", gva[i])
                            T.stg128(T.Tensor(gv_flat, "bfloat16", grad_v.data)[(t * nvec + base + h * HALF) * V],
                                     T.Tensor((1,), "uint32x4", gvo.data)[0])
                        # the other slots (hc < U only): every head loaded directly
                        if gvm != 0:
                            for u in T.unroll(U):
                                if (gvm >> u) & 1 != 0:
                                    for i in T.unroll(V):
                                        gva[i] = T.float32(0)
                                    for q in T.serial(hc):
                                        for i in T.vectorized(V):
                                            gol[i] = T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                                t, q, (base + u * HALF) * V + i]
                                        for i in T.unroll(V):
                                            gva[i] = T.ieee_add(gva[i], T.ieee_mul(f32(gol[i]), gate_score[t, q]))
                                    for i in T.vectorized(V):
                                        gvo[i] = T.Cast("bfloat16", gva[i])
                                    T.stg128(T.Tensor(gv_flat, "bfloat16", grad_v.data)[
                                        (t * nvec + base + u * HALF) * V], T.Tensor((1,), "uint32x4", gvo.data)[0])
            for u in T.unroll(U):
                if u < nu:
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
