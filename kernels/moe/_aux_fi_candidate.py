"""``moe._aux_fi_candidate(topk_idx, out, num_aux_topk)``: ``moe.aux_fi`` without a grid barrier (issue 12).

Same result, bit for bit, as ``moe.aux_fi`` (see its docstring): with ``c[e]`` the number of
entries equal to ``e`` (entries outside ``[0, num_experts)`` are not counted),
``out[e] = (float(c[e]) * float(num_experts)) * (1.0f / float(num_tokens * num_aux_topk))``,
0 where ``c[e] == 0``; ``num_experts <= SHARED_BINS``.

Design: ONE thread-block cluster of ``CLUSTER`` blocks of ``THREADS`` threads (a plain launch
with the cluster attribute: no cooperative launch, no workspace, no zeroed counter).  Every
block counts its share of the flat entries into its own shared histogram (shared atomics);
one hardware cluster barrier (``barrier.cluster.arrive`` / ``wait``: release / acquire at
cluster scope, so the histograms are visible to the cluster); block ``r``'s thread ``t``
then owns experts ``(i * CLUSTER + r) * THREADS + t`` and sums that bin of the ``CLUSTER``
histograms through distributed shared memory (``ld.shared::cluster``, all loads issued
before the sum), converts and stores.  A second cluster barrier keeps every block's shared
memory alive until all remote reads are done (a block may not exit while its shared memory
is read).  Integer counts: exact and deterministic.

Entries are spread over the blocks at thread granularity (flat entry ``(it * UNROLL + u) *
CLUSTER * THREADS + r * THREADS + t``), so every block gets a share at any size; ``unroll``
(a variant key) is the loads each thread issues before its first atomic.

Why (unmeasured): the shipped kernel's chain after the loads is shared atomics, a workspace
row store, ``T.sync_grid()`` (fence, a global atomic, polling: three or more L2 round trips)
and a column load (one more), about 1 us; here the barrier is the cluster's hardware barrier
and the cross-block reads go SM to SM.  The price: 8 SMs read the indices (up to ~1.6 MB at
the benchmark's top-k 9), so the op keeps ``moe.aux_fi`` past ``MAX_ENTRIES``.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

CLUSTER = 8  # blocks in the cluster (the portable maximum): the grid
THREADS = 1024
SHARED_BINS = 4096  # the largest num_experts (16 KB of shared memory per block), as moe.aux_fi
MAX_ENTRIES = 1 << 18  # the op launches this kernel up to this many indices (moe.aux_fi past them)
VARIANTS = ({"unroll": 8}, {"unroll": 16})

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
    """Build the PrimFunc: one cluster of CLUSTER blocks, shared histograms summed over DSMEM."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")
    num_experts = T.dynamic("num_experts")
    entries = num_tokens * num_topk
    span = CLUSTER * THREADS  # entries per u-step of a sweep

    @T.prim_func
    def main(
        topk_idx: T.Tensor((num_tokens, num_topk), "int64"),
        out: T.Tensor((num_experts,), "float32"),
        num_aux_topk: T.int32,
    ):
        with T.Kernel(CLUSTER, threads=THREADS, cluster_dims=CLUSTER, prelude=_PRELUDE) as bx:
            tid = T.get_thread_binding()
            hist = T.alloc_shared((SHARED_BINS,), "int32")
            vals = T.alloc_local((unroll,), "int64")
            parts = T.alloc_local((CLUSTER,), "int32")
            inv = T.alloc_var("float32")
            count = T.alloc_var("int32")
            flat = T.Tensor((entries,), "int64", topk_idx.data)
            for i in T.serial(T.ceildiv(num_experts, THREADS)):
                if i * THREADS + tid < num_experts:
                    hist[i * THREADS + tid] = 0
            T.sync_threads()
            for it in T.serial(T.ceildiv(entries, span * unroll)):
                for u in T.unroll(unroll):
                    vals[u] = T.int64(-1)
                    if (it * unroll + u) * span + bx * THREADS + tid < entries:
                        vals[u] = flat[(it * unroll + u) * span + bx * THREADS + tid]
                for u in T.unroll(unroll):
                    if vals[u] >= T.int64(0) and vals[u] < T.Cast("int64", num_experts):
                        T.atomic_add(hist[T.Cast("int32", vals[u])], 1)
            # every block's histogram complete and visible to the cluster (arrive has release, wait acquire
            # semantics at cluster scope; it also orders this block's own threads, as a __syncthreads)
            T.cluster_sync()
            inv = T.float32(1.0) / T.Cast("float32", T.Cast("int64", num_tokens) * T.Cast("int64", num_aux_topk))
            for i in T.serial(T.ceildiv(num_experts, span)):
                if (i * CLUSTER + bx) * THREADS + tid < num_experts:
                    for r in T.unroll(CLUSTER):
                        parts[r] = T.call_extern("int32", "tilebin_cluster_ld",
                                                 T.address_of(hist[(i * CLUSTER + bx) * THREADS + tid]), r)
                    count = 0
                    for r in T.unroll(CLUSTER):
                        count = count + parts[r]
                    if count > 0:
                        out[(i * CLUSTER + bx) * THREADS + tid] = (
                            T.Cast("float32", count) * T.Cast("float32", num_experts) * inv)
                    else:
                        out[(i * CLUSTER + bx) * THREADS + tid] = T.float32(0)
            T.cluster_sync()  # no block exits (freeing its shared memory) before the remote reads are done

    return main


KERNELS = (
    KernelDecl(
        name="moe._aux_fi_candidate",
        factory=aux_fi_candidate,
        meta={"max_experts": SHARED_BINS, "max_entries": MAX_ENTRIES},
        grid=VARIANTS,
        outputs=("out",),
        align=4,  # scalar accesses only
        # barriers placed by hand: TileLang added a __syncthreads after the first cluster barrier
        pass_configs={"tl.disable_thread_storage_sync": True},
        doc="aux_fi candidate: one 8-block cluster, per-block shared histograms summed through distributed "
            "shared memory after a cluster barrier (no grid barrier, no workspace); E <= 4096.",
    ),
)

__all__ = ["CLUSTER", "KERNELS", "MAX_ENTRIES", "SHARED_BINS", "THREADS", "VARIANTS", "aux_fi_candidate"]
