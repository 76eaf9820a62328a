"""``testing.coop_sum(x, partials, out)``: ``out[0] = sum(x)``, a cooperative-launch test kernel.

x is ``[n]`` float32 (n a runtime symbol, 0 allowed: the grid is fixed, so the kernel
still runs and writes 0), partials is an ``[8]`` float32 workspace (written, then read,
by the kernel; its contents on entry do not matter), out is ``[1]`` float32.

It exists to prove the cooperative path end to end: ``T.sync_grid()`` lowers to
``cooperative_groups::this_grid().sync()`` and marks the device function
``use_cooperative_groups``, so it must be launched with
``CU_LAUNCH_ATTRIBUTE_COOPERATIVE`` (all 8 blocks resident at once).

Each of the 8 blocks x 256 threads sums a grid-strided slice of x, reduces it across the
block (warp shuffles, then one value per warp through shared memory) and writes
``partials[block]``; after the grid barrier, thread 0 of block 0 adds the 8 partials in
order.  The order of additions is fixed, so the result is deterministic, but it is not
torch's order: compare with a float tolerance.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.

import tilelang.language as T

from .._declare import KernelDecl

BLOCKS = 8
THREADS = 256
WARPS = THREADS // 32


def coop_sum():
    """Build the PrimFunc (no compile-time parameters)."""
    n = T.dynamic("n")

    @T.prim_func
    def main(
        x: T.Tensor((n,), "float32"),
        partials: T.Tensor((BLOCKS,), "float32"),
        out: T.Tensor((1,), "float32"),
    ):
        with T.Kernel(BLOCKS, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            acc = T.alloc_local((1,), "float32")
            warp_sums = T.alloc_shared((WARPS,), "float32")
            acc[0] = T.float32(0)
            for it in T.serial(T.ceildiv(n, BLOCKS * THREADS)):
                idx = it * (BLOCKS * THREADS) + bx * THREADS + tid
                if idx < n:
                    acc[0] = acc[0] + x[idx]
            acc[0] = T.warp_reduce_sum(acc[0])
            if tid % 32 == 0:
                warp_sums[tid // 32] = acc[0]
            T.sync_threads()
            if tid == 0:
                acc[0] = T.float32(0)
                for w in T.serial(WARPS):
                    acc[0] = acc[0] + warp_sums[w]
                partials[bx] = acc[0]
            T.sync_grid()
            if bx == 0 and tid == 0:
                acc[0] = T.float32(0)
                for i in T.serial(BLOCKS):
                    acc[0] = acc[0] + partials[i]
                out[0] = acc[0]

    return main


KERNELS = (
    KernelDecl(
        name="testing.coop_sum",
        factory=coop_sum,
        grid=({},),
        outputs=("partials", "out"),
        doc="out[0] = sum(x); partials [8] float32 is a workspace. Cooperative launch.",
    ),
)

__all__ = ["KERNELS", "coop_sum"]
