"""``mhc.expand_fwd`` / ``mhc.expand_bwd``: copy a hidden row into every mHC stream, and the
gradient of that copy.

``mhc.expand_fwd(x, out)``: ``x`` bf16 ``[num_tokens, hidden]``, ``out`` bf16 ``[num_tokens,
mhc_mult, hidden]``; ``out[t, m, :] = x[t, :]`` for every stream ``m`` (a bit copy).

``mhc.expand_bwd(grad_out, grad_x)``: ``grad_out`` bf16 ``[num_tokens, mhc_mult, hidden]``,
``grad_x`` bf16 ``[num_tokens, hidden]``; ``grad_x[t, i] = bf16(((g0 + g1) + g2) + ...)`` with
``g_m = float(grad_out[t, m, i])``: an fp32 sum over the streams in stream order, rounded once.

All tensors contiguous and 16-byte aligned; ``num_tokens``, ``mhc_mult`` and ``hidden`` are
run-time symbols (``hidden % 8 == 0``; any ``mhc_mult >= 1``), so one cubin per direction
serves every shape.

Design: one block of ``THREADS`` threads per token, walking the row in *phases* of ``THREADS * U``
vectors (one phase up to hidden 8192); in a phase thread ``tr`` owns the 16-byte vectors
``base + tr + u * THREADS`` (``u < U``), a compile-time step (immediate address offsets).
The forward issues all of a thread's loads, then its ``mhc_mult`` 16-byte stores per vector;
the backward issues, stream by stream, a load per owned vector (U independent accumulators in
flight) and stores each sum once.  Every byte is read once and written once.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
U = 8  # vectors per thread
PHASE = THREADS * U  # vectors per phase (8192 values)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded


def expand_fwd():
    """Build the forward PrimFunc (no compile-time parameters)."""
    num_tokens, mhc, hidden = T.dynamic("num_tokens"), T.dynamic("mhc_mult"), T.dynamic("hidden")
    nvec = hidden // V
    x_vec = (num_tokens, nvec * V)  # rows a multiple of V long: every vector access is aligned
    o_vec = (num_tokens, mhc, nvec * V)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), "bfloat16"),
        out: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
    ):
        with T.Kernel(num_tokens, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            buf = T.alloc_local((U * V,), "bfloat16")
            for ph in T.serial(T.ceildiv(nvec, PHASE)):
                for u in T.unroll(U):
                    if ph * PHASE + tid + u * THREADS < nvec:
                        for i in T.vectorized(V):
                            buf[u * V + i] = T.Tensor(x_vec, "bfloat16", x.data)[
                                bx, (ph * PHASE + tid + u * THREADS) * V + i]
                for u in T.unroll(U):
                    if ph * PHASE + tid + u * THREADS < nvec:
                        for m in T.serial(mhc):
                            T.stg128(T.Tensor(o_vec, "bfloat16", out.data)[bx, m, (ph * PHASE + tid + u * THREADS) * V],
                                     T.Tensor((U,), "uint32x4", buf.data)[u])

    return main


def expand_bwd():
    """Build the backward PrimFunc (no compile-time parameters)."""
    num_tokens, mhc, hidden = T.dynamic("num_tokens"), T.dynamic("mhc_mult"), T.dynamic("hidden")
    nvec = hidden // V
    x_vec = (num_tokens, nvec * V)
    o_vec = (num_tokens, mhc, nvec * V)

    @T.prim_func
    def main(
        grad_out: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        grad_x: T.Tensor((num_tokens, hidden), "bfloat16"),
    ):
        with T.Kernel(num_tokens, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            ld = T.alloc_local((U * V,), "bfloat16")
            acc = T.alloc_local((U * V,), "float32")
            ob = T.alloc_local((U * V,), "bfloat16")
            for ph in T.serial(T.ceildiv(nvec, PHASE)):
                for j in T.unroll(U * V):
                    acc[j] = T.float32(0)
                for m in T.serial(mhc):
                    for u in T.unroll(U):
                        if ph * PHASE + tid + u * THREADS < nvec:
                            for i in T.vectorized(V):
                                ld[u * V + i] = T.Tensor(o_vec, "bfloat16", grad_out.data)[
                                    bx, m, (ph * PHASE + tid + u * THREADS) * V + i]
                    for u in T.unroll(U):
                        if ph * PHASE + tid + u * THREADS < nvec:
                            for i in T.unroll(V):
                                acc[u * V + i] = T.ieee_add(acc[u * V + i], T.Cast("float32", ld[u * V + i]))
                for u in T.unroll(U):
                    if ph * PHASE + tid + u * THREADS < nvec:
                        for i in T.vectorized(V):
                            ob[u * V + i] = T.Cast("bfloat16", acc[u * V + i])
                        T.stg128(T.Tensor(x_vec, "bfloat16", grad_x.data)[bx, (ph * PHASE + tid + u * THREADS) * V],
                                 T.Tensor((U,), "uint32x4", ob.data)[u])

    return main


KERNELS = (
    KernelDecl(
        name="mhc.expand_fwd",
        factory=expand_fwd,
        grid=({},),
        outputs=("out",),
        pass_configs=PASS_CONFIGS,
        doc="out[t, m, :] = x[t, :] for every mHC stream m (bf16 copy).",
    ),
    KernelDecl(
        name="mhc.expand_bwd",
        factory=expand_bwd,
        grid=({},),
        outputs=("grad_x",),
        pass_configs=PASS_CONFIGS,
        doc="grad_x[t, :] = bf16(sum over m of grad_out[t, m, :]) (fp32, stream order).",
    ),
)

__all__ = ["KERNELS", "PHASE", "THREADS", "expand_bwd", "expand_fwd"]
