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

Design (after tile_kernels' backward; our own code): block ``bx = p * nhg + hg`` (``nhg =
ceil(hc / 4)``; one block per token range at hc <= 4, so one wave of ``num_blocks`` blocks) runs
heads ``4 hg + j`` over the tokens of range ``p``, one token per step with all four heads: head
slot ``j = tid // 64`` (two warps), thread ``ln = tid % 64`` owns the row's vectors ``ln + u * 64``
(``u < 16``, a constant 1 KB step: immediate offsets of one address per stream).  Per step: the
four statistics and all of the thread's grad_out and v vectors are loaded (16-byte loads, issued
before any use), ``sum go*v`` goes through 5 shuffles and one barrier (two warps per head, ``red``
double-buffered, so one barrier per token); the first pass-2 chunk (4 vectors of grad_out, x, k
and w) is loaded before that barrier, the others after it; grad_x and grad_k leave as 16-byte
stores.  The fused-weight gradient accumulates in private shared-memory slots (128 KB: a thread
reads and writes only its own, so no barrier), leaving registers for the loads in flight (254
registers, no spills, one block per SM).  grad_v (the ``hg == 0`` blocks): thread ``(j, ln)`` sums
the vectors ``ln + (4 uu + j) * 64`` over the heads in order, the first four heads' vectors
loaded together (mostly L1 hits: the block just read them), any further heads (hc > 4, the slow
path) one by one.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .engram_gate_fwd import MAX_HIDDEN, PASS_CONFIGS, THREADS, V, WARPS


HPB = 4  # heads per block: at hc 4 one step is all heads of a token
TPH = THREADS // HPB  # 64 threads (2 warps) per head
UU = MAX_HIDDEN // (V * TPH)  # 16: most vectors per thread (the row's vectors ln + u * TPH)
P1 = 8  # vectors per thread whose grad_out and v loads are in flight together in the first pass
PC = 4  # vectors per thread whose x, k, w and grad_out loads are in flight together in the second pass
PASS_CONFIGS_BWD = dict(PASS_CONFIGS, **{"tl.disable_thread_storage_sync": True})  # one explicit barrier per token


def _f(x):
    return T.Cast("float32", x)


def engram_gate_bwd():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, hc, hidden = T.dynamic("num_tokens"), T.dynamic("hc_mult"), T.dynamic("hidden")
    ks0, ks1, vs0 = T.dynamic("k_stride_s"), T.dynamic("k_stride_h"), T.dynamic("v_stride_s")
    num_blocks = T.dynamic("num_blocks")
    nvec = hidden // V
    nhg = T.ceildiv(hc, HPB)  # head groups: blocks per token range
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
        with T.Kernel(num_blocks * nhg, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            red = T.alloc_shared((2, WARPS), "float32")
            gws = T.alloc_shared((UU, THREADS, V), "float32")  # private grad_w slots (128 KB)
            goa = T.alloc_local((P1 * V,), "bfloat16")
            va = T.alloc_local((P1 * V,), "bfloat16")
            gob = T.alloc_local((PC * V,), "bfloat16")
            xb = T.alloc_local((PC * V,), "bfloat16")
            kb = T.alloc_local((PC * V,), "bfloat16")
            wb = T.alloc_local((PC * V,), "float32")
            gvl = T.alloc_local((HPB * V,), "bfloat16")  # grad_v: one vector of HPB heads
            gts = T.alloc_local((HPB,), "float32")
            gwl = T.alloc_local((V,), "float32")
            gwo = T.alloc_local((4,), "float32")
            ogx = T.alloc_local((V,), "bfloat16")
            ogk = T.alloc_local((V,), "bfloat16")
            gvo = T.alloc_local((V,), "bfloat16")
            gol = T.alloc_local((V,), "bfloat16")
            gva = T.alloc_local((V,), "float32")
            fx = T.alloc_local((V,), "float32")
            fk = T.alloc_local((V,), "float32")
            acc = T.alloc_var("float32")
            pu = T.alloc_var("float32")
            tot = T.alloc_var("float32")
            gg = T.alloc_var("float32")
            rx = T.alloc_var("float32")
            rk = T.alloc_var("float32")
            d = T.alloc_var("float32")
            sg = T.alloc_var("float32")
            big = T.alloc_var("float32")
            cx = T.alloc_var("float32")
            ck = T.alloc_var("float32")
            pair = T.alloc_var("int32")
            ln = T.alloc_var("int32")
            gvb = T.alloc_var("int32")
            hg = T.alloc_var("int32")
            h = T.alloc_var("int32")
            ok = T.alloc_var("int32")
            p = T.alloc_var("int32")
            per = T.alloc_var("int32")
            t0 = T.alloc_var("int32")
            n = T.alloc_var("int32")
            t = T.alloc_var("int32")
            sb = T.alloc_var("int32")
            pair = tid // TPH  # this thread's head in the group
            ln = tid % TPH  # its first vector; the others follow at the constant step TPH
            gvb = ln + pair * TPH  # grad_v: its vectors gvb + uu * HPB * TPH (slots u with u % HPB == pair)
            p = T.truncdiv(bx, nhg)
            hg = T.truncmod(bx, nhg)
            h = hg * HPB + pair
            ok = T.if_then_else(h < hc, 1, 0)
            h = h * ok
            per = T.truncdiv(num_tokens + num_blocks - 1, num_blocks)
            t0 = T.min(p * per, num_tokens)
            n = T.min(per, num_tokens - t0)
            for u in T.unroll(UU):  # a thread reads and writes only its own slots: no barrier
                for i in T.vectorized(V):
                    gws[u, tid, i] = T.float32(0)
            for it in T.serial(n):
                t = t0 + it
                sb = it % 2  # red is double-buffered: one barrier per token
                # pass 1: sum go * v over the row (all loads issued first)
                if ok != 0:
                    d = dot[t, h]
                    gg = gate_score[t, h]
                    rx = rstd_x[t, h]
                    rk = rstd_k[t, h]
                acc = T.float32(0)
                for c1 in T.unroll(UU // P1):
                    for uc in T.unroll(P1):
                        if ok != 0 and ln + (c1 * P1 + uc) * TPH < nvec:
                            for i in T.vectorized(V):
                                goa[uc * V + i] = T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                    t, h, (ln + (c1 * P1 + uc) * TPH) * V + i]
                            for i in T.vectorized(V):
                                va[uc * V + i] = T.Tensor(v_flat, "bfloat16", v.data)[
                                    t * (vs0 // V) * V + (ln + (c1 * P1 + uc) * TPH) * V + i]
                    for uc in T.unroll(P1):
                        if ok != 0 and ln + (c1 * P1 + uc) * TPH < nvec:
                            pu = T.float32(0)
                            for i in T.unroll(V):
                                pu += _f(goa[uc * V + i]) * _f(va[uc * V + i])
                            acc += pu
                # pass 2 in chunks of PC vectors; chunk 0's loads are in flight across the barrier
                for c in T.unroll(UU // PC):
                    for uc in T.unroll(PC):
                        if ok != 0 and ln + (c * PC + uc) * TPH < nvec:
                            for i in T.vectorized(V):
                                gob[uc * V + i] = T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                    t, h, (ln + (c * PC + uc) * TPH) * V + i]
                            for i in T.vectorized(V):
                                xb[uc * V + i] = T.Tensor(x_vec, "bfloat16", hidden_states.data)[
                                    t, h, (ln + (c * PC + uc) * TPH) * V + i]
                            for i in T.vectorized(V):
                                kb[uc * V + i] = T.Tensor(k_flat, "bfloat16", k.data)[
                                    t * (ks0 // V) * V + h * (ks1 // V) * V + (ln + (c * PC + uc) * TPH) * V + i]
                            for i in T.vectorized(V):
                                wb[uc * V + i] = T.Tensor(w_vec, "float32", weight_fused.data)[
                                    h, (ln + (c * PC + uc) * TPH) * V + i]
                    if c == 0:  # uniform: every thread reaches the barrier once per token
                        for r in T.unroll(5):
                            acc += T.shfl_xor(acc, 16 >> r)
                        if tid % 32 == 0:
                            red[sb, tid // 32] = acc
                        T.sync_threads()
                        tot = red[sb, pair * 2] + red[sb, pair * 2 + 1]  # the head's two warps, in order
                        sg = T.ieee_mul(T.ieee_mul(T.ieee_mul(d, rx), rk), scalar)
                        big = T.if_then_else(T.abs(sg) < clamp_value, T.float32(0),
                                             tot * gg * (T.float32(1) - gg) * T.float32(0.5) / T.sqrt(T.abs(sg))
                                             * (rx * rk * scalar))
                        cx = d * rx * rx / _f(hidden)
                        ck = d * rk * rk / _f(hidden)
                    for uc in T.unroll(PC):
                        if ok != 0 and ln + (c * PC + uc) * TPH < nvec:
                            for i in T.vectorized(V):
                                gwl[i] = gws[c * PC + uc, tid, i]
                            for i in T.unroll(V):
                                fx[i] = _f(gob[uc * V + i]) + big * (
                                    _f(kb[uc * V + i]) * wb[uc * V + i] - _f(xb[uc * V + i]) * cx)
                                fk[i] = big * (_f(xb[uc * V + i]) * wb[uc * V + i] - _f(kb[uc * V + i]) * ck)
                                gwl[i] = gwl[i] + big * _f(xb[uc * V + i]) * _f(kb[uc * V + i])
                            for i in T.vectorized(V):
                                gws[c * PC + uc, tid, i] = gwl[i]
                            # bf16x2 converts, then one explicit 16-byte store (kernels/README.md, Pitfalls)
                            for i in T.vectorized(V):
                                ogx[i] = T.Cast("bfloat16", fx[i])
                            for i in T.vectorized(V):
                                ogk[i] = T.Cast("bfloat16", fk[i])
                            T.stg128(T.Tensor(x_vec, "bfloat16", grad_x.data)[t, h, (ln + (c * PC + uc) * TPH) * V],
                                     T.Tensor((1,), "uint32x4", ogx.data)[0])
                            T.stg128(T.Tensor(x_vec, "bfloat16", grad_k.data)[t, h, (ln + (c * PC + uc) * TPH) * V],
                                     T.Tensor((1,), "uint32x4", ogk.data)[0])
                # grad_v (the first head group's blocks): heads in order, the first HPB loaded together
                if hg == 0:
                    for q in T.unroll(HPB):
                        if q < hc:
                            gts[q] = gate_score[t, q]
                    for uu in T.unroll(UU // HPB):
                        if gvb + uu * HPB * TPH < nvec:
                            for q in T.unroll(HPB):
                                if q < hc:
                                    for i in T.vectorized(V):
                                        gvl[q * V + i] = T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                            t, q, (gvb + uu * HPB * TPH) * V + i]
                            for i in T.unroll(V):
                                gva[i] = T.float32(0)
                            for q in T.unroll(HPB):
                                if q < hc:
                                    for i in T.unroll(V):
                                        gva[i] = T.ieee_add(gva[i], T.ieee_mul(_f(gvl[q * V + i]), gts[q]))
                            for q in T.serial(T.max(hc - HPB, 0)):  # hc > 4: the slow path
                                for i in T.vectorized(V):
                                    gol[i] = T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                        t, q + HPB, (gvb + uu * HPB * TPH) * V + i]
                                for i in T.unroll(V):
                                    gva[i] = T.ieee_add(gva[i], T.ieee_mul(_f(gol[i]), gate_score[t, q + HPB]))
                            for i in T.vectorized(V):
                                gvo[i] = T.Cast("bfloat16", gva[i])
                            T.stg128(T.Tensor(gv_vec, "bfloat16", grad_v.data)[t, (gvb + uu * HPB * TPH) * V],
                                     T.Tensor((1,), "uint32x4", gvo.data)[0])
            for u in T.unroll(UU):
                if ok != 0 and ln + u * TPH < nvec:
                    for hf in T.unroll(2):
                        for i in T.vectorized(4):
                            gwo[i] = gws[u, tid, hf * 4 + i]
                        T.stg128(T.Tensor(p_vec, "float32", grad_w_partial.data)[p, h, (ln + u * TPH) * V + hf * 4],
                                 T.Tensor((1,), "uint32x4", gwo.data)[0])

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
