"""``mhc._pre_split_mixes_fwd_candidate``: ``mhc.pre_split_mixes_fwd`` (``pre_split_mixes.py``) with one
thread per (token, group of ``G`` columns) instead of one per token; same parameters, same
per-element expressions, so the same bits (internal: the op launches it when
``TILEBIN_CANDIDATE_PRE_SPLIT_MIXES=1``).

Why: at 4096 tokens the forward runs 32 blocks of 128 threads (one per token, each loading its
96-byte row in six 16-byte pieces); the kernel is latency-bound (3.8 µs vs tile_kernels' 3.5 µs
with 128 blocks).  Here ``G = 4`` fp32 (``M`` for ``M = 2``) columns per thread, ``K / G`` threads
per token (6 at M = 4: 192 blocks at 4096 tokens), thread ``i`` takes token ``i // (K / G)`` and
group ``i % (K / G)`` (a constant divisor): one coalesced 16-byte load of the mixes and of
``base``, one 16-byte store into ``pre``, ``post`` or ``comb`` (a group never straddles two of
them: ``G`` divides ``M``).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
MULTS = (4, 2, 8)


def pre_split_mixes_fwd_candidate(mhc_mult: int):
    m = mhc_mult
    mm, k3 = m * m, m * (m + 2)
    G = 4 if m % 4 == 0 else m  # fp32 per thread: one 16-byte (8-byte at M = 2) vector
    ng = k3 // G  # groups per token
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
        with T.Kernel(T.ceildiv(n * ng, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            x = T.alloc_local((G,), "float32")
            b = T.alloc_local((G,), "float32")
            y = T.alloc_local((G,), "float32")
            sc = T.alloc_var("float32")
            if bx * THREADS + tid < n * ng:
                for i in T.vectorized(G):
                    x[i] = T.Tensor((n * ng, G), "float32", input_mixes.data)[bx * THREADS + tid, i]
                for i in T.vectorized(G):
                    b[i] = T.Tensor((ng, G), "float32", base.data)[(bx * THREADS + tid) % ng, i]
                sc = scale[T.min((bx * THREADS + tid) % ng * G // m, 2)]
                for i in T.unroll(G):
                    x[i] = T.ieee_add(T.ieee_mul(x[i], sc), b[i])
                if (bx * THREADS + tid) % ng * G < m:
                    for i in T.unroll(G):
                        y[i] = T.sigmoid(x[i]) + pre_eps
                    for i in T.vectorized(G):
                        T.Tensor((n * (m // G), G), "float32", pre.data)[
                            (bx * THREADS + tid) // ng * (m // G) + (bx * THREADS + tid) % ng, i] = y[i]
                elif (bx * THREADS + tid) % ng * G < 2 * m:
                    for i in T.unroll(G):
                        y[i] = T.sigmoid(x[i]) * post_mult_value
                    for i in T.vectorized(G):
                        T.Tensor((n * (m // G), G), "float32", post.data)[
                            (bx * THREADS + tid) // ng * (m // G) + (bx * THREADS + tid) % ng - m // G, i] = y[i]
                else:
                    for i in T.vectorized(G):
                        T.Tensor((n * (mm // G), G), "float32", comb.data)[
                            (bx * THREADS + tid) // ng * (mm // G) + (bx * THREADS + tid) % ng - 2 * m // G, i] = x[i]

    return main


KERNELS = (
    KernelDecl(
        name="mhc._pre_split_mixes_fwd_candidate",
        factory=pre_split_mixes_fwd_candidate,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=("pre", "post", "comb"),
        doc="candidate mhc.pre_split_mixes_fwd (internal): one thread per (token, 4 mixes).",
    ),
)

__all__ = ["KERNELS", "MULTS", "pre_split_mixes_fwd_candidate"]
