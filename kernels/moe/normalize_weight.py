"""``moe.normalize_weight(topk_weights, denominator, normalized_weights)``: each row divided by its sum.

topk_weights and normalized_weights are ``[num_tokens, num_topk]`` float32 (contiguous),
denominator ``[num_tokens]`` float32; both extents are runtime symbols.  Per row ``t``::

    s = 1e-20f;  s += w[t, 0];  s += w[t, 1];  ...   (float32, left to right)
    denominator[t] = s;   normalized_weights[t, j] = w[t, j] / s   (IEEE division)

the same float32 operations in the same order as the torch reference, so the outputs are
bit-exact (the cubins are built without fast math: ``/`` is the correctly rounded division).

One thread per row, ``THREADS`` rows per block.  The row is read twice (the second pass hits
L1); no shared memory.  0 tokens gives an empty grid (nothing to launch).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
EPS = 1e-20  # the sum's starting value (keeps an all-zero row finite)


def normalize_weight():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")

    @T.prim_func
    def main(
        topk_weights: T.Tensor((num_tokens, num_topk), "float32"),
        denominator: T.Tensor((num_tokens,), "float32"),
        normalized_weights: T.Tensor((num_tokens, num_topk), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_tokens, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            total = T.alloc_var("float32")
            row = bx * THREADS + tid
            if row < num_tokens:
                total = T.float32(EPS)
                for j in T.serial(num_topk):
                    total = total + topk_weights[row, j]
                denominator[row] = total
                for j in T.serial(num_topk):
                    normalized_weights[row, j] = topk_weights[row, j] / total

    return main


KERNELS = (
    KernelDecl(
        name="moe.normalize_weight",
        factory=normalize_weight,
        grid=({},),
        outputs=("denominator", "normalized_weights"),
        align=4,  # element alignment is enough: no vector accesses
        doc="denominator[t] = 1e-20 + sum_j w[t, j]; normalized_weights = w / denominator; float32.",
    ),
)

__all__ = ["KERNELS", "normalize_weight"]
