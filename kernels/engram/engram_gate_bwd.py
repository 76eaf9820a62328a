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

Blocks ``p < num_blocks`` take consecutive token ranges of ``ceil(num_tokens / num_blocks)``
tokens; a block with none writes zeros, so ``grad_w_partial.sum(0)`` is the fused-weight gradient
(``grad_w_reduce``).  Deterministic: fixed summation orders for any launch.

Design: one block of ``THREADS`` threads per (range ``p``, head ``h``), ``bx = p * hc + h`` (the
hc blocks of a range run together, so v and grad_out rows are shared through L2).  Thread
``tid`` owns the 16-byte vectors ``u * THREADS + tid`` (``u < U``) of the row, keeps its slice
of the fused-weight gradient in registers across the block's tokens, and per token issues its
grad_out, v, x and k loads together; ``sum go*v`` is a shuffle + shared-memory reduction
(double-buffered: one barrier per token).  Block ``h`` also writes grad_v on vectors
``[h * nvec / hc, (h + 1) * nvec / hc)`` of the row, reading the other heads' grad_out there.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .engram_gate_fwd import MAX_HIDDEN, PASS_CONFIGS, THREADS, U, V, WARPS


HEADS_IN_FLIGHT = 4  # grad_v: grad_out loads of this many heads in flight at once


def _f(x):
    return T.Cast("float32", x)


def engram_gate_bwd():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, hc, hidden = T.dynamic("num_tokens"), T.dynamic("hc_mult"), T.dynamic("hidden")
    ks0, ks1, vs0 = T.dynamic("k_stride_s"), T.dynamic("k_stride_h"), T.dynamic("v_stride_s")
    num_blocks = T.dynamic("num_blocks")
    nvec = hidden // V
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
        with T.Kernel(num_blocks * hc, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            gos = T.alloc_local((U * V,), "bfloat16")
            xs = T.alloc_local((U * V,), "bfloat16")
            ks = T.alloc_local((U * V,), "bfloat16")
            vs = T.alloc_local((U * V,), "bfloat16")
            ws = T.alloc_local((V,), "float32")
            gw = T.alloc_local((U * V,), "float32")
            ogx = T.alloc_local((V,), "bfloat16")
            ogk = T.alloc_local((V,), "bfloat16")
            gvb = T.alloc_local((HEADS_IN_FLIGHT * V,), "bfloat16")
            gvo = T.alloc_local((V,), "bfloat16")
            gq = T.alloc_local((HEADS_IN_FLIGHT,), "float32")
            gva = T.alloc_local((V,), "float32")
            red = T.alloc_shared((2, WARPS), "float32")
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
            h = T.alloc_var("int32")
            p = T.alloc_var("int32")
            per = T.alloc_var("int32")
            t0 = T.alloc_var("int32")
            t = T.alloc_var("int32")
            h = T.truncmod(bx, hc)
            p = T.truncdiv(bx, hc)
            per = T.truncdiv(num_tokens + num_blocks - 1, num_blocks)
            t0 = T.min(p * per, num_tokens)
            for i in T.unroll(U * V):
                gw[i] = T.float32(0)
            for it in T.serial(T.min(per, num_tokens - t0)):
                t = t0 + it
                for u in T.unroll(U):
                    if u * THREADS + tid < nvec:
                        for i in T.vectorized(V):
                            gos[u * V + i] = T.Tensor(x_vec, "bfloat16", grad_out.data)[t, h, (u * THREADS + tid) * V + i]
                        for i in T.vectorized(V):
                            vs[u * V + i] = T.Tensor(v_flat, "bfloat16", v.data)[
                                t * (vs0 // V) * V + (u * THREADS + tid) * V + i]
                        for i in T.vectorized(V):
                            xs[u * V + i] = T.Tensor(x_vec, "bfloat16", hidden_states.data)[
                                t, h, (u * THREADS + tid) * V + i]
                        for i in T.vectorized(V):
                            ks[u * V + i] = T.Tensor(k_flat, "bfloat16", k.data)[
                                t * (ks0 // V) * V + h * (ks1 // V) * V + (u * THREADS + tid) * V + i]
                # grad_v on this head's share of the row (every head's grad_out, heads in order)
                for u in T.unroll(U):
                    if (u * THREADS + tid) * hc >= h * nvec and (u * THREADS + tid) * hc < (h + 1) * nvec:
                        for i in T.unroll(V):
                            gva[i] = T.float32(0)
                        for q in T.unroll(HEADS_IN_FLIGHT):  # the first heads' loads: straight-line code
                            if q < hc:
                                gq[q] = gate_score[t, q]
                                for i in T.vectorized(V):
                                    gvb[q * V + i] = T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                        t, q, (u * THREADS + tid) * V + i]
                        for q in T.unroll(HEADS_IN_FLIGHT):
                            if q < hc:
                                for i in T.unroll(V):
                                    gva[i] = T.ieee_add(gva[i], T.ieee_mul(_f(gvb[q * V + i]), gq[q]))
                        for hb in T.serial(T.ceildiv(hc, HEADS_IN_FLIGHT) - 1):  # more heads, in groups
                            for q in T.unroll(HEADS_IN_FLIGHT):
                                if (hb + 1) * HEADS_IN_FLIGHT + q < hc:
                                    gq[q] = gate_score[t, (hb + 1) * HEADS_IN_FLIGHT + q]
                                    for i in T.vectorized(V):
                                        gvb[q * V + i] = T.Tensor(x_vec, "bfloat16", grad_out.data)[
                                            t, (hb + 1) * HEADS_IN_FLIGHT + q, (u * THREADS + tid) * V + i]
                            for q in T.unroll(HEADS_IN_FLIGHT):
                                if (hb + 1) * HEADS_IN_FLIGHT + q < hc:
                                    for i in T.unroll(V):
                                        gva[i] = T.ieee_add(gva[i], T.ieee_mul(_f(gvb[q * V + i]), gq[q]))
                        for i in T.unroll(V):
                            gvo[i] = T.Cast("bfloat16", gva[i])
                        for i in T.vectorized(V):
                            T.Tensor(gv_vec, "bfloat16", grad_v.data)[t, (u * THREADS + tid) * V + i] = gvo[i]
                acc = T.float32(0)
                for u in T.unroll(U):
                    if u * THREADS + tid < nvec:
                        for i in T.unroll(V):
                            acc += _f(gos[u * V + i]) * _f(vs[u * V + i])
                for r in T.unroll(5):
                    acc += T.shfl_xor(acc, 16 >> r)
                if tid % 32 == 0:
                    red[it % 2, tid // 32] = acc
                T.sync_threads()
                tot = T.float32(0)
                for w in T.unroll(WARPS):
                    tot += red[it % 2, w]
                gg = gate_score[t, h]
                rx = rstd_x[t, h]
                rk = rstd_k[t, h]
                d = dot[t, h]
                sg = T.ieee_mul(T.ieee_mul(T.ieee_mul(d, rx), rk), scalar)
                big = T.if_then_else(T.abs(sg) < clamp_value, T.float32(0),
                                     tot * gg * (T.float32(1) - gg) * T.float32(0.5) / T.sqrt(T.abs(sg))
                                     * (rx * rk * scalar))
                cx = d * rx * rx / _f(hidden)
                ck = d * rk * rk / _f(hidden)
                for u in T.unroll(U):
                    if u * THREADS + tid < nvec:
                        for i in T.vectorized(V):
                            ws[i] = T.Tensor(w_vec, "float32", weight_fused.data)[h, (u * THREADS + tid) * V + i]
                        for i in T.unroll(V):
                            ogx[i] = T.Cast("bfloat16", _f(gos[u * V + i]) + big * (
                                _f(ks[u * V + i]) * ws[i] - _f(xs[u * V + i]) * cx))
                            ogk[i] = T.Cast("bfloat16", big * (_f(xs[u * V + i]) * ws[i] - _f(ks[u * V + i]) * ck))
                            gw[u * V + i] += big * _f(xs[u * V + i]) * _f(ks[u * V + i])
                        for i in T.vectorized(V):
                            T.Tensor(x_vec, "bfloat16", grad_x.data)[t, h, (u * THREADS + tid) * V + i] = ogx[i]
                        for i in T.vectorized(V):
                            T.Tensor(x_vec, "bfloat16", grad_k.data)[t, h, (u * THREADS + tid) * V + i] = ogk[i]
            for u in T.unroll(U):
                if u * THREADS + tid < nvec:
                    for i in T.vectorized(V):
                        T.Tensor(p_vec, "float32", grad_w_partial.data)[p, h, (u * THREADS + tid) * V + i] = gw[u * V + i]

    return main


KERNELS = (
    KernelDecl(
        name="engram.engram_gate_bwd",
        factory=engram_gate_bwd,
        grid=({},),
        outputs=("grad_x", "grad_k", "grad_v", "grad_w_partial"),
        pass_configs=PASS_CONFIGS,
        doc="Gradients of engram_gate_fwd: grad_x, grad_k, grad_v (bf16) and per-block fused-weight partials (fp32).",
    ),
)

__all__ = ["KERNELS", "MAX_HIDDEN", "engram_gate_bwd"]
