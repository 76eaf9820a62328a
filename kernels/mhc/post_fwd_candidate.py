"""``mhc._post_fwd_candidate``: a speed candidate for ``mhc.post_fwd`` (issue 9), same parameters,
variants (``mhc`` 4, 2, 8) and bits (``tilebin.modeling.mhc.ops.post`` launches it when
``TILEBIN_CANDIDATE_MHC_POST_FWD=1``).

``(x, residual, post_mix, comb_mix, out)``: ``x`` bf16 ``[num_tokens, hidden]``, ``residual``
bf16 ``[num_tokens, mhc, hidden]``, ``post_mix`` fp32 ``[num_tokens, mhc]``, ``comb_mix`` fp32
``[num_tokens, mhc, mhc]``, ``out`` bf16 like residual.  Per element, in fp32::

    acc = post_mix[t, n] * float(x[t, i])
    acc = fma(comb_mix[t, m, n], float(residual[t, m, i]), acc) for m = 0 .. mhc-1
    out[t, n, i] = bf16(acc)

(the shipped kernel's operations in its order: the same bits).  ``num_tokens`` and ``hidden``
(``% 8 == 0``) are run-time symbols; contiguous, 16-byte aligned tensors.

Why (ncu at 4096 x 4096, M = 4): the shipped kernel gives a thread 2 vectors of x and of every
stream (10 ``LDG.E.128``, 40 load registers) plus 20 scalar loads of the mixes, 108 registers:
4 blocks (16 warps) per SM, 21 % occupancy; at hidden 7168 its 256-vector segments leave the
fourth block of every token half idle (896 vectors).  Here a thread owns ``U`` = 1 vector for
M >= 4 (2 for M = 2): grid ``(num_tokens, ceil(hidden / (8 * 128 * U)))``, every slot full for
hidden a multiple of 1024; the mixes come in as 16-byte vectors (M = 4: 4 + 1 loads instead of
20), addresses are int32 vector indices.  SASS (nvcc 13.0), no spills: M = 4 64 registers under ``__launch_bounds__(128, 8)``
(a cap of 48 for 10 blocks spilled 72 bytes), 10 ``LDG.E.128`` issued back to back (4 comb + 1
post + 1 x + 4 residual), 4 ``STG.E.128``: 32 warps per SM, the same ~80 KB of loads in flight
per SM as before with twice the warps to overlap one block's arithmetic and stores with the
others' loads.  M = 2: 48 registers (was 78), M = 8: 167 (as before), 27 ``LDG.E.128`` (was 9
+ 72 scalar).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
MHC_VALUES = (4, 2, 8)
UNITS = {2: 2, 4: 1, 8: 1}  # vectors per thread and block
MIN_BLOCKS = {2: 10, 4: 8, 8: 2}  # __launch_bounds__ minimum blocks per SM (M = 4 spills at 10)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded


def post_fwd_candidate(mhc: int):
    """Build the forward PrimFunc for ``mhc`` streams."""
    U = UNITS[mhc]
    SEG = THREADS * U
    MW = 4 if mhc >= 4 else mhc  # floats per mix vector load (mhc * 4 bytes is 16-byte aligned for mhc >= 4)
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
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
        with T.Kernel(num_tokens, T.ceildiv(nvec, SEG), threads=THREADS) as (bx, sg):
            T.annotate_min_blocks_per_sm(MIN_BLOCKS[mhc])
            tid = T.get_thread_binding()
            xs = T.alloc_local((U * V,), "bfloat16")
            rs = T.alloc_local((U * mhc * V,), "bfloat16")
            pw = T.alloc_local((mhc,), "float32")
            cw = T.alloc_local((mhc * mhc,), "float32")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((V,), "bfloat16")
            xv = T.alloc_var("int32")  # vector index of the thread's first x vector
            rv = T.alloc_var("int32")  # vector index of its first vector of stream 0
            xv = bx * nvec + sg * SEG + tid
            rv = bx * mhc * nvec + sg * SEG + tid
            for q in T.unroll(mhc // MW):
                for i in T.vectorized(MW):
                    pw[q * MW + i] = T.Tensor((num_tokens * mhc,), "float32", post_mix.data)[
                        (bx * (mhc // MW) + q) * MW + i]
            for q in T.unroll(mhc * mhc // 4):
                for i in T.vectorized(4):
                    cw[q * 4 + i] = T.Tensor((num_tokens * mhc * mhc,), "float32", comb_mix.data)[
                        (bx * (mhc * mhc // 4) + q) * 4 + i]
            for u in T.unroll(U):
                if sg * SEG + tid + u * THREADS < nvec:
                    for i in T.vectorized(V):
                        xs[u * V + i] = T.Tensor(x_flat, "bfloat16", x.data)[(xv + u * THREADS) * V + i]
                    for m in T.unroll(mhc):
                        for i in T.vectorized(V):
                            rs[(u * mhc + m) * V + i] = T.Tensor(r_flat, "bfloat16", residual.data)[
                                (rv + m * nvec + u * THREADS) * V + i]
            for u in T.unroll(U):
                if sg * SEG + tid + u * THREADS < nvec:
                    for n in T.unroll(mhc):
                        for i in T.unroll(V):
                            acc[i] = T.ieee_mul(pw[n], T.Cast("float32", xs[u * V + i]))
                        for m in T.unroll(mhc):
                            for i in T.unroll(V):
                                acc[i] = T.ieee_fmaf(cw[m * mhc + n], T.Cast("float32", rs[(u * mhc + m) * V + i]),
                                                     acc[i])
                        for i in T.vectorized(V):
                            ob[i] = T.Cast("bfloat16", acc[i])
                        T.stg128(T.Tensor(r_flat, "bfloat16", out.data)[(rv + n * nvec + u * THREADS) * V],
                                 T.Tensor((1,), "uint32x4", ob.data)[0])

    return main


KERNELS = (
    KernelDecl(
        name="mhc._post_fwd_candidate",
        factory=post_fwd_candidate,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("out",),
        pass_configs=PASS_CONFIGS,
        doc="Speed candidate for mhc.post_fwd (same parameters, variants and bits): one vector per thread.",
    ),
)

__all__ = ["KERNELS", "MHC_VALUES", "THREADS", "post_fwd_candidate"]
