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

Design: a block of ``THREADS`` = 256 threads is two halves of 128 threads (4 warps); a half
covers one *segment* of up to ``SEG = 512`` vectors (4096 values) of a (token, head) row
``r = t * hc + h``.  The split is chosen from ``hidden`` at run time (a uniform
value, no variant): with ``hidden <= 4096`` (``nseg = 1``) the halves take the two rows
``2 * bx`` and ``2 * bx + 1`` (two heads of a token side by side, so v comes from DRAM once);
with ``4096 < hidden <= 8192`` (``nseg = 2``) both halves take row ``bx``, half ``s`` its
segment ``s``.  Thread ``tr`` of a half owns the 16-byte vectors ``seg * SEG + u * 128 + tr``
(``u < U``): the per-``u`` step is the constant 2 KB, so every load and store of a thread is
one base address plus an immediate offset (a run-time step, e.g. ``32 * ceil(hidden / 1024)``
warps' worth, cost an address computation per access and ~50 % more instructions before the
first load, which showed at 7168 where each block makes a single round trip).  A thread
issues all its x, k, w and v loads first, keeps them in registers, reduces the three sums
(xor-shuffles, then one shared-memory exchange; a row's warps are summed in warp order:
deterministic, and both halves of a 2-segment row compute the same sums), and writes its
output vectors.  Every byte is read once (w and v from L2 after the first head) and written
once.  Rows past the end load and store nothing but still meet the barrier.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256
WARPS = THREADS // 32
V = 8  # bf16 per 16-byte vector
U = 4  # vectors per thread
HALF = THREADS // 2  # threads per segment
SEG = HALF * U  # vectors per segment
MAX_HIDDEN = 2 * SEG * V  # 8192
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
    # segments per row (1 or 2; 1 for hidden == 0) and rows per block (2 or 1): non-negative
    # operands only, so floor and truncating division agree in the grid expression
    nseg = T.max(1, (nvec + SEG - 1) // SEG)
    rows_per_block = 2 // nseg
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
            wide = T.alloc_var("int32")
            tr = T.alloc_var("int32")
            base = T.alloc_var("int32")
            row = T.alloc_var("int32")
            ok = T.alloc_var("int32")
            t = T.alloc_var("int32")
            h = T.alloc_var("int32")
            wide = nseg - 1  # 0: two rows per block; 1: one row, a segment per half
            tr = tid % HALF
            row = bx * rows_per_block + (tid // HALF) * (1 - wide)
            base = (tid // HALF) * wide * SEG + tr  # first vector of the thread
            ok = T.if_then_else(row < num_tokens * hc, 1, 0)
            t = T.truncdiv(row, hc) * ok
            h = T.truncmod(row, hc) * ok
            for u in T.unroll(U):
                if ok != 0 and base + u * HALF < nvec:
                    for i in T.vectorized(V):
                        xs[u * V + i] = T.Tensor(x_vec, "bfloat16", hidden_states.data)[
                            t, h, (base + u * HALF) * V + i]
                    for i in T.vectorized(V):
                        ks[u * V + i] = T.Tensor(k_flat, "bfloat16", k.data)[
                            (t) * (ks0 // V) * V + (h) * (ks1 // V) * V + (base + u * HALF) * V + i]
                    for i in T.vectorized(V):
                        ws[u * V + i] = T.Tensor(w_vec, "float32", weight_fused.data)[
                            h, (base + u * HALF) * V + i]
                    for i in T.vectorized(V):
                        vs[u * V + i] = T.Tensor(v_flat, "bfloat16", v.data)[
                            (t) * (vs0 // V) * V + (base + u * HALF) * V + i]
            for c in T.unroll(3):
                acc[c] = T.float32(0)
            for u in T.unroll(U):
                if ok != 0 and base + u * HALF < nvec:
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
                for c in T.unroll(3):  # the row's warps, in order
                    tot[c] = red[c, (tid // HALF) * (1 - wide) * 4]
                    for q in T.unroll(3):
                        tot[c] += red[c, (tid // HALF) * (1 - wide) * 4 + q + 1]
                    if wide != 0:
                        for q in T.unroll(4):
                            tot[c] += red[c, 4 + q]
                rx = T.rsqrt(tot[0] / T.Cast("float32", hidden) + eps)
                rk = T.rsqrt(tot[1] / T.Cast("float32", hidden) + eps)
                sg = T.ieee_mul(T.ieee_mul(T.ieee_mul(tot[2], rx), rk), scalar)
                gate = T.sigmoid(T.copysign(T.sqrt(T.max(T.abs(sg), clamp_value)), sg))
                if save != 0 and base == 0:
                    dot[t, h] = tot[2]
                    gate_score[t, h] = gate
                    rstd_x[t, h] = rx
                    rstd_k[t, h] = rk
                for u in T.unroll(U):
                    if base + u * HALF < nvec:
                        for i in T.unroll(V):
                            ob[i] = T.Cast("bfloat16", T.ieee_add(
                                T.Cast("float32", xs[u * V + i]), T.ieee_mul(gate, T.Cast("float32", vs[u * V + i]))))
                        for i in T.vectorized(V):
                            T.Tensor(x_vec, "bfloat16", output.data)[t, h, (base + u * HALF) * V + i] = ob[i]

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
