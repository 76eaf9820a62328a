"""``mhc.sinkhorn_fwd`` / ``mhc.sinkhorn_bwd``: Sinkhorn normalisation of ``[M, M]`` fp32 matrices.

Semantics (tile_kernels 1.0.0 ``sinkhorn_normalize``), per matrix ``x`` with ``repeat >= 1`` and
``eps`` both run-time values::

    P = softmax(x, rows) + eps                  (row max subtracted before exp)
    P = P / (column sums of P + eps)            step 0
    repeat - 1 times:
        P = P / (row sums of P + eps)           odd steps
        P = P / (column sums of P + eps)        even steps

i.e. ``2 * repeat - 1`` normalisation steps after the softmax.  Sums run in index order
(fp32); a step divides once per row or column (IEEE ``1 / (sum + eps)``, no fast math) and
multiplies the elements by it (one more rounding than a division per element: well inside fp32
accuracy, and M times fewer divisions).  The forward's operations are ``_sinkhorn_math``'s IEEE
expression builders (no FMA contraction), shared with ``mhc.pre_big_fuse``, which must match
``mhc.sinkhorn_fwd`` bit for bit.

Forward ``(x, out, repeat, eps)``: x and out fp32 ``[num_tokens, M, M]`` contiguous.

Backward ``(grad_out, x, grad_in, work, eps)``: work is fp32 ``[steps, num_tokens, M]`` scratch
with ``steps = 2 * repeat - 1`` (the step count comes from its shape).  The kernel reruns the
forward, keeping only each step's divisor sums in ``work`` (M floats per step instead of the
M * M intermediates), then walks the steps backwards: with ``Q`` the step's output,
``d = sum + eps`` and ``g`` the incoming gradient, a step's input gradient is
``(g - sum(g * Q)) * (1 / d)`` (sums along the normalised axis) and its input is ``Q * d``, so
the intermediates are rebuilt from the final matrix on the way back (the next step's sums are
loaded while a step is undone).  The softmax's gradient uses
the softmax recomputed from ``x`` (``(g - sum_row(g * S)) * S``).

Design: one thread per matrix (``M * M`` fp32 in registers, 16-byte vector loads and stores),
``THREADS`` matrices per block; one cubin per ``mhc_mult`` serves every token count, repeat and
eps.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from . import _sinkhorn_math as sm

THREADS = 64
MULTS = (4, 2, 8)  # mhc_mult variants (4 first: the production size)


def _vec(m: int) -> int:
    """fp32 per vector access: 4 (16 bytes) where the row allows it."""
    return 4 if (m * m) % 4 == 0 else m * m


def sinkhorn_fwd(mhc_mult: int):
    m = mhc_mult
    mm = m * m
    v = _vec(m)
    n = T.dynamic("num_tokens")

    @T.prim_func
    def main(
        x: T.Tensor((n, m, m), "float32"),
        out: T.Tensor((n, m, m), "float32"),
        repeat: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            p = T.alloc_local((mm,), "float32")
            s = T.alloc_local((m,), "float32")
            q = T.alloc_local((m,), "float32")  # 1 / (sum + eps): one division per row or column
            if bx * THREADS + tid < n:
                for c in T.unroll(mm // v):
                    for i in T.vectorized(v):
                        p[c * v + i] = T.Tensor((n, mm), "float32", x.data)[bx * THREADS + tid, c * v + i]
                # softmax along each row, then + eps
                for r in T.unroll(m):
                    s[r] = p[r * m]
                    for j in T.unroll(m - 1):
                        s[r] = T.max(s[r], p[r * m + j + 1])
                for r in T.unroll(m):
                    for j in T.unroll(m):
                        p[r * m + j] = sm.shifted_exp(p[r * m + j], s[r])
                for r in T.unroll(m):
                    s[r] = p[r * m]
                    for j in T.unroll(m - 1):
                        s[r] = sm.add(s[r], p[r * m + j + 1])
                for r in T.unroll(m):
                    for j in T.unroll(m):
                        p[r * m + j] = sm.softmax_plus_eps(p[r * m + j], s[r], eps)
                for k in T.serial(2 * repeat - 1):
                    if k % 2 == 0:  # columns
                        for j in T.unroll(m):
                            s[j] = p[j]
                            for r in T.unroll(m - 1):
                                s[j] = sm.add(s[j], p[(r + 1) * m + j])
                        for j in T.unroll(m):
                            q[j] = sm.inv_sum(s[j], eps)
                        for r in T.unroll(m):
                            for j in T.unroll(m):
                                p[r * m + j] = sm.scaled(p[r * m + j], q[j])
                    else:  # rows
                        for r in T.unroll(m):
                            s[r] = p[r * m]
                            for j in T.unroll(m - 1):
                                s[r] = sm.add(s[r], p[r * m + j + 1])
                        for r in T.unroll(m):
                            q[r] = sm.inv_sum(s[r], eps)
                        for r in T.unroll(m):
                            for j in T.unroll(m):
                                p[r * m + j] = sm.scaled(p[r * m + j], q[r])
                for c in T.unroll(mm // v):
                    for i in T.vectorized(v):
                        T.Tensor((n, mm), "float32", out.data)[bx * THREADS + tid, c * v + i] = p[c * v + i]

    return main


def sinkhorn_bwd(mhc_mult: int):
    m = mhc_mult
    mm = m * m
    v = _vec(m)
    vs = min(m, 4)  # fp32 per vector access of a step's sums
    n = T.dynamic("num_tokens")
    steps = T.dynamic("steps")

    @T.prim_func
    def main(
        grad_out: T.Tensor((n, m, m), "float32"),
        x: T.Tensor((n, m, m), "float32"),
        grad_in: T.Tensor((n, m, m), "float32"),
        work: T.Tensor((steps, n, m), "float32"),
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            p = T.alloc_local((mm,), "float32")
            g = T.alloc_local((mm,), "float32")
            s = T.alloc_local((m,), "float32")
            q = T.alloc_local((m,), "float32")  # 1 / (sum + eps): one division per row or column
            d = T.alloc_local((m,), "float32")  # sum + eps of the step being undone
            e = T.alloc_local((m,), "float32")  # its reciprocal
            if bx * THREADS + tid < n:
                # ---- forward again, keeping every step's sums
                for c in T.unroll(mm // v):
                    for i in T.vectorized(v):
                        p[c * v + i] = T.Tensor((n, mm), "float32", x.data)[bx * THREADS + tid, c * v + i]
                for r in T.unroll(m):
                    s[r] = p[r * m]
                    for j in T.unroll(m - 1):
                        s[r] = T.max(s[r], p[r * m + j + 1])
                for r in T.unroll(m):
                    for j in T.unroll(m):
                        p[r * m + j] = sm.shifted_exp(p[r * m + j], s[r])
                for r in T.unroll(m):
                    s[r] = p[r * m]
                    for j in T.unroll(m - 1):
                        s[r] = sm.add(s[r], p[r * m + j + 1])
                for r in T.unroll(m):
                    for j in T.unroll(m):
                        p[r * m + j] = sm.softmax_plus_eps(p[r * m + j], s[r], eps)
                for k in T.serial(steps):
                    if k % 2 == 0:
                        for j in T.unroll(m):
                            s[j] = p[j]
                            for r in T.unroll(m - 1):
                                s[j] = sm.add(s[j], p[(r + 1) * m + j])
                        for j in T.unroll(m):
                            q[j] = sm.inv_sum(s[j], eps)
                        for r in T.unroll(m):
                            for j in T.unroll(m):
                                p[r * m + j] = sm.scaled(p[r * m + j], q[j])
                    else:
                        for r in T.unroll(m):
                            s[r] = p[r * m]
                            for j in T.unroll(m - 1):
                                s[r] = sm.add(s[r], p[r * m + j + 1])
                        for r in T.unroll(m):
                            q[r] = sm.inv_sum(s[r], eps)
                        for r in T.unroll(m):
                            for j in T.unroll(m):
                                p[r * m + j] = sm.scaled(p[r * m + j], q[r])
                    for c in T.unroll(m // vs):
                        for i in T.vectorized(vs):
                            work[k, bx * THREADS + tid, c * vs + i] = s[c * vs + i]
                # ---- backward through the steps, last first
                for c in T.unroll(mm // v):
                    for i in T.vectorized(v):
                        g[c * v + i] = T.Tensor((n, mm), "float32", grad_out.data)[bx * THREADS + tid, c * v + i]
                for c in T.unroll(m // vs):
                    for i in T.vectorized(vs):
                        q[c * vs + i] = work[steps - 1, bx * THREADS + tid, c * vs + i]
                for kk in T.serial(steps):
                    for i in T.unroll(m):
                        d[i] = q[i] + eps
                    if kk + 1 < steps:  # the next step's sums: in flight during this step's math
                        for c in T.unroll(m // vs):
                            for i in T.vectorized(vs):
                                q[c * vs + i] = work[steps - 2 - kk, bx * THREADS + tid, c * vs + i]
                    for i in T.unroll(m):
                        e[i] = T.float32(1) / d[i]
                    if (steps - 1 - kk) % 2 == 0:  # a column step: sums over rows
                        for j in T.unroll(m):
                            s[j] = g[j] * p[j]
                            for r in T.unroll(m - 1):
                                s[j] = s[j] + g[(r + 1) * m + j] * p[(r + 1) * m + j]
                        for r in T.unroll(m):
                            for j in T.unroll(m):
                                g[r * m + j] = (g[r * m + j] - s[j]) * e[j]
                                p[r * m + j] = p[r * m + j] * d[j]
                    else:  # a row step
                        for r in T.unroll(m):
                            s[r] = g[r * m] * p[r * m]
                            for j in T.unroll(m - 1):
                                s[r] = s[r] + g[r * m + j + 1] * p[r * m + j + 1]
                        for r in T.unroll(m):
                            for j in T.unroll(m):
                                g[r * m + j] = (g[r * m + j] - s[r]) * e[r]
                                p[r * m + j] = p[r * m + j] * d[r]
                # ---- through the softmax, recomputed from x
                for c in T.unroll(mm // v):
                    for i in T.vectorized(v):
                        p[c * v + i] = T.Tensor((n, mm), "float32", x.data)[bx * THREADS + tid, c * v + i]
                for r in T.unroll(m):
                    s[r] = p[r * m]
                    for j in T.unroll(m - 1):
                        s[r] = T.max(s[r], p[r * m + j + 1])
                for r in T.unroll(m):
                    for j in T.unroll(m):
                        p[r * m + j] = sm.shifted_exp(p[r * m + j], s[r])
                for r in T.unroll(m):
                    s[r] = p[r * m]
                    for j in T.unroll(m - 1):
                        s[r] = sm.add(s[r], p[r * m + j + 1])
                for r in T.unroll(m):
                    for j in T.unroll(m):
                        p[r * m + j] = p[r * m + j] / s[r]
                for r in T.unroll(m):
                    s[r] = g[r * m] * p[r * m]
                    for j in T.unroll(m - 1):
                        s[r] = s[r] + g[r * m + j + 1] * p[r * m + j + 1]
                for r in T.unroll(m):
                    for j in T.unroll(m):
                        g[r * m + j] = (g[r * m + j] - s[r]) * p[r * m + j]
                for c in T.unroll(mm // v):
                    for i in T.vectorized(v):
                        T.Tensor((n, mm), "float32", grad_in.data)[bx * THREADS + tid, c * v + i] = g[c * v + i]

    return main


_PASS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded by the token check

KERNELS = (
    KernelDecl(
        name="mhc.sinkhorn_fwd",
        factory=sinkhorn_fwd,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=("out",),
        pass_configs=_PASS,
        doc="out = Sinkhorn(softmax(x) + eps): 2 * repeat - 1 column/row normalisations, [num_tokens, M, M] fp32.",
    ),
    KernelDecl(
        name="mhc.sinkhorn_bwd",
        factory=sinkhorn_bwd,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=("grad_in", "work"),
        pass_configs=_PASS,
        doc="grad_in of the Sinkhorn forward (recomputed; work holds each step's sums, steps = 2 * repeat - 1).",
    ),
)

__all__ = ["KERNELS", "MULTS", "THREADS", "sinkhorn_bwd", "sinkhorn_fwd"]
