"""Speed candidates of ``engram.engram_gate_bwd`` (issue 8, hidden <= 4096): the shipped kernel
(``engram_gate_bwd.py``: same parameters, launch grid, thread layout, reduction order and fp32
expressions, so the same bits) with up to three changes, each a compile-time flag:

- ``halfbar`` (hypothesis b): at ``rows_per_block`` 2 the two 128-thread halves work on different
  heads and share nothing between tokens (private ring slots; ``red``, ``der`` and the statistics
  ring are per half), so the one barrier per token (the ``sum go*v`` exchange) becomes a named
  barrier per half, ``bar.sync 1 + half, 128``; in the wide mode (one head, a segment per half)
  both halves use ``bar.sync 1, 256``.  The halves then drift apart, and each scheduler's two warps
  (one of each half) can be in different phases (one waiting, one computing) instead of stalling
  together.  TileLang's ``T.sync_threads(id, count)`` lowers to an ``asm volatile`` without a
  memory clobber, so ``T.sync_warp()`` on both sides keeps the shared-memory accesses in place.
- ``split`` (hypothesis a): two cp.async groups per token, A = grad_out, v and the statistics,
  then B = x and k.  The compute waits for A only (all but the 3 newest groups), does ``sum go*v``
  and the barrier, then waits for B (all but the 2 newest) before the grad_x/grad_k pass, so the
  dot phase overlaps the arrival of x and k.
- ``early`` (c, the ramp): the rows per block and head groups by a select and a shift (two
  dependent integer divisions by runtime values fewer), the block's token count in closed form
  (no loop over its ranges), and the fused weight's registers, the grad_v slot masks and the
  zeroed weight-gradient sums set up in the loop's first iteration after token 0's copies are
  issued, so the first cp.async leaves a few hundred instructions sooner.

The variants form a ladder (``VARIANTS``): halfbar, then + split, then + early.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from ._gate_bwd_common import (GO, HALF, HEADS_IN_FLIGHT, KK, NS, PASS_CONFIGS_BWD, SEG, VV, XX, W, bf16_hi, bf16_lo,
                               cp_async, f32)
from .engram_gate_bwd import SR, STAGES
from .engram_gate_fwd import THREADS, U, V, WARPS


def _build(split: bool, halfbar: bool, early: bool):
    """The PrimFunc of one candidate (the flags: see the module docstring)."""
    num_tokens, hc, hidden = T.dynamic("num_tokens"), T.dynamic("hc_mult"), T.dynamic("hidden")
    ks0, ks1, vs0 = T.dynamic("k_stride_s"), T.dynamic("k_stride_h"), T.dynamic("v_stride_s")
    num_blocks = T.dynamic("num_blocks")
    nvec = hidden // V
    nseg = T.max(1, (nvec + SEG - 1) // SEG)
    rows_per_block = 2 // nseg
    groups = T.ceildiv(hc, rows_per_block)
    per_group = T.max(1, num_blocks // groups)
    x_vec = (num_tokens, hc, nvec * V)
    w_vec = (hc, nvec * V)
    p_vec = (num_blocks, hc, nvec * V)
    x_flat = (num_tokens * hc * nvec * V,)
    # 32-bit-word views of the bf16 inputs (cp.async copies words into the word-typed ring)
    x_w = (num_tokens * hc * nvec * W,)
    k_w = ((num_tokens - 1) * (ks0 // V) * W + (hc - 1) * (ks1 // V) * W + nvec * W,)
    v_w = ((num_tokens - 1) * (vs0 // V) * W + nvec * W,)
    gv_flat = (num_tokens * nvec * V,)
    st_flat = (num_tokens * hc,)  # the saved statistics

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
        with T.Kernel(per_group * groups, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            stg = T.alloc_shared((STAGES, 4, U, THREADS * W), "uint32")
            scl = T.alloc_shared((SR, 2, NS), "float32")
            red = T.alloc_shared((2, WARPS), "float32")
            der = T.alloc_shared((2, 2, 8), "float32")  # per half: gate, s, cx, ck, sqrt|s|, rx*rk*scalar
            ws = T.alloc_local((U * V,), "float32")
            gw = T.alloc_local((U * V,), "float32")
            gq = T.alloc_local((W,), "uint32")
            gof = T.alloc_local((U * V,), "float32")  # the token's grad_out as fp32, sum go*v -> grad_x
            gvr = T.alloc_local((HEADS_IN_FLIGHT * W,), "uint32")  # grad_v's grad_out vectors, loaded early
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
            pc = T.alloc_var("int32")
            npc = T.alloc_var("int32")
            nk = T.alloc_var("int32")
            rsz = T.alloc_var("int32")
            rex = T.alloc_var("int32")
            steps = T.alloc_var("int32")
            ti = T.alloc_var("int32")
            ie = T.alloc_var("int32")
            ki = T.alloc_var("int32")
            tc = T.alloc_var("int32")
            ce = T.alloc_var("int32")
            kc = T.alloc_var("int32")
            sn = T.alloc_var("int32")
            sc = T.alloc_var("int32")
            ss = T.alloc_var("int32")
            sr = T.alloc_var("int32")
            dp = T.alloc_var("int32")
            nu = T.alloc_var("int32")
            gvm = T.alloc_var("int32")
            gvh = T.alloc_var("int32")
            rs = T.alloc_var("int32")
            rc = T.alloc_var("int32")
            rks = T.alloc_var("int32")
            rvs = T.alloc_var("int32")
            si = T.alloc_var("int32")
            rq = T.alloc_var("int32")
            bid = T.alloc_var("int32")
            grp = T.alloc_var("int32")
            bcnt = T.alloc_var("int32")
            wide = nseg - 1  # 0: two heads per block; 1: one head, a segment per half
            if early:  # nseg is 1 or 2 (hidden <= MAX_HIDDEN): no integer divisions by runtime values here
                rpb = 2 - wide
                grp = (hc + 1 - wide) >> (1 - wide)  # ceil(hc / rpb) head groups
            else:
                rpb = rows_per_block
                grp = T.ceildiv(hc, rpb)
            j = (tid // HALF) * (1 - wide)  # this half's row in the block
            tr = tid % HALF
            base = (tid // HALF) * wide * SEG + tr  # the thread's first vector
            if early:
                npc = T.max(1, T.truncdiv(num_blocks, grp))  # = per_group (the grid's)
            else:
                npc = per_group
            pc = T.truncdiv(bx, grp)  # ranges pc, pc + npc, pc + 2 * npc, ...
            h = T.truncmod(bx, grp) * rpb + j
            ok = T.if_then_else(h < hc, 1, 0)
            h = h * ok
            rsz = T.truncdiv(num_tokens, num_blocks)  # range p: rsz + (p < rex) tokens from p*rsz + min(p, rex)
            rex = T.truncmod(num_tokens, num_blocks)
            nk = T.truncdiv(num_blocks - pc + npc - 1, npc)  # this block's ranges
            if early:  # its tokens: rsz each, plus one for each of its ranges p < rex (all of them come first)
                steps = nk * rsz + T.if_then_else(pc < rex, T.truncdiv(rex - pc + npc - 1, npc), 0)
            else:
                steps = 0  # its tokens: the ranges' sizes (the empty ranges come last)
                for q in T.serial(nk):
                    steps += rsz + T.if_then_else(pc + q * npc < rex, 1, 0)
            ki = 0  # issue cursor: token ti of range ki, which ends at ie
            ti = pc * rsz + T.min(pc, rex)
            ie = ti + rsz + T.if_then_else(pc < rex, 1, 0)
            kc = 0  # compute cursor, likewise
            tc = ti
            ce = ie
            fh = f32(hidden)
            # the thread's valid slots: base + u * HALF < nvec for u < nu
            nu = T.max(T.min(T.truncdiv(nvec - base + HALF - 1, HALF), U), 0) * ok
            bid = 1 + (tid // HALF) * (1 - wide)  # halfbar: the half's named barrier (both halves' in the wide mode)
            bcnt = HALF + HALF * wide
            if not early:
                # grad_v slots (u % hc == h, as in the current kernel), a bit mask
                gvm = 0
                for u in T.unroll(U):
                    if u < nu and T.truncmod(u, hc) == h:
                        gvm = gvm | (1 << u)
                gvh = 0  # 1: the slot u == h is one of them (its first heads are loaded early)
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
            # iteration ``it`` stages the block's token number it and computes number it - (STAGES - 1)
            for it in T.serial(steps + STAGES - 1):
                sn = it % STAGES
                ss = it % SR
                T.sync_warp()  # a compiler fence: the reads of stage sn (STAGES - 1 tokens ago) stay before its refill
                if ok != 0 and it < steps:
                    rs = (ti * hc + h) * nvec + base  # vector index of the thread's first vector in [ti, h, :]
                    rks = ti * (ks0 // V) + h * (ks1 // V) + base
                    rvs = ti * (vs0 // V) + base
                    for u in T.unroll(U):
                        cp_async(stg[sn, GO, u, tid * W], T.Tensor(x_w, "uint32", grad_out.data)[
                            (rs + u * HALF) * W], W, u < nu)
                        cp_async(stg[sn, VV, u, tid * W], T.Tensor(v_w, "uint32", v.data)[
                            (rvs + u * HALF) * W], W, u < nu)
                        if not split:
                            cp_async(stg[sn, XX, u, tid * W], T.Tensor(x_w, "uint32", hidden_states.data)[
                                (rs + u * HALF) * W], W, u < nu)
                            cp_async(stg[sn, KK, u, tid * W], T.Tensor(k_w, "uint32", k.data)[
                                (rks + u * HALF) * W], W, u < nu)
                    # the row's statistics and the first heads' gates: one thread per half copies them
                    if tr == 0:
                        si = ti * hc + h
                        cp_async(scl[ss, tid // HALF, 0], T.Tensor(st_flat, "float32", dot.data)[si], 1)
                        cp_async(scl[ss, tid // HALF, 1], T.Tensor(st_flat, "float32", gate_score.data)[si], 1)
                        cp_async(scl[ss, tid // HALF, 2], T.Tensor(st_flat, "float32", rstd_x.data)[si], 1)
                        cp_async(scl[ss, tid // HALF, 3], T.Tensor(st_flat, "float32", rstd_k.data)[si], 1)
                        for q in T.unroll(HEADS_IN_FLIGHT):
                            cp_async(scl[ss, tid // HALF, 4 + q], T.Tensor(st_flat, "float32", gate_score.data)[
                                si - h + q], 1, q < hc)
                T.ptx_commit_group()  # one group per iteration (split: group A), possibly empty
                if split:  # group B: x and k
                    if ok != 0 and it < steps:
                        for u in T.unroll(U):
                            cp_async(stg[sn, XX, u, tid * W], T.Tensor(x_w, "uint32", hidden_states.data)[
                                (rs + u * HALF) * W], W, u < nu)
                            cp_async(stg[sn, KK, u, tid * W], T.Tensor(k_w, "uint32", k.data)[
                                (rks + u * HALF) * W], W, u < nu)
                    T.ptx_commit_group()
                if early and it == 0:  # the setup deferred behind token 0's copies
                    # grad_v slots (u % hc == h, as in the current kernel), a bit mask
                    gvm = 0
                    for u in T.unroll(U):
                        if u < nu and T.truncmod(u, hc) == h:
                            gvm = gvm | (1 << u)
                    gvh = 0  # 1: the slot u == h is one of them (its first heads are loaded early)
                    for u in T.unroll(U):
                        if u == h and (gvm >> u) & 1 != 0:
                            gvh = 1
                            gvm = gvm & ~(1 << u)  # gvm: the other slots (hc < U only)
                    for u in T.unroll(U):
                        if u < nu:
                            for i in T.vectorized(V):
                                ws[u * V + i] = T.Tensor(w_vec, "float32", weight_fused.data)[
                                    h, (base + u * HALF) * V + i]
                    for i in T.unroll(U * V):
                        gw[i] = T.float32(0)
                if it < steps:  # the issue cursor moves on (uniform)
                    ti = ti + 1
                    if ti == ie:
                        ki = ki + 1
                        ti = (pc + ki * npc) * rsz + T.min(pc + ki * npc, rex)
                        ie = ti + rsz + T.if_then_else(pc + ki * npc < rex, 1, 0)
                if it >= STAGES - 1:
                    sc = (it + 1) % STAGES  # = (it - (STAGES - 1)) % STAGES
                    sr = (it + 2) % SR  # = (it - (STAGES - 1)) % (STAGES + 1)
                    dp = it % 2
                    rc = (tc * hc + h) * nvec + base  # [tc, h, :]
                    if gvh != 0:  # grad_v's grad_out vectors of the first heads, in flight during the wait
                        rq = tc * hc * nvec + base + h * HALF  # [tc, 0, base + h * HALF] in vectors
                        for q in T.unroll(HEADS_IN_FLIGHT):
                            if q < hc:
                                for i in T.vectorized(W):
                                    gvr[q * W + i] = T.Tensor(x_w, "uint32", grad_out.data)[(rq + q * nvec) * W + i]
                    if split:
                        T.ptx_wait_group(2 * STAGES - 1)  # token tc's group A (this thread's) has landed
                    else:
                        T.ptx_wait_group(STAGES - 1)  # token tc's copies (this thread's) have landed
                    T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                    if tr == 0 and ok != 0:  # the row's factors that do not need sum go*v, once per half
                        d = scl[sr, tid // HALF, 0]
                        gg = scl[sr, tid // HALF, 1]
                        rx = scl[sr, tid // HALF, 2]
                        rk = scl[sr, tid // HALF, 3]
                        der[dp, tid // HALF, 0] = gg
                        der[dp, tid // HALF, 1] = T.ieee_mul(T.ieee_mul(T.ieee_mul(d, rx), rk), scalar)  # s
                        der[dp, tid // HALF, 2] = d * rx * rx / fh  # cx
                        der[dp, tid // HALF, 3] = d * rk * rk / fh  # ck
                        der[dp, tid // HALF, 4] = T.sqrt(T.abs(T.ieee_mul(T.ieee_mul(T.ieee_mul(d, rx), rk), scalar)))
                        der[dp, tid // HALF, 5] = rx * rk * scalar
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
                        red[dp, tid // 32] = acc
                    if halfbar:  # the half's barrier (the block's in the wide mode); sync_warp: compiler fences
                        T.sync_warp()
                        T.sync_threads(bid, bcnt)
                        T.sync_warp()
                    else:
                        T.sync_threads()  # also publishes der and the gates staged by thread 0 of each half
                    if split:
                        T.ptx_wait_group(2 * (STAGES - 1))  # token tc's group B (x, k) has landed
                        T.sync_warp()  # keep the x/k reads below the wait
                    if ok != 0:
                        tot = red[dp, j * 4]
                        for q in T.unroll(3):  # the row's warps, in order
                            tot += red[dp, j * 4 + q + 1]
                        if wide != 0:
                            for q in T.unroll(4):
                                tot += red[dp, 4 + q]
                        gg = der[dp, tid // HALF, 0]
                        sg = der[dp, tid // HALF, 1]
                        cx = der[dp, tid // HALF, 2]
                        ck = der[dp, tid // HALF, 3]
                        big = T.if_then_else(T.abs(sg) < clamp_value, T.float32(0),
                                             tot * gg * (T.float32(1) - gg) * T.float32(0.5) / der[dp, tid // HALF, 4]
                                             * der[dp, tid // HALF, 5])
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
                                    fx[2 * i + 1] = gof[u * V + 2 * i + 1] + big * (
                                        khi * ws[u * V + 2 * i + 1] - xhi * cx)
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
                        # The slot u == h (the only one when hc >= U): the early-loaded heads, then any
                        # further heads (hc > HEADS_IN_FLIGHT) loaded directly
                        if gvh != 0:
                            for i in T.unroll(V):
                                gva[i] = T.float32(0)
                            for q in T.unroll(HEADS_IN_FLIGHT):
                                if q < hc:
                                    for i in T.unroll(W):
                                        gva[2 * i] = T.ieee_add(gva[2 * i], T.ieee_mul(
                                            bf16_lo(gvr[q * W + i]), scl[sr, tid // HALF, 4 + q]))
                                        gva[2 * i + 1] = T.ieee_add(gva[2 * i + 1], T.ieee_mul(
                                            bf16_hi(gvr[q * W + i]), scl[sr, tid // HALF, 4 + q]))
                            for q in T.serial(hc - HEADS_IN_FLIGHT):
                                for i in T.vectorized(V):
                                    gol[i] = T.Tensor(x_flat, "bfloat16", grad_out.data)[
                                        ((tc * hc + q + HEADS_IN_FLIGHT) * nvec + base + h * HALF) * V + i]
                                for i in T.unroll(V):
                                    gva[i] = T.ieee_add(gva[i], T.ieee_mul(
                                        f32(gol[i]), gate_score[tc, q + HEADS_IN_FLIGHT]))
                            for i in T.vectorized(V):
                                gvo[i] = T.Cast("bfloat16", gva[i])
                            T.stg128(T.Tensor(gv_flat, "bfloat16", grad_v.data)[(tc * nvec + base + h * HALF) * V],
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
                                                tc, q, (base + u * HALF) * V + i]
                                        for i in T.unroll(V):
                                            gva[i] = T.ieee_add(gva[i], T.ieee_mul(f32(gol[i]), gate_score[tc, q]))
                                    for i in T.vectorized(V):
                                        gvo[i] = T.Cast("bfloat16", gva[i])
                                    T.stg128(T.Tensor(gv_flat, "bfloat16", grad_v.data)[
                                        (tc * nvec + base + u * HALF) * V], T.Tensor((1,), "uint32x4", gvo.data)[0])
                    # the compute cursor moves on; a finished range writes its partial row and restarts the sums
                    tc = tc + 1
                    if tc == ce:
                        for u in T.unroll(U):
                            if u < nu:
                                for i in T.vectorized(V):
                                    T.Tensor(p_vec, "float32", grad_w_partial.data)[
                                        pc + kc * npc, h, (base + u * HALF) * V + i] = gw[u * V + i]
                        for i in T.unroll(U * V):
                            gw[i] = T.float32(0)
                        kc = kc + 1
                        tc = (pc + kc * npc) * rsz + T.min(pc + kc * npc, rex)
                        ce = tc + rsz + T.if_then_else(pc + kc * npc < rex, 1, 0)
            # the ranges with no tokens (the last ones): zero rows
            for q in T.serial(nk - kc):
                for u in T.unroll(U):
                    if u < nu:
                        for i in T.vectorized(V):
                            T.Tensor(p_vec, "float32", grad_w_partial.data)[
                                pc + (kc + q) * npc, h, (base + u * HALF) * V + i] = T.float32(0)

    return main




def _factory(tag: str, split: bool, halfbar: bool, early: bool):
    def factory():
        return _build(split, halfbar, early)

    factory.__name__ = f"engram_gate_bwd_candidate_{tag}"
    return factory


# (tag, split, halfbar, early): a ladder, each variant one change over the one before
VARIANTS = (("halfbar", False, True, False), ("halfbar_split", True, True, False),
            ("halfbar_split_early", True, True, True))

KERNELS = tuple(
    KernelDecl(
        name=f"engram._engram_gate_bwd_candidate_{tag}",
        factory=_factory(tag, split, halfbar, early),
        grid=({},),
        outputs=("grad_x", "grad_k", "grad_v", "grad_w_partial"),
        pass_configs=PASS_CONFIGS_BWD,
        doc=f"Candidate of engram.engram_gate_bwd ({tag}): same parameters, launch and bits.",
    ) for tag, split, halfbar, early in VARIANTS)

__all__ = ["KERNELS", "VARIANTS"]
