"""``moe.aux_fi(topk_idx, out, workspace, num_aux_topk)``: the load-balance frequency ``f_i`` per expert.

topk_idx is ``[num_tokens, num_topk]`` int64 (contiguous), out ``[num_experts]`` float32 with
``num_experts <= SHARED_BINS`` (the op launches ``moe.aux_fi_many_experts`` above that), workspace
int32 ``[num_blocks, num_experts]`` (contents on entry do not matter; the grid is one block per
row, at most ``MAX_BLOCKS``, and the op sizes it to be co-resident: ``BLOCKS_PER_SM`` per SM).
Extents are runtime symbols, ``num_aux_topk`` (>= 1) a scalar.  With ``c[e]`` the number of
entries equal to ``e`` (entries outside ``[0, num_experts)``, such as ``-1``, are not counted)::

    out[e] = (float(c[e]) * float(num_experts)) * (1.0f / float(num_tokens * num_aux_topk))

every step rounded to float32, which is what ``counts.float() * num_experts / (num_tokens *
num_aux_topk)`` computes in torch on CUDA (a division by a host scalar there multiplies by its
float32 reciprocal); ``out[e] = 0`` where ``c[e] == 0`` (also for 0 tokens).  Integer counts make
the result exact and independent of the block and SM counts (tile_kernels adds per-block float
partials with float atomics, whose order varies).

Design.  Every block builds its histogram in shared memory (shared atomics) and writes the
whole row ``workspace[block]`` (so nothing needs zeroing first); one ``T.sync_grid()``; then
global warp ``g`` owns experts ``g, g + G, ...``: its lanes load the expert's column of the
workspace (all rows at once, ``ROWS_PER_LANE`` per lane), a shuffle reduction sums it and lane
0 writes ``out[e]``.  The ``single_block`` variant (a plain launch, ``workspace`` unused)
converts straight from the shared histogram.  ``unroll``: the loads each thread has in flight
per sweep of the grid.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256
WARPS = THREADS // 32
BLOCKS_PER_SM = 2
MAX_BLOCKS = 512  # workspace rows a warp sums: 32 lanes x ROWS_PER_LANE
ROWS_PER_LANE = MAX_BLOCKS // 32
SHARED_BINS = 4096  # the largest num_experts (16 KB of shared memory)
# unroll: flat entries each thread loads per sweep (the op sizes the grid to one sweep where it can)
VARIANTS = ({"single_block": False, "unroll": 4}, {"single_block": False, "unroll": 8},
            {"single_block": True, "unroll": 8})


def aux_fi(single_block: bool, unroll: int):
    """Build the PrimFunc: one block (plain launch) or a cooperative grid of workspace-row blocks."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")
    num_experts = T.dynamic("num_experts")
    ws_rows = T.dynamic("workspace_rows")
    entries = num_tokens * num_topk
    nblocks = 1 if single_block else ws_rows
    sweep = THREADS * unroll

    @T.prim_func
    def main(
        topk_idx: T.Tensor((num_tokens, num_topk), "int64"),
        out: T.Tensor((num_experts,), "float32"),
        workspace: T.Tensor((ws_rows, num_experts), "int32"),
        num_aux_topk: T.int32,
    ):
        with T.Kernel(nblocks, threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(BLOCKS_PER_SM)  # the cooperative grid's residency
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            hist = T.alloc_shared((SHARED_BINS,), "int32")
            vals = T.alloc_local((unroll,), "int64")
            rows = T.alloc_local((ROWS_PER_LANE,), "int32")
            inv = T.alloc_var("float32")
            count = T.alloc_var("int32")
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
            if single_block:
                for i in T.serial(T.ceildiv(num_experts, THREADS)):
                    if i * THREADS + tid < num_experts:
                        count = hist[i * THREADS + tid]
                        if count > 0:
                            out[i * THREADS + tid] = T.Cast("float32", count) * T.Cast("float32", num_experts) * inv
                        else:
                            out[i * THREADS + tid] = T.float32(0)
            else:
                for i in T.serial(T.ceildiv(num_experts, THREADS)):
                    if i * THREADS + tid < num_experts:
                        workspace[bx, i * THREADS + tid] = hist[i * THREADS + tid]
                T.sync_grid()
                for it in T.serial(T.ceildiv(num_experts, nblocks * WARPS)):
                    if (it * nblocks + bx) * WARPS + warp < num_experts:
                        for r in T.unroll(ROWS_PER_LANE):
                            rows[r] = 0
                            if r * 32 + lane < nblocks:
                                rows[r] = workspace[r * 32 + lane, (it * nblocks + bx) * WARPS + warp]
                        count = 0
                        for r in T.unroll(ROWS_PER_LANE):
                            count = count + rows[r]
                        for d in T.unroll(5):
                            count = count + T.shfl_xor(count, 16 >> d)
                        if lane == 0:
                            if count > 0:
                                out[(it * nblocks + bx) * WARPS + warp] = (
                                    T.Cast("float32", count) * T.Cast("float32", num_experts) * inv)
                            else:
                                out[(it * nblocks + bx) * WARPS + warp] = T.float32(0)

    return main


KERNELS = (
    KernelDecl(
        name="moe.aux_fi",
        factory=aux_fi,
        meta={"max_experts": SHARED_BINS, "max_blocks": MAX_BLOCKS},  # the op's limits
        grid=VARIANTS,
        outputs=("out", "workspace"),
        align=4,  # element alignment is enough: no vector accesses
        doc="out[e] = count(topk_idx == e) * E / (tokens * num_aux_topk), float32, E <= 4096: per-block "
            "histograms to a workspace, one grid barrier; cooperative unless single_block.",
    ),
)

__all__ = ["KERNELS", "MAX_BLOCKS", "SHARED_BINS", "VARIANTS", "aux_fi"]
