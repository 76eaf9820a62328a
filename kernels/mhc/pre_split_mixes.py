"""``mhc.pre_split_mixes_fwd`` / ``mhc.pre_split_mixes_bwd``: split the mixes vector into the
pre, post and comb mixes (tile_kernels 1.0.0 ``mhc_pre_split_mixes``).

Per token, with ``M = mhc_mult``, ``K = M * (M + 2)`` columns ``x`` of ``input_mixes``, segment
``seg(c)`` = 0 for ``c < M``, 1 for ``c < 2M``, else 2, and ``z[c] = x[c] * scale[seg(c)] +
base[c]`` (product and sum rounded apart, as torch does)::

    pre[c]      = sigmoid(z[c]) + pre_eps              c < M
    post[c - M] = sigmoid(z[c]) * post_mult_value      M <= c < 2M
    comb[c - 2M] = z[c]                                2M <= c     (row-major [M, M])

Forward ``(input_mixes, scale, base, pre, post, comb, post_mult_value, pre_eps)``: fp32,
``input_mixes [n, K]``, ``scale [3]``, ``base [K]``, ``pre``/``post [n, M]``, ``comb [n, M, M]``.

Backward ``(grad_pre, grad_post, grad_comb, input_mixes, scale, base, grad_mixes, partial,
post_mult_value)``: ``dz = grad_pre * s * (1 - s)``, ``grad_post * post_mult_value * s * (1 - s)``
or ``grad_comb`` (``s`` the sigmoid recomputed from ``z``); ``grad_mixes = dz * scale[seg]``;
block ``b`` writes ``partial[b, :K]`` = its tokens' sum of ``dz`` (the base gradient) and
``partial[b, K + i]`` = its sum of ``dz * x`` over segment ``i`` (the scale gradient); the caller
sums ``partial`` over blocks.  ``partial`` has one row per block: the grid is its row count,
each block strides over the tokens (deterministic: every sum has a fixed order).

Forward design: one thread per token, ``FWD_THREADS`` = 32 tokens per block (one warp; 128
blocks at 4096 tokens, as tile_kernels); the row of K fp32 in registers, 16-byte vector
accesses; the comb rows are stored right after ``z`` is computed, before the sigmoids.  The
sigmoid's ``1 / d`` (``d = 1 + expf(0 - z)``, an IEEE division) is computed as nvcc's own fast
path, branch-free, so a thread's 2M reciprocal chains interleave: ``r = rcp.approx(d)``
(``MUFU.RCP``), then ``fma(r, fma(-d, r, 1), r)`` (``fma(-d, r, 1)`` is the negation of nvcc's
``fma(d, r, -1)``: round-to-nearest is symmetric); then ONE test per thread of nvcc's fast-path
condition (``(bits(d) + 0x01800000) & 0x7f800000 > 0x01ffffff``) over its 2M values; a thread
with any value outside it (``z`` below about -87, inf or NaN) recomputes all 2M with the plain
``1 / d``.  Each result is the correctly rounded ``1 / d`` for every input.  (nvcc's own
``1 / d`` is a range test and a branch to a slow-path subroutine fenced by ``BSSY``/``BSYNC``:
no sigmoid could start before the previous one ended.)
H200, one run (fwd µs, previous kernel / this / tile_kernels; tokens x hidden): 4096x4096 4.7/4.0/4.3,
4096x7168 4.7/4.1/4.4, 8192x4096 4.8/4.2/4.5, 8192x7168 4.7/4.3/4.6.

Backward design: one thread per token, ``THREADS`` = 128 tokens per block, the row of K fp32 in
registers (16-byte vector accesses).  Both directions: a compile-time ``mhc_mult`` (register
arrays), every token count, ``post_mult_value`` and ``pre_eps`` at run time.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

FWD_THREADS = 32  # tokens per forward block: one warp
THREADS = 128  # tokens per backward block
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


def pre_split_mixes_fwd(mhc_mult: int):
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
        with T.Kernel(T.ceildiv(n, FWD_THREADS), threads=FWD_THREADS) as bx:
            tid = T.get_thread_binding()
            x = T.alloc_local((k3,), "float32")
            b = T.alloc_local((k3,), "float32")
            sc = T.alloc_local((3,), "float32")
            den = T.alloc_local((2 * m,), "float32")
            slow = T.alloc_var("int32")
            if bx * FWD_THREADS + tid < n:
                for c in T.unroll(k3 // vk):
                    for i in T.vectorized(vk):
                        x[c * vk + i] = input_mixes[bx * FWD_THREADS + tid, c * vk + i]
                for c in T.unroll(k3 // vk):
                    for i in T.vectorized(vk):
                        b[c * vk + i] = base[c * vk + i]
                for i in T.unroll(3):
                    sc[i] = scale[i]
                for c in T.unroll(k3):
                    x[c] = T.ieee_add(T.ieee_mul(x[c], sc[_seg(c, m)]), b[c])
                for c in T.unroll(mm // 4):
                    for i in T.vectorized(4):
                        T.Tensor((n, mm), "float32", comb.data)[bx * FWD_THREADS + tid, c * 4 + i] = x[2 * m + c * 4 + i]
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
                        pre[bx * FWD_THREADS + tid, c * vm + i] = x[c * vm + i]
                for c in T.unroll(m // vm):
                    for i in T.vectorized(vm):
                        post[bx * FWD_THREADS + tid, c * vm + i] = x[m + c * vm + i]

    return main


def pre_split_mixes_bwd(mhc_mult: int):
    m = mhc_mult
    mm, k3 = m * m, m * (m + 2)
    vm, vk = _vw(m), _vw(k3)
    n = T.dynamic("num_tokens")
    nb = T.dynamic("num_blocks")
    width = k3 + 3  # a partial row: K base sums, then 3 scale sums

    @T.prim_func
    def main(
        grad_pre: T.Tensor((n, m), "float32"),
        grad_post: T.Tensor((n, m), "float32"),
        grad_comb: T.Tensor((n, m, m), "float32"),
        input_mixes: T.Tensor((n, k3), "float32"),
        scale: T.Tensor((3,), "float32"),
        base: T.Tensor((k3,), "float32"),
        grad_mixes: T.Tensor((n, k3), "float32"),
        partial: T.Tensor((nb, width), "float32"),
        post_mult_value: T.float32,
    ):
        with T.Kernel(nb, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            x = T.alloc_local((k3,), "float32")
            g = T.alloc_local((k3,), "float32")
            b = T.alloc_local((k3,), "float32")
            sc = T.alloc_local((3,), "float32")
            acc = T.alloc_local((width,), "float32")
            red = T.alloc_shared((THREADS, width), "float32")
            sg = T.alloc_var("float32")
            for c in T.unroll(k3 // vk):
                for i in T.vectorized(vk):
                    b[c * vk + i] = base[c * vk + i]
            for i in T.unroll(3):
                sc[i] = scale[i]
            for c in T.unroll(width):
                acc[c] = T.float32(0)
            for it in T.serial(T.ceildiv(n, nb * THREADS)):
                if (it * nb + bx) * THREADS + tid < n:
                    for c in T.unroll(k3 // vk):
                        for i in T.vectorized(vk):
                            x[c * vk + i] = input_mixes[(it * nb + bx) * THREADS + tid, c * vk + i]
                    for c in T.unroll(m // vm):
                        for i in T.vectorized(vm):
                            g[c * vm + i] = grad_pre[(it * nb + bx) * THREADS + tid, c * vm + i]
                    for c in T.unroll(m // vm):
                        for i in T.vectorized(vm):
                            g[m + c * vm + i] = grad_post[(it * nb + bx) * THREADS + tid, c * vm + i]
                    for c in T.unroll(mm // 4):
                        for i in T.vectorized(4):
                            g[2 * m + c * 4 + i] = T.Tensor((n, mm), "float32", grad_comb.data)[
                                (it * nb + bx) * THREADS + tid, c * 4 + i]
                    for c in T.unroll(m):
                        sg = T.sigmoid(T.ieee_add(T.ieee_mul(x[c], sc[0]), b[c]))
                        g[c] = g[c] * (sg * (T.float32(1) - sg))
                        sg = T.sigmoid(T.ieee_add(T.ieee_mul(x[m + c], sc[1]), b[m + c]))
                        g[m + c] = (g[m + c] * post_mult_value) * (sg * (T.float32(1) - sg))
                    for c in T.unroll(k3):
                        acc[c] = acc[c] + g[c]
                        acc[k3 + _seg(c, m)] = acc[k3 + _seg(c, m)] + g[c] * x[c]
                        g[c] = g[c] * sc[_seg(c, m)]
                    for c in T.unroll(k3 // vk):
                        for i in T.vectorized(vk):
                            grad_mixes[(it * nb + bx) * THREADS + tid, c * vk + i] = g[c * vk + i]
            for c in T.unroll(width):
                red[tid, c] = acc[c]
            T.sync_threads()
            if tid < width:
                sg = red[0, tid]
                for r in T.serial(THREADS - 1):
                    sg = sg + red[r + 1, tid]
                partial[bx, tid] = sg

    return main


KERNELS = (
    KernelDecl(
        name="mhc.pre_split_mixes_fwd",
        factory=pre_split_mixes_fwd,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=("pre", "post", "comb"),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded by the token check
        doc="pre = sigmoid(z) + pre_eps, post = sigmoid(z) * post_mult_value, comb = z; z = mixes * scale + base "
            "(one warp per block, interleaved sigmoids).",
    ),
    KernelDecl(
        name="mhc.pre_split_mixes_bwd",
        factory=pre_split_mixes_bwd,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=("grad_mixes", "partial"),
        pass_configs={"tl.disable_safe_memory_legalize": True},
        doc="grad of the split: grad_mixes, and per-block partial sums of the base and scale gradients.",
    ),
)

__all__ = ["FWD_THREADS", "KERNELS", "MULTS", "THREADS", "pre_split_mixes_bwd", "pre_split_mixes_fwd"]
