"""``engram.engram_gate_fwd``: fused RMSNorm of x and k, gated dot product, ``out = x + gate * v``.

Parameters, in order: ``hidden_states`` bf16 ``[num_tokens, hc, hidden]`` (contiguous), ``k``
bf16 ``[num_tokens, hc, hidden]`` (strides ``(k_stride_s, k_stride_h, 1)``), ``v`` bf16
``[num_tokens, hidden]`` (strides ``(v_stride_s, 1)``), ``weight_fused`` fp32 ``[hc, hidden]``,
``output`` bf16 like hidden_states, ``dot``, ``gate_score``, ``rstd_x``, ``rstd_k`` fp32
``[num_saved, hc]``, then scalars ``eps``, ``clamp_value``, ``scalar`` (fp32) and ``save``
(int32 0/1).  Every extent and stride is a runtime symbol; ``hidden % 8 == 0`` and
``hidden <= MAX_HIDDEN``, strides multiples of 8 elements, pointers 16-byte aligned.  With
``save == 1``, ``num_saved == num_tokens``; with ``save == 0`` the four fp32 outputs are never
touched (pass empty ``[0, hc]`` tensors).

Per token ``t`` and head ``h``, in fp32 (x, k, v widened from bf16, w = weight_fused[h])::

    sx = sum x*x;  sk = sum k*k;  d = sum (x*w)*k             (any summation order)
    rx = rsqrt(sx / hidden + eps);  rk = rsqrt(sk / hidden + eps)
    s = ((d * rx) * rk) * scalar                              (scalar = hidden**-0.5)
    gate = sigmoid(copysign(sqrt(max(|s|, clamp_value)), s))
    output[t, h, i] = bf16(x_i + gate * v_i)                  (product and sum rounded apart)
    if save: dot = d; gate_score = gate; rstd_x = rx; rstd_k = rk

Design: rows ``r = t * hc + h`` are handled by ``wpr = ceil(hidden / (32 * U * V))`` warps each
(``wpr = 4`` at hidden 4096, 7 at 7168, 1 at 576), and a block of ``WARPS`` warps takes the
``rpb = WARPS // wpr`` consecutive rows ``bx * rpb + j`` (2 rows, i.e. two heads of one token, at
hidden 4096): every block holds about ``THREADS * U`` vectors of each stream in flight whatever
the hidden size (the register budget is sized for 8192; one row per block would leave half of it
idle at 4096), and the heads of a token run side by side, so v comes from DRAM once.  Thread
``lane`` of warp ``wr`` of a row owns the 16-byte vectors ``u * 32 * wpr + 32 * wr + lane``
(``u < U``); it issues all its x, k, w and v loads first, keeps them in registers, reduces the
three sums (xor-shuffles, then one shared-memory exchange across the row's warps, summed in warp
order: deterministic), and writes its output vectors.  Every byte is read once (w and v from L2
after the first row) and written once.  Warps without a row (``WARPS % wpr``, the last block's
tail) load and store nothing but still meet the barrier.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256
WARPS = THREADS // 32
V = 8  # bf16 per 16-byte vector
U = 4  # vectors per thread
MAX_HIDDEN = THREADS * U * V  # 8192
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded


def engram_gate_fwd():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, hc, hidden = T.dynamic("num_tokens"), T.dynamic("hc_mult"), T.dynamic("hidden")
    ks0, ks1, vs0 = T.dynamic("k_stride_s"), T.dynamic("k_stride_h"), T.dynamic("v_stride_s")
    num_saved = T.dynamic("num_saved")  # num_tokens, or 0 when the statistics are not saved
    nvec = hidden // V
    # views whose row lengths and strides are multiples of V: every vector access is aligned
    x_vec = (num_tokens, hc, nvec * V)
    w_vec = (hc, nvec * V)
    warps_per_row = T.ceildiv(nvec, 32 * U)  # 1..WARPS for hidden <= MAX_HIDDEN
    rows_per_block = WARPS // warps_per_row
    k_flat = ((num_tokens - 1) * (ks0 // V) * V + (hc - 1) * (ks1 // V) * V + nvec * V,)
    v_flat = ((num_tokens - 1) * (vs0 // V) * V + nvec * V,)

    @T.prim_func
    def main(
        hidden_states: T.Tensor((num_tokens, hc, hidden), "bfloat16"),
        k: T.StridedTensor((num_tokens, hc, hidden), (ks0, ks1, 1), "bfloat16"),
        v: T.StridedTensor((num_tokens, hidden), (vs0, 1), "bfloat16"),
        weight_fused: T.Tensor((hc, hidden), "float32"),
        output: T.Tensor((num_tokens, hc, hidden), "bfloat16"),
        dot: T.Tensor((num_saved, hc), "float32"),
        gate_score: T.Tensor((num_saved, hc), "float32"),
        rstd_x: T.Tensor((num_saved, hc), "float32"),
        rstd_k: T.Tensor((num_saved, hc), "float32"),
        eps: T.float32,
        clamp_value: T.float32,
        scalar: T.float32,
        save: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * hc, rows_per_block), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            xs = T.alloc_local((U * V,), "bfloat16")
            ks = T.alloc_local((U * V,), "bfloat16")
            vs = T.alloc_local((U * V,), "bfloat16")
            ws = T.alloc_local((U * V,), "float32")
            ob = T.alloc_local((V,), "bfloat16")
            acc = T.alloc_local((3,), "float32")
            red = T.alloc_shared((3, WARPS), "float32")
            tot = T.alloc_local((3,), "float32")
            rx = T.alloc_var("float32")
            rk = T.alloc_var("float32")
            sg = T.alloc_var("float32")
            gate = T.alloc_var("float32")
            wpr = T.alloc_var("int32")
            j = T.alloc_var("int32")
            tr = T.alloc_var("int32")
            row = T.alloc_var("int32")
            ok = T.alloc_var("int32")
            t = T.alloc_var("int32")
            h = T.alloc_var("int32")
            wpr = warps_per_row
            j = tid // 32 // wpr  # this warp's row in the block (== rows_per_block: no row)
            tr = tid - j * wpr * 32  # the thread's place in its row
            row = bx * rows_per_block + j
            ok = T.if_then_else(j < rows_per_block and row < num_tokens * hc, 1, 0)
            t = T.truncdiv(row, hc) * ok
            h = T.truncmod(row, hc) * ok
            for u in T.unroll(U):
                if ok != 0 and u * wpr * 32 + tr < nvec:
                    for i in T.vectorized(V):
                        xs[u * V + i] = T.Tensor(x_vec, "bfloat16", hidden_states.data)[
                            t, h, (u * wpr * 32 + tr) * V + i]
                    for i in T.vectorized(V):
                        ks[u * V + i] = T.Tensor(k_flat, "bfloat16", k.data)[
                            (t) * (ks0 // V) * V + (h) * (ks1 // V) * V + (u * wpr * 32 + tr) * V + i]
                    for i in T.vectorized(V):
                        ws[u * V + i] = T.Tensor(w_vec, "float32", weight_fused.data)[
                            h, (u * wpr * 32 + tr) * V + i]
                    for i in T.vectorized(V):
                        vs[u * V + i] = T.Tensor(v_flat, "bfloat16", v.data)[
                            (t) * (vs0 // V) * V + (u * wpr * 32 + tr) * V + i]
            for c in T.unroll(3):
                acc[c] = T.float32(0)
            for u in T.unroll(U):
                if ok != 0 and u * wpr * 32 + tr < nvec:
                    for i in T.unroll(V):
                        acc[0] += T.Cast("float32", xs[u * V + i]) * T.Cast("float32", xs[u * V + i])
                        acc[1] += T.Cast("float32", ks[u * V + i]) * T.Cast("float32", ks[u * V + i])
                        acc[2] += T.Cast("float32", xs[u * V + i]) * ws[u * V + i] * T.Cast("float32", ks[u * V + i])
            for c in T.unroll(3):
                for r in T.unroll(5):
                    acc[c] += T.shfl_xor(acc[c], 16 >> r)
            if tid % 32 == 0:
                for c in T.unroll(3):
                    red[c, tid // 32] = acc[c]
            T.sync_threads()
            if ok != 0:
                for c in T.unroll(3):
                    tot[c] = red[c, j * wpr]
                    for q in T.serial(wpr - 1):  # the row's warps, in order
                        tot[c] += red[c, j * wpr + q + 1]
                rx = T.rsqrt(tot[0] / T.Cast("float32", hidden) + eps)
                rk = T.rsqrt(tot[1] / T.Cast("float32", hidden) + eps)
                sg = T.ieee_mul(T.ieee_mul(T.ieee_mul(tot[2], rx), rk), scalar)
                gate = T.sigmoid(T.copysign(T.sqrt(T.max(T.abs(sg), clamp_value)), sg))
                if save != 0 and tr == 0:
                    dot[t, h] = tot[2]
                    gate_score[t, h] = gate
                    rstd_x[t, h] = rx
                    rstd_k[t, h] = rk
                for u in T.unroll(U):
                    if u * wpr * 32 + tr < nvec:
                        for i in T.unroll(V):
                            ob[i] = T.Cast("bfloat16", T.ieee_add(
                                T.Cast("float32", xs[u * V + i]), T.ieee_mul(gate, T.Cast("float32", vs[u * V + i]))))
                        for i in T.vectorized(V):
                            T.Tensor(x_vec, "bfloat16", output.data)[t, h, (u * wpr * 32 + tr) * V + i] = ob[i]

    return main


KERNELS = (
    KernelDecl(
        name="engram.engram_gate_fwd",
        factory=engram_gate_fwd,
        grid=({},),
        outputs=("output", "dot", "gate_score", "rstd_x", "rstd_k"),
        pass_configs=PASS_CONFIGS,
        doc="out = x + sigmoid(signed_sqrt(RMSNorm(x) . w . RMSNorm(k) / sqrt(hidden))) * v; optional saved stats.",
    ),
)

__all__ = ["KERNELS", "MAX_HIDDEN", "THREADS", "engram_gate_fwd"]
