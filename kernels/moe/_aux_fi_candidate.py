"""``moe._aux_fi_candidate(topk_idx, out, workspace, num_aux_topk)``: ``moe.aux_fi`` without a grid barrier (issue 12, round 2).

Same result, bit for bit, as ``moe.aux_fi`` (see its docstring): with ``c[e]`` the number of
entries equal to ``e`` (entries outside ``[0, num_experts)`` are not counted),
``out[e] = (float(c[e]) * float(num_experts)) * (1.0f / float(num_tokens * num_aux_topk))``,
0 where ``c[e] == 0``; ``num_experts <= SHARED_BINS``.  workspace is int32
``[workspace_rows, num_experts]``, one row per cluster (contents on entry do not matter), with
``workspace_rows <= MAX_ROWS``.

Design: two launches chained by PDL, no cooperative launch, no zeroed counter (safe under
concurrent streams and CUDA graphs: the workspace is the call's own and fully written).

1. ``workspace_rows`` clusters of ``CLUSTER`` blocks of ``THREADS`` threads (a plain launch
   with the cluster attribute; clusters need not be co-resident).  ``T.pdl_trigger()`` first,
   so the second grid is launched while this one reads.  Every block counts its share of the
   flat entries (``(it * nblocks + bx) * sweep + u * THREADS + tid``, as ``moe.aux_fi``) into
   a shared histogram (shared atomics); one hardware cluster barrier; then bin ``e`` is summed
   by the cluster's block ``e % CLUSTER`` (thread ``e // CLUSTER``) over the ``CLUSTER``
   histograms through distributed shared memory (``mapa`` + ``ld.shared::cluster``, all loads
   before the sum) and stored to ``workspace[cluster, e]``; a second cluster barrier keeps
   every block's shared memory alive until the remote reads are done.
2. ``T.pdl_sync()`` (``griddepcontrol.wait``: the first grid has finished and its writes are
   visible), then warp ``g`` of ``ceildiv(num_experts, WARPS * CLUSTER) * CLUSTER`` blocks (TileLang
   gives this launch the cluster attribute too, so whole clusters) owns expert ``g``: its
   lanes load the column (rows ``lane`` and ``lane + 32``), a shuffle sum, lane 0 converts and
   stores.  Integer counts: exact and deterministic.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

CLUSTER = 8  # blocks per cluster (the portable maximum)
THREADS = 256
WARPS = THREADS // 32
BLOCKS_PER_SM = 2
MAX_ROWS = 64  # clusters (workspace rows) the second grid's lanes sum: 32 lanes x ROWS_PER_LANE
ROWS_PER_LANE = MAX_ROWS // 32
SHARED_BINS = 4096  # the largest num_experts (16 KB of shared memory per block), as moe.aux_fi
VARIANTS = ({"unroll": 4}, {"unroll": 8})

# ld.shared::cluster of the int at shared address ``p`` in block ``rank`` of the cluster
_PRELUDE = r"""
__device__ __forceinline__ int tilebin_cluster_ld(const int* p, int rank) {
  unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p)), remote;
  int v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
  return v;
}
"""


def aux_fi_candidate(unroll: int):
    """Build the PrimFunc: cluster histograms to workspace rows, then (PDL) the column sums."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")
    num_experts = T.dynamic("num_experts")
    ws_rows = T.dynamic("workspace_rows")
    entries = num_tokens * num_topk
    nblocks = ws_rows * CLUSTER
    sweep = THREADS * unroll

    @T.prim_func
    def main(
        topk_idx: T.Tensor((num_tokens, num_topk), "int64"),
        out: T.Tensor((num_experts,), "float32"),
        workspace: T.Tensor((ws_rows, num_experts), "int32"),
        num_aux_topk: T.int32,
    ):
        with T.Kernel(nblocks, threads=THREADS, cluster_dims=CLUSTER, prelude=_PRELUDE) as bx:
            T.annotate_min_blocks_per_sm(BLOCKS_PER_SM)
            T.pdl_trigger()  # the column-sum grid may launch now (it waits in griddepcontrol.wait)
            tid = T.get_thread_binding()
            hist = T.alloc_shared((SHARED_BINS,), "int32")
            vals = T.alloc_local((unroll,), "int64")
            parts = T.alloc_local((CLUSTER,), "int32")
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
            # every block's histogram complete and visible to the cluster (arrive: release, wait: acquire at
            # cluster scope; it also orders this block's own threads, as a __syncthreads)
            T.cluster_sync()
            for i in T.serial(T.ceildiv(num_experts, THREADS * CLUSTER)):
                if (i * THREADS + tid) * CLUSTER + bx % CLUSTER < num_experts:
                    for r in T.unroll(CLUSTER):
                        parts[r] = T.call_extern(
                            "int32", "tilebin_cluster_ld",
                            T.address_of(hist[(i * THREADS + tid) * CLUSTER + bx % CLUSTER]), r)
                    count = 0
                    for r in T.unroll(CLUSTER):
                        count = count + parts[r]
                    workspace[bx // CLUSTER, (i * THREADS + tid) * CLUSTER + bx % CLUSTER] = count
            T.cluster_sync()  # no block exits (freeing its shared memory) before the remote reads are done
        # TileLang puts the PrimFunc's cluster_dims on both launches: a whole number of clusters here too
        with T.Kernel(T.ceildiv(num_experts, WARPS * CLUSTER) * CLUSTER, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            rows = T.alloc_local((ROWS_PER_LANE,), "int32")
            inv = T.alloc_var("float32")
            total = T.alloc_var("int32")
            T.pdl_sync()  # the first grid has finished; its workspace rows are visible
            inv = T.float32(1.0) / T.Cast("float32", T.Cast("int64", num_tokens) * T.Cast("int64", num_aux_topk))
            if bx * WARPS + warp < num_experts:
                for r in T.unroll(ROWS_PER_LANE):
                    rows[r] = 0
                    if r * 32 + lane < ws_rows:
                        rows[r] = workspace[r * 32 + lane, bx * WARPS + warp]
                total = 0
                for r in T.unroll(ROWS_PER_LANE):
                    total = total + rows[r]
                for d in T.unroll(5):
                    total = total + T.shfl_xor(total, 16 >> d)
                if lane == 0:
                    if total > 0:
                        out[bx * WARPS + warp] = T.Cast("float32", total) * T.Cast("float32", num_experts) * inv
                    else:
                        out[bx * WARPS + warp] = T.float32(0)

    return main


KERNELS = (
    KernelDecl(
        name="moe._aux_fi_candidate",
        factory=aux_fi_candidate,
        meta={"max_experts": SHARED_BINS, "max_rows": MAX_ROWS, "cluster": CLUSTER},  # the op's limits
        grid=VARIANTS,
        outputs=("out", "workspace"),
        align=4,  # scalar accesses only
        # barriers placed by hand: TileLang added a __syncthreads after the first cluster barrier
        pass_configs={"tl.disable_thread_storage_sync": True},
        doc="aux_fi candidate: 8-block clusters sum their shared histograms over distributed shared memory "
            "into a workspace row each, then a PDL-chained grid sums the rows (no grid barrier); E <= 4096.",
    ),
)

__all__ = ["CLUSTER", "KERNELS", "MAX_ROWS", "SHARED_BINS", "THREADS", "VARIANTS", "aux_fi_candidate"]
