"""``quant.per_token_cast_e5m6_fp32``: ``quant.per_token_cast_e5m6`` for fp32 input (what
``per_token_cast(x, 'e5m6', ...)`` launches for fp32 ``x``; ``quant.per_token_cast_e5m6`` serves bf16).

Same parameters, in the same order, and the same bits as ``quant.per_token_cast_e5m6`` (see
that module for the contract and the algorithm): ``x`` fp32 ``[num_tokens, hidden]``, ``out``
uint8 ``[num_tokens, hidden * 3 // 2]``, ``out_sf`` (``row`` / ``col`` / ``ue8m0``),
``round_sf``, ``tokens_per_block`` (1, 2 or 4: the op sizes it by ``meta["cached_units"]`` so that
every unit of a thread stays cached where possible).  Variants: ``in_dtype="float32"`` x the
three ``sf_kind`` s (the keys of the matching ``quant.per_token_cast_e5m6`` variants, which that
kernel no longer builds).

Why two kernels: ``quant.per_token_cast_e5m6`` keeps ``CACHED = 8`` units per thread between its
amax and cast passes, which for fp32 is 64 registers of source, 100 registers in all: 5 blocks of
128 threads (20 warps) per SM, and its op packs 4 tokens of hidden 2048 into a block (8 units per
thread).  Here a thread caches 4 units (32 words, the bf16 variants' register budget) under
``__launch_bounds__(128, 8)``, and the op gives each token twice the threads
(``tokens_per_block`` 2 at hidden 2048): half the work per thread, twice the blocks, 8 blocks (32
warps) per SM, the same bytes in flight per SM.  Units past the cached ones are read a second
time (from L1/L2), as in ``quant.per_token_cast_e5m6``.  56-58 registers, no spills, the 8
``LDG.E.128`` of the cached units issued before the first use.

Measured (H200, CUPTI kernel time, L2 flushed; ``quant.per_token_cast_e5m6`` -> this, tile_kernels
1.0.0 in parentheses; compare_peer, 2026-12-02), fp32 x 2048: 4001 tokens 17.1 -> 14.7 (14.1), 8001:
30.6 -> 25.4 (25.2) us; outputs bit-equal (row, column-major and UE8M0 scales).

The kernel body is ``_e5m6_common.e5m6_kernel``, shared with ``quant.per_token_cast_e5m6``.
"""

from .._declare import KernelDecl, product
from ._e5m6_common import SF_KINDS, e5m6_kernel

CACHED = 4  # units (8 fp32 values, 32 bytes) per thread kept in registers between the two passes
MIN_BLOCKS = 8  # blocks of 128 threads per SM: caps ptxas at 64 registers


def per_token_cast_e5m6_fp32(in_dtype: str, sf_kind: str):
    """Build the PrimFunc for one scale layout (fp32 input only)."""
    if in_dtype != "float32" or sf_kind not in SF_KINDS:
        raise ValueError(f"per_token_cast_e5m6_fp32: unsupported variant {in_dtype!r} {sf_kind!r}")
    # every cached unit's loads issued before the first amax (zeros past the row), under
    # __launch_bounds__(128, MIN_BLOCKS)
    return e5m6_kernel(in_dtype, sf_kind, cached=CACHED, loads_first=True, min_blocks=MIN_BLOCKS)


KERNELS = (
    KernelDecl(
        name="quant.per_token_cast_e5m6_fp32",
        factory=per_token_cast_e5m6_fp32,
        grid=product(in_dtype=["float32"], sf_kind=list(SF_KINDS)),
        outputs=("out", "out_sf"),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # e5m6_kernel guards every access
        doc="quant.per_token_cast_e5m6 for fp32 x: 4 cached units per thread, 8 blocks per SM.",
        meta={"cached_units": CACHED},
    ),
)

__all__ = ["CACHED", "KERNELS", "per_token_cast_e5m6_fp32"]
