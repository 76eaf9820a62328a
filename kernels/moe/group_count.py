"""``moe.group_count(group_idx, out, num_sms)``: ``out[g]`` = how many entries of ``group_idx`` equal ``g``.

group_idx is ``[num_tokens, num_topk]`` int64 (contiguous), out ``[num_groups]`` int32; every
extent is a runtime symbol and ``num_sms`` (the SM count the op may use) is a scalar, so one
cubin serves any shape and any Hopper part.  Entries outside ``[0, num_groups)`` (``-1`` marks
an empty slot) are not counted.  out's contents on entry do not matter: the kernel zeroes it.

Design (one launch, no workspace, no zero-filled output):

* Rows play no part in a count, so the index tensor is read as one flat array of
  ``num_tokens * num_topk`` entries: each thread loads ``UNROLL`` of them (coalesced, all in
  flight before the first use) per sweep of the grid.
* Phase 0: block 0 zeroes out, every block zeroes its shared histogram; a grid barrier.
* Phase 1: shared-memory atomics build each block's histogram, then each nonzero bin is added
  to out with one global atomic.  Integer addition is associative, so the result does not
  depend on the order of the atomics, the block count or the SM count: it is bit-exact.
  More than ``SHARED_BINS`` bins skip the shared histogram and count with global atomics.
* Two variants (``single_block``): ``False`` is a cooperative launch (the barrier is
  ``T.sync_grid()``) of ``max(1, min(BLOCKS_PER_SM * num_sms, ceil(entries / (THREADS *
  UNROLL))))`` blocks: at most two 256-thread blocks per SM (16 KB of shared memory, registers
  capped by ``__launch_bounds__(256, 2)``), always co-resident as a cooperative launch
  requires, and never an empty grid, so out is zeroed even for 0 tokens.  ``True`` is one
  block and a plain launch (the barrier is ``__syncthreads()``; ``num_sms`` unused): the op
  takes it for decode-sized inputs (``tilebin.ops.moe._stats.SINGLE_BLOCK_ENTRIES``), where the
  cooperative launch's extra host and device cost outweighs the parallelism.

``count_phase`` is shared with ``moe.aux_fi`` (which counts the same way, then converts).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256
UNROLL = 4  # flat entries each thread loads per sweep
BLOCKS_PER_SM = 2
SHARED_BINS = 4096  # bins counted in shared memory (16 KB); more bins count in global memory
VARIANTS = ({"single_block": False}, {"single_block": True})


def grid_blocks(entries, num_sms, single_block: bool):
    """The grid: one block, or enough blocks for the entries, two per SM at most, at least one."""
    if single_block:
        return 1
    return T.max(1, T.min(num_sms * BLOCKS_PER_SM, T.ceildiv(entries, THREADS * UNROLL)))


def barrier(single_block: bool):
    """The barrier between phases: the block's, or the (cooperative) grid's."""
    return T.sync_threads if single_block else T.sync_grid


def count_phase(entries, bins, single_block: bool):
    """A macro ``(flat, counts, hist, vals, bx, tid, nblocks)``: zero ``counts[0:bins]``, then add
    one per entry of ``flat[0:entries]`` that lies in ``[0, bins)``.

    ``entries`` and ``bins`` are expressions of the caller's runtime symbols, closed over
    rather than passed (a macro argument that is a bare symbol renames it in the manifest);
    ``nblocks`` is the grid size (``grid_blocks``).  ``counts`` is an int32 global buffer,
    ``hist`` a ``SHARED_BINS`` int32 shared buffer, ``vals`` an ``UNROLL`` int64 local buffer.
    On return every count has been added; other threads see them only after the caller's
    next ``barrier(single_block)()``.
    """
    sweep = THREADS * UNROLL
    sync = barrier(single_block)

    @T.macro
    def phase(flat, counts, hist, vals, bx, tid, nblocks):
        if bx == 0:
            for i in T.serial(T.ceildiv(bins, THREADS)):
                if i * THREADS + tid < bins:
                    counts[i * THREADS + tid] = 0
        if bins <= SHARED_BINS:
            for i in T.serial(T.ceildiv(bins, THREADS)):
                if i * THREADS + tid < bins:
                    hist[i * THREADS + tid] = 0
        sync()
        for it in T.serial(T.ceildiv(entries, nblocks * sweep)):
            for u in T.unroll(UNROLL):
                if (it * nblocks + bx) * sweep + u * THREADS + tid < entries:
                    vals[u] = flat[(it * nblocks + bx) * sweep + u * THREADS + tid]
                else:
                    vals[u] = T.int64(-1)
            for u in T.unroll(UNROLL):
                if vals[u] >= T.int64(0) and vals[u] < T.Cast("int64", bins):
                    if bins <= SHARED_BINS:
                        T.atomic_add(hist[T.Cast("int32", vals[u])], 1)
                    else:
                        T.atomic_add(counts[T.Cast("int32", vals[u])], 1)
        if bins <= SHARED_BINS:
            T.sync_threads()
            for i in T.serial(T.ceildiv(bins, THREADS)):
                if i * THREADS + tid < bins:
                    if hist[i * THREADS + tid] > 0:
                        T.atomic_add(counts[i * THREADS + tid], hist[i * THREADS + tid])

    return phase


def group_count(single_block: bool):
    """Build the PrimFunc: one block (plain launch) or a cooperative grid."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")
    num_groups = T.dynamic("num_groups")
    phase = count_phase(num_tokens * num_topk, num_groups, single_block)

    @T.prim_func
    def main(
        group_idx: T.Tensor((num_tokens, num_topk), "int64"),
        out: T.Tensor((num_groups,), "int32"),
        num_sms: T.int32,
    ):
        with T.Kernel(grid_blocks(num_tokens * num_topk, num_sms, single_block), threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(BLOCKS_PER_SM)  # the cooperative grid's residency
            tid = T.get_thread_binding()
            hist = T.alloc_shared((SHARED_BINS,), "int32")
            vals = T.alloc_local((UNROLL,), "int64")
            phase(T.Tensor((num_tokens * num_topk,), "int64", group_idx.data), out, hist, vals, bx, tid,
                  grid_blocks(num_tokens * num_topk, num_sms, single_block))

    return main


KERNELS = (
    KernelDecl(
        name="moe.group_count",
        factory=group_count,
        grid=VARIANTS,
        outputs=("out",),
        align=4,  # element alignment is enough: no vector accesses
        doc="out[g] = count of group_idx == g; group_idx [tokens, topk] int64, out [groups] int32; "
            "cooperative unless single_block.",
    ),
)

__all__ = ["KERNELS", "VARIANTS", "barrier", "count_phase", "grid_blocks", "group_count"]
