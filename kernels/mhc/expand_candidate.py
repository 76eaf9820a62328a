"""``mhc._expand_fwd_candidate``: a speed candidate for ``mhc.expand_fwd`` (issue 9): same
parameters, variant (``{}``) and bits; the bench and ``tests/gpu/test_gpu_cand_mhc.py`` launch it
directly (``runtime.unchecked_launcher("mhc._expand_fwd_candidate")``).

``(x, out)``: ``x`` bf16 ``[num_tokens, hidden]``, ``out`` bf16 ``[num_tokens, mhc_mult,
hidden]``; ``out[t, m, :] = x[t, :]`` for every stream ``m`` (a bit copy).  ``num_tokens``,
``mhc_mult`` (>= 1) and ``hidden`` (``% 8 == 0``) are run-time symbols; contiguous, 16-byte
aligned tensors.

Why: the shipped kernel runs one block per token with registers for 8 vectors per thread (80
registers, 6 blocks per SM), of which 4 hold data at hidden 4096; a block moves 40 KB (8 KB in,
32 KB out at mhc_mult 4), so at 4096 x 4096 the 4096 blocks make ~5.2 waves of ~7 us blocks
and the last, nearly empty wave leaves DRAM idle for a large part of a block's life (89.5 % of
copy at 4096 tokens, 91.8 % at 8192 x 7168, where blocks are relatively fewer per wave).  Here a
block copies one *segment* of ``THREADS`` 16-byte vectors of a token (grid ``(num_tokens,
ceil(hidden / (8 * THREADS)))``: 4 segments at hidden 4096, 7 at 7168, every slot full), one
``LDG.E.128`` and ``mhc_mult`` ``STG.E.128`` per thread, int32 vector indices: a few registers,
16 blocks (64 warps) per SM, and blocks 4-7x shorter, so the last wave is short.  The same
shape as the measured ``mhc.expand_bwd``.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
MIN_BLOCKS = 16  # __launch_bounds__(128, 16): the most blocks an SM holds (2048 threads)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded


def expand_fwd_candidate():
    """Build the forward PrimFunc (no compile-time parameters)."""
    num_tokens, mhc, hidden = T.dynamic("num_tokens"), T.dynamic("mhc_mult"), T.dynamic("hidden")
    nvec = hidden // V
    x_flat = (num_tokens * nvec * V,)
    o_flat = (num_tokens * mhc * nvec * V,)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), "bfloat16"),
        out: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
    ):
        with T.Kernel(num_tokens, T.ceildiv(nvec, THREADS), threads=THREADS) as (bx, sg):
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            tid = T.get_thread_binding()
            buf = T.alloc_local((V,), "bfloat16")
            ov = T.alloc_var("int32")  # vector index of the thread's vector in stream 0
            if sg * THREADS + tid < nvec:
                for i in T.vectorized(V):
                    buf[i] = T.Tensor(x_flat, "bfloat16", x.data)[(bx * nvec + sg * THREADS + tid) * V + i]
                ov = bx * mhc * nvec + sg * THREADS + tid
                for m in T.serial(mhc):
                    T.stg128(T.Tensor(o_flat, "bfloat16", out.data)[(ov + m * nvec) * V],
                             T.Tensor((1,), "uint32x4", buf.data)[0])

    return main


KERNELS = (
    KernelDecl(
        name="mhc._expand_fwd_candidate",
        factory=expand_fwd_candidate,
        grid=({},),
        outputs=("out",),
        pass_configs=PASS_CONFIGS,
        doc="Speed candidate for mhc.expand_fwd (same parameters and bits): a block per 128-vector token segment.",
    ),
)

__all__ = ["KERNELS", "THREADS", "expand_fwd_candidate"]
