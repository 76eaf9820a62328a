"""``moe.mask_indices_by_tp(indices, masked_indices, per_gpu, per_dp, num_tp_ranks, tp_rank)``.

indices and masked_indices are ``[num_tokens, num_topk]`` of the variant's dtype (int64 or
int32, contiguous); extents are runtime symbols, the rest int32 scalars (``per_gpu >= 1``,
``per_dp = num_tp_ranks * per_gpu``).  Global expert ``v`` lives on EP rank ``v // per_gpu``;
TP rank ``r`` keeps the experts of EP ranks ``r, r + num_tp_ranks, ...`` and numbers them
densely::

    masked = -1                                          if v < 0 or (v // per_gpu) % num_tp_ranks != tp_rank
    masked = w - (w // per_dp) * (per_dp - per_gpu)      otherwise, with w = v - tp_rank * per_gpu

A kept ``v`` has ``w >= 0``, so C's truncating division equals the reference's floor
division wherever the result is used.  Arithmetic is in the index dtype.

One thread per entry of the flat ``num_tokens * num_topk`` array; 0 tokens is an empty grid.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256
DTYPES = ("int64", "int32")


def mask_indices_by_tp(dtype: str):
    """Build the PrimFunc for one index dtype (``"int64"`` or ``"int32"``)."""
    if dtype not in DTYPES:
        raise ValueError(f"mask_indices_by_tp: dtype must be one of {DTYPES} (got {dtype!r})")
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")

    @T.prim_func
    def main(
        indices: T.Tensor((num_tokens, num_topk), dtype),
        masked_indices: T.Tensor((num_tokens, num_topk), dtype),
        per_gpu: T.int32,
        per_dp: T.int32,
        num_tp_ranks: T.int32,
        tp_rank: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * num_topk, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            v = T.alloc_var(dtype)
            w = T.alloc_var(dtype)
            i = bx * THREADS + tid
            if i < num_tokens * num_topk:
                v = T.Tensor((num_tokens * num_topk,), dtype, indices.data)[i]
                if v < T.Cast(dtype, 0) or T.truncmod(T.truncdiv(v, T.Cast(dtype, per_gpu)),
                                                      T.Cast(dtype, num_tp_ranks)) != T.Cast(dtype, tp_rank):
                    T.Tensor((num_tokens * num_topk,), dtype, masked_indices.data)[i] = T.Cast(dtype, -1)
                else:
                    w = v - T.Cast(dtype, tp_rank) * T.Cast(dtype, per_gpu)
                    T.Tensor((num_tokens * num_topk,), dtype, masked_indices.data)[i] = (
                        w - T.truncdiv(w, T.Cast(dtype, per_dp)) * T.Cast(dtype, per_dp - per_gpu))

    return main


KERNELS = (
    KernelDecl(
        name="moe.mask_indices_by_tp",
        factory=mask_indices_by_tp,
        grid=tuple({"dtype": d} for d in DTYPES),
        outputs=("masked_indices",),
        align=4,  # element alignment is enough: no vector accesses
        doc="Keep the experts of one TP rank (renumbered locally), -1 elsewhere; int64 or int32 indices.",
    ),
)

__all__ = ["KERNELS", "mask_indices_by_tp"]
