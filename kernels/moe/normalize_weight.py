"""``moe.normalize_weight(topk_weights, denominator, normalized_weights)``: each row divided by its sum.

topk_weights and normalized_weights are ``[num_tokens, num_topk]`` float32 (contiguous),
denominator ``[num_tokens]`` float32; both extents are runtime symbols.  Per row ``t``::

    s = 1e-20f;  s += w[t, 0];  s += w[t, 1];  ...   (float32, left to right)
    denominator[t] = s;   normalized_weights[t, j] = w[t, j] / s   (IEEE division)

the same float32 operations in the same order as the torch reference, so the outputs are
bit-exact (the cubins are built without fast math: ``/`` is the correctly rounded division).

One thread per row, ``THREADS`` rows per block; no shared memory.  0 tokens gives an empty grid
(nothing to launch).  With a run-time top-k the row is walked by run-time loops, which nvcc unrolls
in blocks of 16/8/4 and a one-at-a-time remainder: top-k 6 costs three dependent round trips.  The
variants specialised for top-k ``SPECIALISED_TOPK`` (``KernelDecl.specialise``: the same code with
``num_topk`` a constant) unroll fully: the row's loads issue back to back (one round trip) and the
division loop reuses them from registers (the parameters are ``__restrict__``).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
EPS = 1e-20  # the sum's starting value (keeps an all-zero row finite)
# top-k values built with num_topk fixed: 2 (Mixtral), 6 (DeepSeek-V2), 8 (DeepSeek-V3, Qwen3), 9 (8 + a shared expert)
SPECIALISED_TOPK = (2, 6, 8, 9)


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
        specialise=tuple({"num_topk": k} for k in SPECIALISED_TOPK),
        doc="denominator[t] = 1e-20 + sum_j w[t, j]; normalized_weights = w / denominator; float32.",
    ),
)

__all__ = ["KERNELS", "normalize_weight"]
