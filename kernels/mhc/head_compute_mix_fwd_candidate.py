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

What changes: no division at all.  A thread takes (token ``t``, stream ``j``) with ``j = tid %
8`` and ``t = bx * 16 + tid / 8`` (compile-time divisors: a mask and a shift), so its element
``e = t * mhc + j`` and both loads' addresses are ready a few instructions after launch; lanes
with ``j >= mhc`` idle (a warp reads 4 tokens' ``4 * mhc`` contiguous floats).  128 threads per
block, ``ceil(num_tokens / 16)`` blocks (256 at 4096 tokens).  The reciprocal of ``sigmoid``
takes nvcc's fast path branch-free with one rare fix-up (see ``pre_split_mixes_fwd_candidate.py``):
the correctly rounded ``1 / d`` for every input, as the current kernel stores.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .pre_split_mixes_fwd_candidate import _rcp_approx, _rcp_refine, _rcp_slow

THREADS = 128
MAX_MHC = 8  # lanes per token (mhc_mult 1 to 8; lanes past mhc_mult idle)
TOKENS = THREADS // MAX_MHC  # tokens per block


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
        with T.Kernel(T.ceildiv(num_tokens, TOKENS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            e = T.alloc_var("int32")
            d = T.alloc_var("float32")
            y = T.alloc_var("float32")
            if tid % MAX_MHC < mhc and bx * TOKENS + tid // MAX_MHC < num_tokens:
                e = (bx * TOKENS + tid // MAX_MHC) * mhc + tid % MAX_MHC
                d = T.float32(1) + T.exp(T.float32(0) - T.ieee_fmaf(
                    T.Tensor((num_tokens * mhc,), "float32", input_mix.data)[e], scale[0], base[tid % MAX_MHC]))
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
        doc="candidate mhc.head_compute_mix_fwd (internal): 8 lanes per token, no run-time division.",
    ),
)

__all__ = ["KERNELS", "MAX_MHC", "THREADS", "TOKENS", "head_compute_mix_fwd_candidate"]
