"""``mhc.head_compute_mix_fwd`` / ``mhc.head_compute_mix_bwd``: the LM head's stream weights
(a sigmoid of the scaled mixes), and their gradients.

``mhc.head_compute_mix_fwd(input_mix, scale, base, output_mix, pre_eps)``: ``input_mix`` and
``output_mix`` fp32 ``[num_tokens, mhc]``, ``scale`` fp32 ``[1]``, ``base`` fp32 ``[mhc]``,
``pre_eps`` an fp32 scalar::

    output_mix[t, m] = sigmoid(fma(input_mix[t, m], scale[0], base[m])) + pre_eps

``mhc.head_compute_mix_bwd(grad_output, input_mix, scale, base, grad_input, partial,
grad_scale, grad_base)``: ``grad_output``, ``grad_input`` fp32 ``[num_tokens, mhc]``;
``partial`` fp32 ``[PARTS, MAX_MHC + 1]`` scratch (any contents); ``grad_scale`` fp32 ``[1]``,
``grad_base`` fp32 ``[mhc]``.  With ``s`` the forward's sigmoid and ``d = (s * (1 - s)) *
grad_output[t, m]``::

    grad_input[t, m] = d * scale[0]
    grad_scale[0]    = sum over (t, m) of d * input_mix[t, m]
    grad_base[m]     = sum over t of d

``num_tokens`` and ``mhc`` (``1 <= mhc <= MAX_MHC``) are run-time symbols: one cubin each.
Every tensor contiguous; 4-byte accesses only.

Design: the forward is one thread per element: ``sigmoid(z) = 1 / (1 + expf(0 - z))`` with the
IEEE division written as nvcc compiles it (``pre_split_mixes``' reciprocal helpers: the fast path
without its branch, the full division only where the fast path's range test fails), and the
stream index a 32-bit modulo, so the input and scale loads are issued first (the earlier 64-bit
modulo and division branch sat before them: 4.0 vs 3.9 us at 8192 tokens, H200 2026-12-02; now
3.8-3.9, the same bits).  The backward is two kernels launched in
order: ``PARTS`` blocks of ``THREADS`` threads stride over the tokens (thread ``g`` takes
tokens ``g, g + PARTS * THREADS, ...``, all streams of each), write ``grad_input`` and sum
their ``1 + mhc`` values (xor-shuffles, then the warps in order) into row ``bx`` of
``partial``; then one warp adds the ``PARTS`` rows in order.  Deterministic, independent of the
GPU's SM count, and correct for 0 tokens (the sums are zeros).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .pre_split_mixes import _rcp_approx, _rcp_refine, _rcp_slow

THREADS = 256
WARPS = THREADS // 32
PARTS = 128  # blocks of the backward's first kernel (rows of ``partial``)
MAX_MHC = 8
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded


def _umod(a, b):
    """``a % b`` for ``a >= 0``, ``b >= 1`` (int32) as one 32-bit unsigned modulo."""
    return T.Cast("int32", T.truncmod(T.Cast("uint32", a), T.Cast("uint32", b)))


def head_compute_mix_fwd():
    """Build the forward PrimFunc (no compile-time parameters)."""
    num_tokens, mhc = T.dynamic("num_tokens"), T.dynamic("mhc_mult")

    @T.prim_func
    def main(
        input_mix: T.Tensor((num_tokens, mhc), "float32"),
        scale: T.Tensor((1,), "float32"),
        base: T.Tensor((mhc,), "float32"),
        output_mix: T.Tensor((num_tokens, mhc), "float32"),
        pre_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * mhc, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            e = T.alloc_var("int32")
            d = T.alloc_var("float32")
            y = T.alloc_var("float32")
            e = bx * THREADS + tid
            if e < num_tokens * mhc:
                d = T.float32(1) + T.exp(T.float32(0) - T.ieee_fmaf(
                    T.Tensor((num_tokens * mhc,), "float32", input_mix.data)[e], scale[0], base[_umod(e, mhc)]))
                y = _rcp_approx(d)  # 1 / d: nvcc's fast path, branch-free, and its full division where that fails
                y = _rcp_refine(d, y)
                if _rcp_slow(d) != 0:
                    y = T.float32(1) / d
                T.Tensor((num_tokens * mhc,), "float32", output_mix.data)[e] = y + pre_eps

    return main


def head_compute_mix_bwd():
    """Build the backward PrimFunc (two kernels, no compile-time parameters)."""
    num_tokens, mhc = T.dynamic("num_tokens"), T.dynamic("mhc_mult")
    NP = MAX_MHC + 1  # sums: the scale's, then one per stream

    @T.prim_func
    def main(
        grad_output: T.Tensor((num_tokens, mhc), "float32"),
        input_mix: T.Tensor((num_tokens, mhc), "float32"),
        scale: T.Tensor((1,), "float32"),
        base: T.Tensor((mhc,), "float32"),
        grad_input: T.Tensor((num_tokens, mhc), "float32"),
        partial: T.Tensor((PARTS, NP), "float32"),
        grad_scale: T.Tensor((1,), "float32"),
        grad_base: T.Tensor((mhc,), "float32"),
    ):
        with T.Kernel(PARTS, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            part = T.alloc_local((NP,), "float32")
            red = T.alloc_shared((NP, WARPS), "float32")
            sc = T.alloc_var("float32")
            s = T.alloc_var("float32")
            d = T.alloc_var("float32")
            a = T.alloc_var("float32")
            tot = T.alloc_var("float32")
            sc = scale[0]
            for c in T.unroll(NP):
                part[c] = T.float32(0)
            for k in T.serial(T.ceildiv(num_tokens, PARTS * THREADS)):
                if (k * PARTS + bx) * THREADS + tid < num_tokens:
                    for m in T.unroll(MAX_MHC):
                        if m < mhc:
                            a = input_mix[(k * PARTS + bx) * THREADS + tid, m]
                            s = T.sigmoid(T.ieee_fmaf(a, sc, base[m]))
                            d = T.ieee_mul(T.ieee_mul(s, T.float32(1) - s),
                                           grad_output[(k * PARTS + bx) * THREADS + tid, m])
                            grad_input[(k * PARTS + bx) * THREADS + tid, m] = T.ieee_mul(d, sc)
                            part[0] = T.ieee_fmaf(d, a, part[0])
                            part[m + 1] = T.ieee_add(part[m + 1], d)
            for c in T.unroll(NP):
                for r in T.unroll(5):
                    part[c] += T.shfl_xor(part[c], 16 >> r)
            if tid % 32 == 0:
                for c in T.unroll(NP):
                    red[c, tid // 32] = part[c]
            T.sync_threads()
            if tid < NP:
                tot = red[tid, 0]
                for q in T.unroll(WARPS - 1):
                    tot += red[tid, q + 1]
                partial[bx, tid] = tot
        with T.Kernel(1, threads=32) as bx:
            tid = T.get_thread_binding()
            acc = T.alloc_var("float32")
            if tid <= mhc:
                acc = partial[0, tid]
                for p in T.serial(PARTS - 1):
                    acc += partial[p + 1, tid]
                if tid == 0:
                    grad_scale[0] = acc
                else:
                    grad_base[tid - 1] = acc

    return main


KERNELS = (
    KernelDecl(
        name="mhc.head_compute_mix_fwd",
        factory=head_compute_mix_fwd,
        grid=({},),
        outputs=("output_mix",),
        align=4,
        pass_configs=PASS_CONFIGS,
        doc="output_mix = sigmoid(input_mix * scale + base) + pre_eps (fp32).",
    ),
    KernelDecl(
        name="mhc.head_compute_mix_bwd",
        factory=head_compute_mix_bwd,
        meta={"parts": PARTS, "max_mhc": MAX_MHC},  # the op's mhc limit and its scratch's [parts, max_mhc + 1]
        grid=({},),
        outputs=("grad_input", "partial", "grad_scale", "grad_base"),
        align=4,
        pass_configs=PASS_CONFIGS,
        doc="Gradients of mhc.head_compute_mix_fwd for input_mix, scale and base (deterministic sums).",
    ),
)

__all__ = ["KERNELS", "MAX_MHC", "PARTS", "THREADS", "head_compute_mix_bwd", "head_compute_mix_fwd"]
