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

Design: blocks of ``THREADS`` = 128 threads cover a token's row in *segments* of ``THREADS * U``
16-byte vectors: the forward launches a block per (token, segment) (grid ``(num_tokens,
ceil(hidden / (8 * THREADS * U)))``, so a short batch still has every segment in flight at
once); the backward, which sums over the row, runs one block per token that walks the segments
(a run-time loop).  In a segment thread ``tr`` owns the vectors ``base + tr + u * THREADS``
(``u < U``, a compile-time step: immediate address offsets), the same vector of every stream.  A thread issues all of a segment's loads (``U * mhc`` vectors of x,
plus grad_out and, when accumulating, grad_x in the backward) before any arithmetic; ``U``
keeps that near 8-17 vectors per thread for every ``mhc`` (forward ``U = max(1, 8 // mhc)``,
backward ``U = max(1, 4 // mhc)``), so registers stay low enough for several blocks per SM and
one block's reduction or tail overlaps another's loads.  The backward's ``grad_mix``: a thread
adds its products in (segment, vector, element) order, each warp combines its lanes by
xor-shuffles (offsets 16, 8, 4, 2, 1) and the four WARPS' sums are added in warp order;
deterministic for a given hidden.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
WARPS = THREADS // 32
V = 8  # bf16 per 16-byte vector
MHC_VALUES = (4, 2, 8)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded


def fwd_vectors(mhc: int) -> int:
    """Vectors per thread and segment of the forward for ``mhc`` streams."""
    return max(1, 8 // mhc)


def bwd_vectors(mhc: int) -> int:
    """Vectors per thread and segment of the backward for ``mhc`` streams."""
    return max(1, 4 // mhc)


def pre_apply_mix_fwd(mhc: int):
    """Build the forward PrimFunc for ``mhc`` streams."""
    U = fwd_vectors(mhc)
    PH = THREADS * U
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
    x_vec = (num_tokens, mhc, nvec * V)  # rows a multiple of V long: every vector access is aligned
    o_vec = (num_tokens, nvec * V)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        mix: T.Tensor((num_tokens, mhc), "float32"),
        out: T.Tensor((num_tokens, hidden), "bfloat16"),
    ):
        with T.Kernel(num_tokens, T.ceildiv(nvec, PH), threads=THREADS) as (bx, ph):
            tid = T.get_thread_binding()
            xs = T.alloc_local((U * mhc * V,), "bfloat16")
            w = T.alloc_local((mhc,), "float32")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((U * V,), "bfloat16")
            for m in T.unroll(mhc):
                w[m] = mix[bx, m]
            for u in T.unroll(U):
                if ph * PH + tid + u * THREADS < nvec:
                    for m in T.unroll(mhc):
                        for i in T.vectorized(V):
                            xs[(u * mhc + m) * V + i] = T.Tensor(x_vec, "bfloat16", x.data)[
                                bx, m, (ph * PH + tid + u * THREADS) * V + i]
            for u in T.unroll(U):
                if ph * PH + tid + u * THREADS < nvec:
                    for i in T.unroll(V):
                        acc[i] = T.ieee_mul(w[0], T.Cast("float32", xs[(u * mhc) * V + i]))
                    for m in T.unroll(mhc - 1):
                        for i in T.unroll(V):
                            acc[i] = T.ieee_fmaf(w[m + 1], T.Cast("float32", xs[(u * mhc + m + 1) * V + i]), acc[i])
                    for i in T.vectorized(V):
                        ob[u * V + i] = T.Cast("bfloat16", acc[i])
                    T.stg128(T.Tensor(o_vec, "bfloat16", out.data)[bx, (ph * PH + tid + u * THREADS) * V],
                             T.Tensor((U,), "uint32x4", ob.data)[u])

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
        pass_configs=PASS_CONFIGS,
        doc="out[t, :] = bf16(sum over m of mix[t, m] * x[t, m, :]) (fp32 fma chain in stream order).",
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

__all__ = ["KERNELS", "MHC_VALUES", "THREADS", "bwd_vectors", "fwd_vectors", "pre_apply_mix_bwd", "pre_apply_mix_fwd"]
