"""``mhc._pre_split_mixes_fwd_candidate``: ``mhc.pre_split_mixes_fwd`` (``pre_split_mixes.py``)
with the same parameters, variants (``mhc_mult`` 2, 4, 8) and output bits, issued differently
(internal: the op launches it when ``TILEBIN_CANDIDATE_MHC_PRE_SPLIT_MIXES_FWD=1``).

Why (issue 9; SASS of the current kernel, M = 4, nvcc 13.0): every thread runs its 2M sigmoids
one after another.  ``1 / (1 + expf(-z))`` is an IEEE division; nvcc emits it as a range test,
a branch to a slow-path subroutine and the fast path (``MUFU.RCP`` + two ``FFMA``), fenced by
``BSSY``/``BSYNC``, so no part of sigmoid ``c + 1`` starts before sigmoid ``c`` has ended: ~8
dependent chains of ~110 cycles after the loads land.  And 128 tokens per block put 4 warps of
uncoalesced 96-byte rows (6 ``LDG.128`` of 24 cache lines each) on each of only 32 SMs at 4096
tokens.  tile_kernels runs one warp of 32 tokens per block (128 blocks).

What changes (nothing else does):

* 32 tokens per block (one warp; 128 blocks at 4096 tokens, as tile_kernels);
* the comb rows are stored right after ``z`` is computed, before the sigmoids (stored last, their
  ``M * M`` products/sums and address setup trailed the sigmoids: nvcc keeps them on their side
  of a branch);
* the reciprocal: for every ``d = 1 + expf(0 - z)`` the thread computes nvcc's own fast path
  branch-free, so the 2M chains interleave: ``r = rcp.approx(d)`` (``MUFU.RCP``), then
  ``fma(r, fma(-d, r, 1), r)`` (``fma(-d, r, 1)`` is the negation of nvcc's ``fma(d, r, -1)``:
  round-to-nearest is symmetric); then ONE test per thread of nvcc's fast-path condition
  (``(bits(d) + 0x01800000) & 0x7f800000 > 0x01ffffff``) over its 2M values; a thread with any
  value outside it (``z`` below about -87, inf or NaN) recomputes all 2M with the plain ``1 /
  d``.  Each result is the correctly rounded ``1 / d`` the current kernel stores, for every input.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 32  # tokens per block: one warp
MULTS = (4, 2, 8)


def _vw(count: int) -> int:
    """fp32 per vector access of a row of ``count`` (16 bytes where possible)."""
    return 4 if count % 4 == 0 else count


def _seg(c, m: int):
    """The segment of column ``c`` (0 pre, 1 post, 2 comb): a constant once the loop is unrolled."""
    return T.min(c // m, 2)


def _fma(a, b, c):
    return T.call_extern("float32", "__fmaf_rn", a, b, c)


def _rcp_approx(d):
    """``rcp.approx.ftz.f32`` (one ``MUFU.RCP``; an asm statement: bind it once, it is not merged)."""
    return T.call_extern("float32", "tl::fast_rcp", d)


def _rcp_refine(d, r):
    """nvcc's fast path of the correctly rounded ``1 / d`` from ``r = _rcp_approx(d)``: exact
    unless ``_rcp_slow(d)``."""
    return _fma(r, _fma(-d, r, T.float32(1)), r)


def _rcp_slow(d):
    """1 where nvcc's ``1 / d`` leaves its fast path (``d`` huge, tiny, inf or NaN), else 0."""
    bits = T.reinterpret(d, "uint32")
    return T.Cast("int32", ((bits + T.uint32(0x01800000)) & T.uint32(0x7F800000)) <= T.uint32(0x01FFFFFF))


def pre_split_mixes_fwd_candidate(mhc_mult: int):
    m = mhc_mult
    mm, k3 = m * m, m * (m + 2)
    vm, vk = _vw(m), _vw(k3)
    n = T.dynamic("num_tokens")

    @T.prim_func
    def main(
        input_mixes: T.Tensor((n, k3), "float32"),
        scale: T.Tensor((3,), "float32"),
        base: T.Tensor((k3,), "float32"),
        pre: T.Tensor((n, m), "float32"),
        post: T.Tensor((n, m), "float32"),
        comb: T.Tensor((n, m, m), "float32"),
        post_mult_value: T.float32,
        pre_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            x = T.alloc_local((k3,), "float32")
            b = T.alloc_local((k3,), "float32")
            sc = T.alloc_local((3,), "float32")
            den = T.alloc_local((2 * m,), "float32")
            slow = T.alloc_var("int32")
            if bx * THREADS + tid < n:
                for c in T.unroll(k3 // vk):
                    for i in T.vectorized(vk):
                        x[c * vk + i] = input_mixes[bx * THREADS + tid, c * vk + i]
                for c in T.unroll(k3 // vk):
                    for i in T.vectorized(vk):
                        b[c * vk + i] = base[c * vk + i]
                for i in T.unroll(3):
                    sc[i] = scale[i]
                for c in T.unroll(k3):
                    x[c] = T.ieee_add(T.ieee_mul(x[c], sc[_seg(c, m)]), b[c])
                for c in T.unroll(mm // 4):
                    for i in T.vectorized(4):
                        T.Tensor((n, mm), "float32", comb.data)[bx * THREADS + tid, c * 4 + i] = x[2 * m + c * 4 + i]
                slow = 0
                for c in T.unroll(2 * m):
                    den[c] = T.float32(1) + T.exp(T.float32(0) - x[c])
                    x[c] = _rcp_approx(den[c])
                    x[c] = _rcp_refine(den[c], x[c])
                    slow = slow | _rcp_slow(den[c])
                if slow != 0:
                    for c in T.unroll(2 * m):
                        x[c] = T.float32(1) / den[c]
                for c in T.unroll(m):
                    x[c] = x[c] + pre_eps
                    x[m + c] = x[m + c] * post_mult_value
                for c in T.unroll(m // vm):
                    for i in T.vectorized(vm):
                        pre[bx * THREADS + tid, c * vm + i] = x[c * vm + i]
                for c in T.unroll(m // vm):
                    for i in T.vectorized(vm):
                        post[bx * THREADS + tid, c * vm + i] = x[m + c * vm + i]

    return main


KERNELS = (
    KernelDecl(
        name="mhc._pre_split_mixes_fwd_candidate",
        factory=pre_split_mixes_fwd_candidate,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=("pre", "post", "comb"),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded by the token check
        doc="candidate mhc.pre_split_mixes_fwd (internal): one warp per block, interleaved sigmoids.",
    ),
)

__all__ = ["KERNELS", "MULTS", "THREADS", "pre_split_mixes_fwd_candidate"]
