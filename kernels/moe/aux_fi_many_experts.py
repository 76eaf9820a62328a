"""``moe.aux_fi_many_experts(topk_idx, out, num_aux_topk, num_sms)``: ``moe.aux_fi`` for more experts
than ``moe.aux_fi``'s shared-memory bins (``num_experts > 4096``; the op launches it only there).

topk_idx is ``[num_tokens, num_topk]`` int64 (contiguous), out ``[num_experts]`` float32;
extents are runtime symbols, ``num_aux_topk`` (>= 1) and ``num_sms`` are scalars.  With
``c[e]`` the number of entries equal to ``e`` (entries outside ``[0, num_experts)``, such as
``-1``, are not counted)::

    out[e] = (float(c[e]) * float(num_experts)) * (1.0f / float(num_tokens * num_aux_topk))

every step rounded to float32, which is what ``counts.float() * num_experts / (num_tokens *
num_aux_topk)`` computes in torch on CUDA (a division by a host scalar there multiplies by
its float32 reciprocal); ``out[e] = 0`` where ``c[e] == 0`` (also for 0 tokens).

Design: ``moe.group_count``'s counting (see ``group_count.count_phase``; the same two
variants, cooperative grid or single block; past ``SHARED_BINS`` bins it adds with global
atomics) runs on out's own memory read as int32, so no
workspace and no zero-filled output are needed; a second barrier makes the totals visible,
then each thread converts the bins it owns in place.  Integer counts make the result exact
and independent of the block and SM counts (tile_kernels adds per-block float partials with
float atomics, whose order varies).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .group_count import BLOCKS_PER_SM, SHARED_BINS, THREADS, UNROLL, VARIANTS, barrier, count_phase, grid_blocks


def aux_fi_many_experts(single_block: bool):
    """Build the PrimFunc: one block (plain launch) or a cooperative grid (see ``group_count``)."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")
    num_experts = T.dynamic("num_experts")
    phase = count_phase(num_tokens * num_topk, num_experts, single_block)
    sync = barrier(single_block)

    @T.prim_func
    def main(
        topk_idx: T.Tensor((num_tokens, num_topk), "int64"),
        out: T.Tensor((num_experts,), "float32"),
        num_aux_topk: T.int32,
        num_sms: T.int32,
    ):
        nblocks = grid_blocks(num_tokens * num_topk, num_sms, single_block)
        with T.Kernel(nblocks, threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(BLOCKS_PER_SM)  # the cooperative grid's residency
            tid = T.get_thread_binding()
            hist = T.alloc_shared((SHARED_BINS,), "int32")
            vals = T.alloc_local((UNROLL,), "int64")
            inv = T.alloc_var("float32")
            count = T.alloc_var("int32")
            phase(T.Tensor((num_tokens * num_topk,), "int64", topk_idx.data),
                  T.Tensor((num_experts,), "int32", out.data), hist, vals, bx, tid, nblocks)
            sync()
            inv = T.float32(1.0) / T.Cast("float32", T.Cast("int64", num_tokens) * T.Cast("int64", num_aux_topk))
            for i in T.serial(T.ceildiv(num_experts, nblocks * THREADS)):
                e = (i * nblocks + bx) * THREADS + tid
                if e < num_experts:
                    count = T.Tensor((num_experts,), "int32", out.data)[e]
                    if count > 0:
                        out[e] = T.Cast("float32", count) * T.Cast("float32", num_experts) * inv
                    else:
                        out[e] = T.float32(0)

    return main


KERNELS = (
    KernelDecl(
        name="moe.aux_fi_many_experts",
        factory=aux_fi_many_experts,
        grid=VARIANTS,
        outputs=("out",),
        align=4,  # element alignment is enough: no vector accesses
        doc="moe.aux_fi for num_experts > 4096 (the op's choice there): bins in global memory, two grid barriers; "
            "cooperative unless single_block.",
    ),
)

__all__ = ["KERNELS", "aux_fi_many_experts"]
