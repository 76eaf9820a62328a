"""``mhc.expand_fwd`` / ``mhc.expand_bwd``: copy a hidden row into every mHC stream, and the
gradient of that copy.

``mhc.expand_fwd(x, out)``: ``x`` bf16 ``[num_tokens, hidden]``, ``out`` bf16 ``[num_tokens,
mhc_mult, hidden]``; ``out[t, m, :] = x[t, :]`` for every stream ``m`` (a bit copy).

``mhc.expand_bwd(grad_out, grad_x)``: ``grad_out`` bf16 ``[num_tokens, mhc_mult, hidden]``,
``grad_x`` bf16 ``[num_tokens, hidden]``; ``grad_x[t, i] = bf16(((0 + g0) + g1) + ...)`` with
``g_m = float(grad_out[t, m, i])``: IEEE fp32 adds from +0 over the streams in stream order,
rounded once.

All tensors contiguous and 16-byte aligned; ``num_tokens``, ``mhc_mult`` and ``hidden`` are
run-time symbols (``hidden % 8 == 0``; any ``mhc_mult >= 1``), so one cubin per direction
serves every shape.

Forward: one block of ``THREADS`` threads per token, walking the row in *phases* of
``THREADS * U`` vectors (one phase up to hidden 8192); in a phase thread ``tr`` owns the 16-byte
vectors ``base + tr + u * THREADS`` (``u < U``), a compile-time step (immediate address
offsets).  A thread issues all of its loads, then its ``mhc_mult`` 16-byte stores per vector.

Backward: a block covers one *segment* of ``THREADS`` 16-byte vectors of a token (grid
``(num_tokens, ceil(hidden / (8 * THREADS)))``, every slot full for hidden a multiple of 1024);
each thread owns one vector and issues the loads of ``G`` = 4 streams at once (one
``LDG.E.128`` each, predicated on the stream existing; int32 vector indices) before adding them
in stream order from +0 (so an all -0 column sums to +0); a run-time loop walks the groups of
``G`` streams.  SASS (nvcc 13.0): 40 registers, no spills, 4 ``LDG.E.128`` back to back, one
``STG.E.128``; ``__launch_bounds__(128, 12)``: 48 warps per SM keep ~96 KB of loads in flight
per SM (a cap of 32 registers for 16 blocks spilled 40 bytes).
H200, one run (bwd µs, previous kernel / this / tile_kernels; tokens x hidden): 4096x4096 47.9/44.2/44.6,
4096x7168 72.7/73.3/74.0, 8192x4096 89.4/82.3/83.7, 8192x7168 138.0/141.2/143.4.
Every byte is read once and written once, in both directions.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
U = 8  # vectors per forward thread
PHASE = THREADS * U  # vectors per forward phase (8192 values)
G = 4  # streams whose loads a backward thread issues together
MIN_BLOCKS = 12  # backward __launch_bounds__(128, 12): <= 40 registers (32, for 16 blocks, spills)
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
        doc="grad_x[t, :] = bf16(sum over m of grad_out[t, m, :]) (fp32 from +0, stream order); a block per token segment.",
    ),
)

__all__ = ["KERNELS", "PHASE", "THREADS", "expand_bwd", "expand_fwd"]
