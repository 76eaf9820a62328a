"""``moe.aux_fi(topk_idx, out, state, num_aux_topk, num_sms)``: the load-balance frequency ``f_i`` per expert.

topk_idx is ``[num_tokens, num_topk]`` int64 (contiguous), out ``[num_experts]`` float32 with
``num_experts <= SHARED_BINS`` (the op launches ``moe.aux_fi_many_experts`` above that).  state
is int32 ``[2, num_experts]``: all zero on entry, and left all zero on exit (the op keeps one per
stream and configuration, so calls that could overlap never share one; see the op).  Extents are
runtime symbols; ``num_aux_topk`` (>= 1) and ``num_sms`` are scalars.  With ``c[e]`` the number
of entries equal to ``e`` (entries outside ``[0, num_experts)``, such as ``-1``, are not
counted)::

    out[e] = (float(c[e]) * float(num_experts)) * (1.0f / float(num_tokens * num_aux_topk))

every step rounded to float32, which is what ``counts.float() * num_experts / (num_tokens *
num_aux_topk)`` computes in torch on CUDA (a division by a host scalar there multiplies by its
float32 reciprocal); ``out[e] = 0`` where ``c[e] == 0`` (also for 0 tokens).  Integer counts make
the result exact and independent of the block and SM counts (tile_kernels adds per-block float
partials with float atomics, whose order varies).

Design.  Every block builds its histogram in shared memory (shared atomics) over its share of
the entries.  The ``single`` variant converts straight from it (``state`` unused).  The grid
variants are a plain launch of ``grid_blocks`` blocks (no co-residency, no grid barrier), and
their ``state`` is all zero on entry and left all zero:

* ``arrivals`` (the op's choice up to ``ARRIVALS_MAX_EXPERTS`` experts): ``state`` is read as
  uint64 ``[num_experts]``, one word per bin.  Every block adds ``2**32 + its count`` to every
  bin's word with an atomic that returns the old value (atomics on one word are totally
  ordered), so the block that sees ``nblocks - 1`` arrivals holds the bin's total: it writes
  ``out[e]`` and zeroes the word.  No fence, no ticket, no second read: one atomic round trip
  after the counting, as many atomics as blocks x bins.
* ``ticket`` (more experts): each non-zero bin is added to ``state[0]`` with a global atomic,
  then thread 0 takes a ticket (``state[1, 0]``, an acquire-release atomic after the block
  barrier, the pattern of a grid barrier's arrival); the block that draws the last ticket
  reads the totals (relaxed atomic loads after thread 0's acquire and a block barrier), writes
  ``out`` and zeroes ``state``.

``unroll``: the loads each thread has in flight per sweep of the grid.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256
BLOCKS_PER_SM = 2
MAX_BLOCKS = 512  # the grid's cap (entries past 512 blocks' sweep take more sweeps)
SHARED_BINS = 4096  # the largest num_experts (16 KB of shared memory)
ARRIVALS_MAX_EXPERTS = 1024  # the op's choice of "arrivals" over "ticket" (H200: faster up to 1024, slower at 4096)
# mode: "single" (one block), "ticket" or "arrivals" (grids, see the module docstring); unroll: flat
# entries each thread loads per sweep (a grid is one sweep where it can)
VARIANTS = tuple({"mode": mode, "unroll": unroll} for mode in ("ticket", "arrivals") for unroll in (4, 8)) + (
    {"mode": "single", "unroll": 8},)


def grid_blocks(entries, num_sms, unroll: int):
    """The grid variant's blocks: one per ``THREADS * unroll`` entries, at most ``BLOCKS_PER_SM``
    per SM and ``MAX_BLOCKS``, at least 1."""
    return T.max(1, T.min(T.min(num_sms * BLOCKS_PER_SM, MAX_BLOCKS), T.ceildiv(entries, THREADS * unroll)))


def aux_fi(mode: str, unroll: int):
    """Build the PrimFunc: one block, or a grid whose last arrival converts (per grid or per bin)."""
    single_block = mode == "single"
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")
    num_experts = T.dynamic("num_experts")
    entries = num_tokens * num_topk
    sweep = THREADS * unroll

    @T.macro
    def convert(out, e, count, inv):
        """out[e] from the bin's total: 0 for none (also when inv is inf: 0 tokens)."""
        if count > 0:
            out[e] = T.Cast("float32", count) * T.Cast("float32", num_experts) * inv
        else:
            out[e] = T.float32(0)

    @T.prim_func
    def main(
        topk_idx: T.Tensor((num_tokens, num_topk), "int64"),
        out: T.Tensor((num_experts,), "float32"),
        state: T.Tensor((2, num_experts), "int32"),
        num_aux_topk: T.int32,
        num_sms: T.int32,
    ):
        with T.Kernel(1 if single_block else grid_blocks(entries, num_sms, unroll), threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(BLOCKS_PER_SM)
            nblocks = 1 if single_block else grid_blocks(entries, num_sms, unroll)
            tid = T.get_thread_binding()
            hist = T.alloc_shared((SHARED_BINS,), "int32")
            ticket = T.alloc_shared((1,), "int32")
            vals = T.alloc_local((unroll,), "int64")
            inv = T.alloc_var("float32")
            count = T.alloc_var("int32")
            seen = T.alloc_local((1,), "uint64")
            flat = T.Tensor((entries,), "int64", topk_idx.data)
            for i in T.serial(T.ceildiv(num_experts, THREADS)):
                if i * THREADS + tid < num_experts:
                    hist[i * THREADS + tid] = 0
            T.sync_threads()
            for it in T.serial(T.ceildiv(entries, nblocks * sweep)):
                for u in T.unroll(unroll):
                    vals[u] = T.int64(-1)
                    if (it * nblocks + bx) * sweep + u * THREADS + tid < entries:
                        vals[u] = flat[(it * nblocks + bx) * sweep + u * THREADS + tid]
                for u in T.unroll(unroll):
                    if vals[u] >= T.int64(0) and vals[u] < T.Cast("int64", num_experts):
                        T.atomic_add(hist[T.Cast("int32", vals[u])], 1)
            T.sync_threads()
            inv = T.float32(1.0) / T.Cast("float32", T.Cast("int64", num_tokens) * T.Cast("int64", num_aux_topk))
            if mode == "arrivals":  # per bin: add (one arrival, the count); the last arrival converts
                words = T.Tensor((num_experts,), "uint64", state.data)
                for i in T.serial(T.ceildiv(num_experts, THREADS)):
                    if i * THREADS + tid < num_experts:
                        seen[0] = T.atomic_add(words[i * THREADS + tid],
                                               T.shift_left(T.uint64(1), T.uint64(32)) + T.Cast("uint64", hist[i * THREADS + tid]),
                                               return_prev=True)
                        if T.shift_right(seen[0], T.uint64(32)) == T.Cast("uint64", nblocks - 1):
                            count = T.Cast("int32", T.bitwise_and(seen[0], T.uint64(0xFFFFFFFF))) + hist[i * THREADS + tid]
                            T.atomic_store(words[i * THREADS + tid], T.uint64(0), memory_order="relaxed")
                            convert(out, i * THREADS + tid, count, inv)
            if mode == "ticket":  # add the block's counts to the totals, then take a ticket
                for i in T.serial(T.ceildiv(num_experts, THREADS)):
                    if i * THREADS + tid < num_experts:
                        if hist[i * THREADS + tid] > 0:
                            T.atomic_add(state[0, i * THREADS + tid], hist[i * THREADS + tid])
                T.sync_threads()
                if tid == 0:
                    ticket[0] = T.atomic_add(state[1, 0], 1, memory_order="acq_rel", return_prev=True)
                T.sync_threads()
            if single_block or (mode == "ticket" and ticket[0] == nblocks - 1):  # the last block: every total is in
                for i in T.serial(T.ceildiv(num_experts, THREADS)):
                    if i * THREADS + tid < num_experts:
                        if single_block:
                            count = hist[i * THREADS + tid]
                        else:
                            count = T.atomic_load(state[0, i * THREADS + tid], memory_order="relaxed")
                            T.atomic_store(state[0, i * THREADS + tid], 0, memory_order="relaxed")
                        convert(out, i * THREADS + tid, count, inv)
                if not single_block:
                    if tid == 0:
                        T.atomic_store(state[1, 0], 0, memory_order="relaxed")

    return main


KERNELS = (
    KernelDecl(
        name="moe.aux_fi",
        factory=aux_fi,
        meta={"max_experts": SHARED_BINS, "arrivals_max_experts": ARRIVALS_MAX_EXPERTS},  # the op's limits
        grid=VARIANTS,
        outputs=("out", "state"),
        align=4,  # element alignment is enough: no vector accesses
        doc="out[e] = count(topk_idx == e) * E / (tokens * num_aux_topk), float32, E <= 4096: per-block "
            "histograms added to a zeroed state with atomics; the last arrival (per bin, or a ticket) converts and "
            "re-zeroes it.",
    ),
)

__all__ = ["ARRIVALS_MAX_EXPERTS", "KERNELS", "MAX_BLOCKS", "SHARED_BINS", "VARIANTS", "aux_fi", "grid_blocks"]
