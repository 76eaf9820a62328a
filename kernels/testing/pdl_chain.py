"""``testing.pdl_chain(x, y, z)``: ``y = x + 1`` then ``z = y * 2``, two launches chained by PDL.

x, y, z are ``[n]`` float32 (n a runtime symbol; n = 0 gives empty grids, which the
launcher must skip).  One PrimFunc with two ``T.Kernel`` scopes lowers to two device
functions, launched in order on one stream:

1. ``main_kernel``: ``y = x + 1``, then ``T.pdl_trigger()`` (``griddepcontrol.
   launch_dependents``: the next grid may start early); marked ``has_cuda_pdl_trigger``.
2. ``main_kernel_1``: ``T.pdl_sync()`` (``griddepcontrol.wait``: block until the first
   grid has finished and its writes are visible), then ``z = y * 2``; marked
   ``has_cuda_pdl_sync``, so it is launched with
   ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``.

It exists to prove the multi-launch and PDL paths of the manifest end to end.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.

import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256


def pdl_chain():
    """Build the PrimFunc (no compile-time parameters)."""
    n = T.dynamic("n")

    @T.prim_func
    def main(
        x: T.Tensor((n,), "float32"),
        y: T.Tensor((n,), "float32"),
        z: T.Tensor((n,), "float32"),
    ):
        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            if bx * THREADS + tid < n:
                y[bx * THREADS + tid] = x[bx * THREADS + tid] + T.float32(1)
            T.pdl_trigger()
        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            T.pdl_sync()
            if bx * THREADS + tid < n:
                z[bx * THREADS + tid] = y[bx * THREADS + tid] * T.float32(2)

    return main


KERNELS = (
    KernelDecl(
        name="testing.pdl_chain",
        factory=pdl_chain,
        grid=({},),
        outputs=("y", "z"),
        doc="y = x + 1, then (after griddepcontrol.wait) z = y * 2; two launches chained by PDL.",
    ),
)

__all__ = ["KERNELS", "pdl_chain"]
