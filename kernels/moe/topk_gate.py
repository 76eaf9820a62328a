"""``moe.topk_gate(scores, topk_idx)``: the ``k`` largest scores of every token, stable.

* ``scores``: ``[num_tokens, num_experts]`` float32, contiguous.
* ``topk_idx``: ``[num_tokens, num_topk]`` int64, contiguous (written): expert indices in
  descending score order; equal scores by lower index (``torch.sort(descending=True,
  stable=True)``; NaN ranks above everything, ``-0.0`` equals ``+0.0``).

``num_tokens``, ``num_experts`` and ``num_topk`` are run-time values; the variant key
``slots`` bounds ``num_experts <= 32 * slots`` (the op picks the smallest variant that fits)
and ``num_topk <= num_experts`` is the op's check.

Design: a warp per token, ``WARPS`` tokens per block (grid ``ceil(num_tokens / WARPS)``, so a
decode batch of 1-4 tokens is one block).  Lane ``l`` loads experts ``j * 32 + l`` (coalesced),
turns them into order keys (see ``_gating_common``) and keeps them in registers; each of the
``num_topk`` steps is a local scan of ``slots`` keys plus two ``redux.sync`` reductions, and
lane 0 stores the winner.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl
from ._gating_common import KEY_GONE, order_key, pick_next

WARPS = 4
SLOTS = (2, 8, 32)  # experts <= 64, 256, 1024


def topk_gate(slots: int):
    """PrimFunc selecting the top-k of up to ``32 * slots`` experts per token."""
    num_tokens = T.dynamic("num_tokens")
    num_experts = T.dynamic("num_experts")
    num_topk = T.dynamic("num_topk")

    @T.prim_func
    def main(
        scores: T.Tensor((num_tokens, num_experts), "float32"),
        topk_idx: T.Tensor((num_tokens, num_topk), "int64"),
    ):
        with T.Kernel(T.ceildiv(num_tokens, WARPS), threads=WARPS * 32) as bx:
            tid = T.get_thread_binding()
            lane = tid % 32
            token = bx * WARPS + tid // 32
            keys = T.alloc_local((slots,), "int32")
            winner = T.alloc_var("int32", init=0)
            if token < num_tokens:  # uniform over the warp
                for j in T.unroll(slots):
                    keys[j] = KEY_GONE
                    if j * 32 + lane < num_experts:
                        keys[j] = T.reinterpret(scores[token, j * 32 + lane], "int32")
                        keys[j] = order_key(keys[j])
                for k in T.serial(num_topk):
                    winner = pick_next(keys, slots, lane)
                    if lane == 0:
                        topk_idx[token, k] = T.Cast("int64", winner)

    return main


KERNELS = (
    KernelDecl(
        name="moe.topk_gate",
        factory=topk_gate,
        grid=tuple({"slots": s} for s in SLOTS),
        outputs=("topk_idx",),
        align=4,  # scalar accesses only
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="Stable top-k expert indices per token (int64), tile_kernels.moe.topk_gate.",
    ),
)

__all__ = ["KERNELS", "SLOTS", "WARPS", "topk_gate"]
