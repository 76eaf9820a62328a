"""``mhc._pre_apply_mix_fwd_candidate``: a speed candidate for ``mhc.pre_apply_mix_fwd`` (issue 9),
same parameters, variants (``mhc`` 4, 2, 8) and bits (``tilebin.modeling.mhc.ops.pre_apply_mix``
launches it when ``TILEBIN_CANDIDATE_MHC_PRE_APPLY_MIX_FWD=1``).

``(x, mix, out)``: ``x`` bf16 ``[num_tokens, mhc, hidden]``, ``mix`` fp32 ``[num_tokens, mhc]``,
``out`` bf16 ``[num_tokens, hidden]``; per element, in fp32, ``acc = mix[t, 0] * x_0; acc =
fma(mix[t, m], x_m, acc)`` for m = 1 .. mhc-1, ``out = bf16(acc)`` (the shipped kernel's
operations in its order: the same bits).  ``num_tokens`` and ``hidden`` (``% 8 == 0``) are
run-time symbols; contiguous, 16-byte aligned tensors.

Why (hidden 7168, M = 4, where the shipped kernel trails tile_kernels by 0.5-1 %; at 4096 it
leads): its blocks cover 256-vector segments (2 vectors per thread), and a 7168 row has 896
vectors, so the fourth block of every token runs with half its threads idle while holding a
full block's registers and warp slots (1/8 of the grid's thread slots load nothing).  Here a
thread owns ``U`` = 1 vector for M >= 4 (2 for M = 2): grid ``(num_tokens, ceil(hidden / (8 *
128 * U)))``, every slot full for hidden a multiple of 1024; the mix comes in as one 16-byte
load (M = 4), addresses are int32 vector indices.  SASS (nvcc 13.0), no spills: M = 4 32
registers (was 64) under ``__launch_bounds__(128, 16)``, 64 warps per SM, 4 ``LDG.E.128`` of x
+ 1 of the mix per thread before the first use (was 8 + 4 scalar at 8 blocks per SM: the same
~128 KB in flight per SM, now with every block full); M = 2 32 registers, M = 8 56 (as before).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
MHC_VALUES = (4, 2, 8)
UNITS = {2: 2, 4: 1, 8: 1}  # vectors per thread and block
MIN_BLOCKS = {2: 16, 4: 16, 8: 8}  # __launch_bounds__ minimum blocks per SM (M <= 4: <= 32 registers)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded


def pre_apply_mix_fwd_candidate(mhc: int):
    """Build the forward PrimFunc for ``mhc`` streams."""
    U = UNITS[mhc]
    SEG = THREADS * U
    MW = 4 if mhc >= 4 else mhc  # floats per mix vector load (mhc * 4 bytes is 16-byte aligned for mhc >= 4)
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
    x_flat = (num_tokens * mhc * nvec * V,)
    o_flat = (num_tokens * nvec * V,)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        mix: T.Tensor((num_tokens, mhc), "float32"),
        out: T.Tensor((num_tokens, hidden), "bfloat16"),
    ):
        with T.Kernel(num_tokens, T.ceildiv(nvec, SEG), threads=THREADS) as (bx, sg):
            T.annotate_min_blocks_per_sm(MIN_BLOCKS[mhc])
            tid = T.get_thread_binding()
            xs = T.alloc_local((U * mhc * V,), "bfloat16")
            w = T.alloc_local((mhc,), "float32")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((V,), "bfloat16")
            xv = T.alloc_var("int32")  # vector index of the thread's first vector of stream 0
            ov = T.alloc_var("int32")  # vector index of its first output vector
            xv = bx * mhc * nvec + sg * SEG + tid
            ov = bx * nvec + sg * SEG + tid
            for q in T.unroll(mhc // MW):
                for i in T.vectorized(MW):
                    w[q * MW + i] = T.Tensor((num_tokens * mhc,), "float32", mix.data)[(bx * (mhc // MW) + q) * MW + i]
            for u in T.unroll(U):
                if sg * SEG + tid + u * THREADS < nvec:
                    for m in T.unroll(mhc):
                        for i in T.vectorized(V):
                            xs[(u * mhc + m) * V + i] = T.Tensor(x_flat, "bfloat16", x.data)[
                                (xv + m * nvec + u * THREADS) * V + i]
            for u in T.unroll(U):
                if sg * SEG + tid + u * THREADS < nvec:
                    for i in T.unroll(V):
                        acc[i] = T.ieee_mul(w[0], T.Cast("float32", xs[(u * mhc) * V + i]))
                    for m in T.unroll(mhc - 1):
                        for i in T.unroll(V):
                            acc[i] = T.ieee_fmaf(w[m + 1], T.Cast("float32", xs[(u * mhc + m + 1) * V + i]), acc[i])
                    for i in T.vectorized(V):
                        ob[i] = T.Cast("bfloat16", acc[i])
                    T.stg128(T.Tensor(o_flat, "bfloat16", out.data)[(ov + u * THREADS) * V],
                             T.Tensor((1,), "uint32x4", ob.data)[0])

    return main


KERNELS = (
    KernelDecl(
        name="mhc._pre_apply_mix_fwd_candidate",
        factory=pre_apply_mix_fwd_candidate,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("out",),
        pass_configs=PASS_CONFIGS,
        doc="Speed candidate for mhc.pre_apply_mix_fwd (same parameters, variants and bits): one vector per thread.",
    ),
)

__all__ = ["KERNELS", "MHC_VALUES", "THREADS", "pre_apply_mix_fwd_candidate"]
