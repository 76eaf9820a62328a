"""``mhc._expand_bwd_candidate``: a speed candidate for ``mhc.expand_bwd`` (issue 9), same
parameters, same bits (``tilebin.modeling.mhc.ops.expand`` launches it when
``TILEBIN_CANDIDATE_EXPAND_TO_MHC_BWD=1``).

``(grad_out, grad_x)``: ``grad_out`` bf16 ``[num_tokens, mhc_mult, hidden]``, ``grad_x`` bf16
``[num_tokens, hidden]``; ``grad_x[t, i] = bf16(((0 + g0) + g1) + ...)`` with ``g_m =
float(grad_out[t, m, i])``: IEEE fp32 adds from +0 in stream order, rounded once (the shipped
kernel's expression, so the same bits, -0 sums included).  ``num_tokens``, ``mhc_mult`` (>= 1)
and ``hidden`` (``% 8 == 0``) are run-time symbols; contiguous, 16-byte aligned tensors.

Why (ncu at 4096 x 4096, M = 4): the shipped kernel runs one block per token and sizes every
thread for a whole 8192-value phase (8 vectors: 64 fp32 sums + 32 load registers, 116
registers, 4 blocks per SM); at hidden 4096 half of those vector slots are empty, and each
stream's loads are consumed before the next stream's are issued, so an SM has ~32 KB in flight
(DRAM 70 %).  Here a block covers one *segment* of ``THREADS`` 16-byte vectors of a token (grid
``(num_tokens, ceil(hidden / (8 * THREADS)))``, every slot full for hidden a multiple of 1024),
each thread owns one vector and issues the loads of ``G`` = 4 streams at once (one
``LDG.E.128`` each, predicated on the stream existing; int32 vector indices) before adding
them in stream order; a run-time loop walks the groups of ``G`` streams.  SASS (nvcc 13.0):
40 registers, no spills, 4 ``LDG.E.128`` back to back, one ``STG.E.128``;
``__launch_bounds__(128, 12)``: 48 warps per SM keep ~96 KB of loads in flight per SM (a cap
of 32 registers for 16 blocks spilled 40 bytes).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
G = 4  # streams whose loads a thread issues together
MIN_BLOCKS = 12  # __launch_bounds__(128, 12): <= 40 registers (32, for 16 blocks, spills)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded


def expand_bwd_candidate():
    """Build the backward PrimFunc (no compile-time parameters)."""
    num_tokens, mhc, hidden = T.dynamic("num_tokens"), T.dynamic("mhc_mult"), T.dynamic("hidden")
    nvec = hidden // V
    x_vec = (num_tokens, nvec * V)  # rows a multiple of V long: every vector access is aligned
    o_flat = (num_tokens * mhc * nvec * V,)

    @T.prim_func
    def main(
        grad_out: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        grad_x: T.Tensor((num_tokens, hidden), "bfloat16"),
    ):
        with T.Kernel(num_tokens, T.ceildiv(nvec, THREADS), threads=THREADS) as (bx, sg):
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            tid = T.get_thread_binding()
            ld = T.alloc_local((G * V,), "bfloat16")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((V,), "bfloat16")
            row = T.alloc_var("int32")  # vector index of the thread's vector in stream g * G
            if sg * THREADS + tid < nvec:
                for i in T.unroll(V):
                    acc[i] = T.float32(0)
                for g in T.serial(T.ceildiv(mhc, G)):
                    row = (bx * mhc + g * G) * nvec + sg * THREADS + tid
                    for s in T.unroll(G):
                        if g * G + s < mhc:
                            for i in T.vectorized(V):
                                ld[s * V + i] = T.Tensor(o_flat, "bfloat16", grad_out.data)[(row + s * nvec) * V + i]
                    for s in T.unroll(G):
                        if g * G + s < mhc:
                            for i in T.unroll(V):
                                acc[i] = T.ieee_add(acc[i], T.Cast("float32", ld[s * V + i]))
                for i in T.vectorized(V):
                    ob[i] = T.Cast("bfloat16", acc[i])
                T.stg128(T.Tensor(x_vec, "bfloat16", grad_x.data)[bx, (sg * THREADS + tid) * V],
                         T.Tensor((1,), "uint32x4", ob.data)[0])

    return main


KERNELS = (
    KernelDecl(
        name="mhc._expand_bwd_candidate",
        factory=expand_bwd_candidate,
        grid=({},),
        outputs=("grad_x",),
        pass_configs=PASS_CONFIGS,
        doc="Speed candidate for mhc.expand_bwd (same parameters and bits): a block per token segment.",
    ),
)

__all__ = ["KERNELS", "THREADS", "expand_bwd_candidate"]
