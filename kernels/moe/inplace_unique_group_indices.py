"""``moe.inplace_unique_group_indices(group_indices)``: later repeats within a row become ``-1``, in place.

group_indices is ``[num_tokens, num_topk]`` int64 (contiguous); both extents are runtime
symbols.  Entry ``(t, j)`` is set to ``-1`` when some ``(t, m)`` with ``m < j`` held the same
value on entry; the first occurrence of every value stays.  Any value works (no bound on
the group count, negative values included), exactly like the torch reference's stable sort.

One thread per row, ``THREADS`` rows per block (no SM count: the grid covers the rows).
Each entry is compared with the entries before it, read back from memory (the row is in
L1 after its first load): ``num_topk**2 / 2`` compares per row, trivial for top-k sizes.
Reading an earlier entry that this thread has already replaced by ``-1`` is harmless: it
repeated a value that an even earlier entry still holds, and marking a repeated ``-1`` as
``-1`` changes nothing.  Only repeats are stored.  0 tokens is an empty grid.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128


def inplace_unique_group_indices():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")

    @T.prim_func
    def main(group_indices: T.Tensor((num_tokens, num_topk), "int64")):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            value = T.alloc_var("int64")
            repeated = T.alloc_var("int32")
            row = bx * THREADS + tid
            if row < num_tokens:
                for j in T.serial(1, num_topk):
                    value = group_indices[row, j]
                    repeated = 0
                    for m in T.serial(j):
                        if group_indices[row, m] == value:
                            repeated = 1
                    if repeated != 0 and value != T.int64(-1):
                        group_indices[row, j] = T.int64(-1)

    return main


KERNELS = (
    KernelDecl(
        name="moe.inplace_unique_group_indices",
        factory=inplace_unique_group_indices,
        grid=({},),
        outputs=("group_indices",),
        align=8,  # element alignment is enough: no vector accesses
        doc="Per row, every repeat of an earlier value becomes -1 (in place); int64 [tokens, topk].",
    ),
)

__all__ = ["KERNELS", "inplace_unique_group_indices"]
