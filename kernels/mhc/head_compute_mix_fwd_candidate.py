"""``mhc._head_compute_mix_fwd_candidate``: ``mhc.head_compute_mix_fwd`` (``head_compute_mix.py``)
with the same parameters, one variant (``num_tokens`` and ``mhc_mult`` run-time, 1 to 8) and
the same output bits, issued differently (internal: the op launches it when
``TILEBIN_CANDIDATE_MHC_HEAD_COMPUTE_MIX_FWD=1``).

Why (issue 9; SASS of the current kernel, nvcc 13.0): the stream of element ``e`` is ``e % mhc``
with a run-time ``mhc``; TVM's floor modulo of the flat (64-bit) index became a 64-bit division
subroutine behind a 32-bit fast path (``I2F``, ``MUFU.RCP``, ``F2I``, 3 ``IMAD.HI``, fix-ups,
then the floor-mod sign selects: ~35 dependent instructions) placed before BOTH loads: nvcc
issues the ``input_mix`` load beside the ``base`` load, so every thread's first global load
waited for the division.  tile_kernels compiles ``mhc`` in (a constant modulo).

What changes: the stream index is ``e & (mhc - 1)`` when ``mhc`` is a power of two (1, 2, 4, 8:
a uniform branch on the run-time value), else a 32-bit unsigned ``e % mhc`` (``e >= 0``, so the
same value); the ``input_mix`` load needs neither.  128 threads per block (tile_kernels' block:
128 blocks at 4096 tokens, mhc 4).  The reciprocal of ``sigmoid`` takes nvcc's fast path
branch-free with one rare fix-up (see ``pre_split_mixes_fwd_candidate.py``): the correctly
rounded ``1 / d`` for every input, as the current kernel stores.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .pre_split_mixes_fwd_candidate import _rcp_approx, _rcp_refine, _rcp_slow

THREADS = 128


def head_compute_mix_fwd_candidate():
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
            j = T.alloc_var("int32")
            v = T.alloc_var("float32")
            d = T.alloc_var("float32")
            y = T.alloc_var("float32")
            e = bx * THREADS + tid
            if e < num_tokens * mhc:
                v = T.Tensor((num_tokens * mhc,), "float32", input_mix.data)[e]
                if T.bitwise_and(mhc, mhc - 1) == 0:
                    j = T.bitwise_and(e, mhc - 1)
                else:
                    j = T.Cast("int32", T.truncmod(T.Cast("uint32", e), T.Cast("uint32", mhc)))
                d = T.float32(1) + T.exp(T.float32(0) - T.ieee_fmaf(v, scale[0], base[j]))
                y = _rcp_approx(d)
                y = _rcp_refine(d, y)
                if _rcp_slow(d) != 0:
                    y = T.float32(1) / d
                T.Tensor((num_tokens * mhc,), "float32", output_mix.data)[e] = y + pre_eps

    return main


KERNELS = (
    KernelDecl(
        name="mhc._head_compute_mix_fwd_candidate",
        factory=head_compute_mix_fwd_candidate,
        grid=({},),
        outputs=("output_mix",),
        align=4,
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded
        doc="candidate mhc.head_compute_mix_fwd (internal): no run-time division before the loads.",
    ),
)

__all__ = ["KERNELS", "THREADS", "head_compute_mix_fwd_candidate"]
