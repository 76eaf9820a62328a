"""``testing.gemm_nt(a, b, c)``: ``c = a @ b.T`` in bf16 with fp32 accumulation.

a is ``[m, k]``, b is ``[n, k]``, c is ``[m, n]``, all bfloat16 and contiguous.  m is a
runtime symbol (0, 1, odd and large are all valid; m = 0 gives an empty grid, which the
launcher must skip, and before building any tensor map); n and k are compile-time, one
variant per ``(n, k)`` pair.

Design: the textbook Hopper tile GEMM.  Each block computes a ``128 x 128`` tile of c
over ``k / 64`` steps of a 3-stage ``T.Pipelined`` loop.  TileLang lowers the global ->
shared copies to TMA loads (one tensor map each for a and b, 128-byte swizzle, completion
on mbarriers), warp-specializes the block (one producer warpgroup issuing TMA, two
consumer warpgroups issuing ``wgmma`` 64xNx16), and writes c through shared memory with
a TMA store.  The rows of a and c past m are handled by TMA itself (loads fill zeros,
stores are clipped), so there is no bounds code.  Shared memory: 3 stages x (16 KB of a
+ 16 KB of b) = 96 KB dynamic (the c staging tile reuses the a stages), above the 48 KB
default, so the launcher must raise ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``.
Grid: ``(n / 128, ceil(m / 128))``; blocks along x share one row panel of a.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.

import tilelang.language as T

from .._declare import KernelDecl

BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 64
STAGES = 3
THREADS = 256  # the two consumer warpgroups; TileLang adds a producer warpgroup


def gemm_nt(n: int, k: int):
    """Build the PrimFunc for static ``n`` and ``k`` (both multiples of 128 and 64)."""
    if n % BLOCK_N or k % BLOCK_K:
        raise ValueError(f"gemm_nt: n must be a multiple of {BLOCK_N} and k of {BLOCK_K} (got n={n}, k={k})")
    m = T.dynamic("m")

    @T.prim_func
    def main(
        a: T.Tensor((m, k), "bfloat16"),
        b: T.Tensor((n, k), "bfloat16"),
        c: T.Tensor((m, n), "bfloat16"),
    ):
        with T.Kernel(n // BLOCK_N, T.ceildiv(m, BLOCK_M), threads=THREADS) as (bx, by):
            a_s = T.alloc_shared((BLOCK_M, BLOCK_K), "bfloat16")
            b_s = T.alloc_shared((BLOCK_N, BLOCK_K), "bfloat16")
            c_s = T.alloc_shared((BLOCK_M, BLOCK_N), "bfloat16")
            acc = T.alloc_fragment((BLOCK_M, BLOCK_N), "float32")
            T.clear(acc)
            for ko in T.Pipelined(k // BLOCK_K, num_stages=STAGES):
                T.copy(a[by * BLOCK_M, ko * BLOCK_K], a_s)
                T.copy(b[bx * BLOCK_N, ko * BLOCK_K], b_s)
                T.gemm(a_s, b_s, acc, transpose_B=True)
            T.copy(acc, c_s)
            T.copy(c_s, c[by * BLOCK_M, bx * BLOCK_N])

    return main


KERNELS = (
    KernelDecl(
        name="testing.gemm_nt",
        factory=gemm_nt,
        grid=({"n": 1024, "k": 1024}, {"n": 4096, "k": 7168}),
        outputs=("c",),
        doc="c = a @ b.T; a [m, k], b [n, k], c [m, n], bfloat16, fp32 accumulation.",
    ),
)

__all__ = ["KERNELS", "gemm_nt"]
