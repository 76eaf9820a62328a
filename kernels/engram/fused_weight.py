"""``engram.fused_weight(weight_hidden, weight_embed, weight_fused)``: the gate's fused RMSNorm weight.

weight_hidden and weight_embed are bf16 ``[hc_mult, hidden]``, weight_fused fp32 ``[hc_mult,
hidden]``, all contiguous; both extents are runtime symbols (``hidden % 8 == 0``)::

    weight_fused[h, i] = float(weight_hidden[h, i]) * float(weight_embed[h, i])

The product of two bf16 values is exact in fp32, so the result is bit-exact whatever the
rounding mode.  Design: a thread per 16-byte vector of 8 bf16 of each input (one 32-byte fp32
store), ``THREADS`` vectors per block, grid ``(ceil(hidden / (8 * THREADS)), hc_mult)``.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector


def fused_weight():
    """Build the PrimFunc (no compile-time parameters)."""
    hc, hidden = T.dynamic("hc_mult"), T.dynamic("hidden")
    nvec = hidden // V
    vec = (hc, nvec * V)  # rows a multiple of V long: every vector is aligned

    @T.prim_func
    def main(
        weight_hidden: T.Tensor((hc, hidden), "bfloat16"),
        weight_embed: T.Tensor((hc, hidden), "bfloat16"),
        weight_fused: T.Tensor((hc, hidden), "float32"),
    ):
        with T.Kernel(T.ceildiv(nvec, THREADS), hc, threads=THREADS) as (bx, by):
            tid = T.get_thread_binding()
            a = T.alloc_local((V,), "bfloat16")
            b = T.alloc_local((V,), "bfloat16")
            o = T.alloc_local((V,), "float32")
            if bx * THREADS + tid < nvec:
                for i in T.vectorized(V):
                    a[i] = T.Tensor(vec, "bfloat16", weight_hidden.data)[by, (bx * THREADS + tid) * V + i]
                for i in T.vectorized(V):
                    b[i] = T.Tensor(vec, "bfloat16", weight_embed.data)[by, (bx * THREADS + tid) * V + i]
                for i in T.unroll(V):
                    o[i] = T.ieee_mul(T.Cast("float32", a[i]), T.Cast("float32", b[i]))
                for i in T.vectorized(V):
                    T.Tensor(vec, "float32", weight_fused.data)[by, (bx * THREADS + tid) * V + i] = o[i]

    return main


KERNELS = (
    KernelDecl(
        name="engram.fused_weight",
        factory=fused_weight,
        grid=({},),
        outputs=("weight_fused",),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="weight_fused = float(weight_hidden) * float(weight_embed), [hc_mult, hidden] (exact).",
    ),
)

__all__ = ["KERNELS", "THREADS", "fused_weight"]
