"""Speed candidates of ``mhc.head_compute_mix_fwd`` (issue 9; ``head_compute_mix.py``): same
parameters ``(input_mix, scale, base, output_mix, pre_eps)``, same variant grid (one variant,
``num_tokens`` and ``mhc_mult`` run-time, 1 to 8), same output bits; measured by the lead.

Per element, as the shipped kernel: ``z = fma(in, scale[0], base[e % mhc])``, ``d = 1 +
expf(0 - z)``, ``out = 1 / d + pre_eps`` (IEEE division).  The division is nvcc's own fast path
written branch-free (``r = rcp.approx.ftz(d)``, ``fma(r, fma(-d, r, 1), r)``; ``pre_split_mixes``'
helpers) with nvcc's own fast-path range test, and the plain ``1 / d`` (nvcc's full division,
slow path included) for a thread where any value fails it: the shipped kernel's bits for every
input (the shipped SASS is exactly that fast path, ``MUFU.RCP``, ``FFMA d*r-1``, ``FADD.FTZ`` negate,
``FFMA``, behind the same test; ``fma(-d, r, 1)`` is the negation of ``fma(d, r, -1)`` and the
residual is 0 or far above the denormal range, so ``FTZ`` never acts).

* ``_hoist`` (one element per thread, 256 threads, the shipped grid): the shipped SASS issues its
  three loads only after a 64-bit ``e % mhc`` (a ``BSSY``/``CALL`` region, ~30 dependent
  instructions) and keeps the division's branch.  Here the stream index is a 32-bit unsigned
  modulo (straight-line: nvcc issues the input and scale loads first and computes the modulo under
  their latency) and the reciprocal is branch-free: the only change is the critical path before
  the loads.
* ``_vec4`` (four consecutive elements per thread, 64-thread blocks, grid ``ceil(n * mhc / 256)``):
  where both pointers are 16-byte aligned and ``mhc`` is a power of two (1, 2, 4, 8: stream of
  element ``e`` is ``e & (mhc - 1)``, no division), one ``LDG.E.128`` and one ``STG.E.128`` per
  thread and four interleaved sigmoids; otherwise four scalar elements (32-bit modulo).  The
  ``n * mhc % 4`` last elements are taken by the thread of quad ``n * mhc // 4``.  A quarter of
  the warps and memory instructions; at 8192 tokens x 4: 128 blocks of 2 warps.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .pre_split_mixes import _rcp_approx, _rcp_refine, _rcp_slow

PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded
HOIST_THREADS = 256
VEC_THREADS = 64
VW = 4  # elements per thread of _vec4


def _umod(a, b):
    """``a % b`` for ``a >= 0``, ``b >= 1`` (int32) as one 32-bit unsigned modulo."""
    return T.Cast("int32", T.truncmod(T.Cast("uint32", a), T.Cast("uint32", b)))


def _addr(buf):
    """The data pointer of ``buf`` as an integer (for the run-time 16-byte alignment test)."""
    return T.call_extern("uint64", "reinterpret_cast<unsigned long long>", buf.data)


def head_compute_mix_fwd_hoist():
    num_tokens, mhc = T.dynamic("num_tokens"), T.dynamic("mhc_mult")

    @T.prim_func
    def main(
        input_mix: T.Tensor((num_tokens, mhc), "float32"),
        scale: T.Tensor((1,), "float32"),
        base: T.Tensor((mhc,), "float32"),
        output_mix: T.Tensor((num_tokens, mhc), "float32"),
        pre_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * mhc, HOIST_THREADS), threads=HOIST_THREADS) as bx:
            tid = T.get_thread_binding()
            e = T.alloc_var("int32")
            d = T.alloc_var("float32")
            y = T.alloc_var("float32")
            e = bx * HOIST_THREADS + tid
            if e < num_tokens * mhc:
                d = T.float32(1) + T.exp(T.float32(0) - T.ieee_fmaf(
                    T.Tensor((num_tokens * mhc,), "float32", input_mix.data)[e], scale[0], base[_umod(e, mhc)]))
                y = _rcp_approx(d)
                y = _rcp_refine(d, y)
                if _rcp_slow(d) != 0:
                    y = T.float32(1) / d
                T.Tensor((num_tokens * mhc,), "float32", output_mix.data)[e] = y + pre_eps

    return main


def head_compute_mix_fwd_vec4():
    num_tokens, mhc = T.dynamic("num_tokens"), T.dynamic("mhc_mult")

    @T.prim_func
    def main(
        input_mix: T.Tensor((num_tokens, mhc), "float32"),
        scale: T.Tensor((1,), "float32"),
        base: T.Tensor((mhc,), "float32"),
        output_mix: T.Tensor((num_tokens, mhc), "float32"),
        pre_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * mhc, VEC_THREADS * VW), threads=VEC_THREADS) as bx:
            tid = T.get_thread_binding()
            a = T.alloc_local((VW,), "float32")
            d = T.alloc_local((VW,), "float32")
            y = T.alloc_local((VW,), "float32")
            sc = T.alloc_var("float32")
            q = T.alloc_var("int32")
            slow = T.alloc_var("int32")
            q = bx * VEC_THREADS + tid
            if q < T.truncdiv(num_tokens * mhc, VW):
                sc = scale[0]
                # the vector path and the scalar fallback each compute and store in full (no shared tail:
                # nvcc then keeps the shipped kernel's instruction forms, e.g. 1 + expf as one FFMA)
                if ((_addr(input_mix) | _addr(output_mix)) & T.uint64(15)) == T.uint64(0) and \
                        T.bitwise_and(mhc, mhc - 1) == 0:
                    for i in T.vectorized(VW):
                        a[i] = T.Tensor((num_tokens * mhc,), "float32", input_mix.data)[q * VW + i]
                    for i in T.unroll(VW):
                        d[i] = T.float32(1) + T.exp(T.float32(0) - T.ieee_fmaf(
                            a[i], sc, base[T.bitwise_and(q * VW + i, mhc - 1)]))
                    slow = 0
                    for i in T.unroll(VW):
                        y[i] = _rcp_approx(d[i])
                        y[i] = _rcp_refine(d[i], y[i])
                        slow = slow | _rcp_slow(d[i])
                    if slow != 0:
                        for i in T.unroll(VW):
                            y[i] = T.float32(1) / d[i]
                    for i in T.unroll(VW):
                        y[i] = y[i] + pre_eps
                    for i in T.vectorized(VW):
                        T.Tensor((num_tokens * mhc,), "float32", output_mix.data)[q * VW + i] = y[i]
                else:
                    for i in T.unroll(VW):
                        a[i] = T.Tensor((num_tokens * mhc,), "float32", input_mix.data)[q * VW + i]
                    for i in T.unroll(VW):
                        d[i] = T.float32(1) + T.exp(T.float32(0) - T.ieee_fmaf(
                            a[i], sc, base[_umod(q * VW + i, mhc)]))
                        y[i] = _rcp_approx(d[i])
                        y[i] = _rcp_refine(d[i], y[i])
                        if _rcp_slow(d[i]) != 0:
                            y[i] = T.float32(1) / d[i]
                        T.Tensor((num_tokens * mhc,), "float32", output_mix.data)[q * VW + i] = y[i] + pre_eps
            elif q == T.truncdiv(num_tokens * mhc, VW):  # the last n * mhc % 4 elements, one by one
                for i in T.unroll(VW - 1):
                    if q * VW + i < num_tokens * mhc:
                        d[0] = T.float32(1) + T.exp(T.float32(0) - T.ieee_fmaf(
                            T.Tensor((num_tokens * mhc,), "float32", input_mix.data)[q * VW + i], scale[0],
                            base[_umod(q * VW + i, mhc)]))
                        y[0] = _rcp_approx(d[0])
                        y[0] = _rcp_refine(d[0], y[0])
                        if _rcp_slow(d[0]) != 0:
                            y[0] = T.float32(1) / d[0]
                        T.Tensor((num_tokens * mhc,), "float32", output_mix.data)[q * VW + i] = y[0] + pre_eps

    return main


def _decl(tag: str, factory, doc: str) -> KernelDecl:
    return KernelDecl(
        name=f"mhc._head_compute_mix_fwd_candidate_{tag}",
        factory=factory,
        grid=({},),
        outputs=("output_mix",),
        align=4,
        pass_configs=PASS_CONFIGS,
        doc=f"candidate mhc.head_compute_mix_fwd (internal): {doc}",
    )


KERNELS = (
    _decl("hoist", head_compute_mix_fwd_hoist, "the shipped grid, 32-bit modulo under the loads, branch-free 1/d."),
    _decl("vec4", head_compute_mix_fwd_vec4, "4 elements per thread (16-byte accesses where aligned), 64 threads."),
)

__all__ = ["KERNELS", "head_compute_mix_fwd_hoist", "head_compute_mix_fwd_vec4"]
