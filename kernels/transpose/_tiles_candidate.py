"""Speed trial (issue 12): ``transpose.batched_transpose``'s aligned path with other block shapes
and residency targets, for large bf16 and fp8 problems, where the shipped tiles trail tile_kernels
by 2-8 % (8192 x 7168: bf16 61.9 vs 60.6 µs, fp8 34.6 vs 31.9; H200, 2026-12-02 16:40 UTC).

Same PrimFunc as the shipped kernel (:func:`batched_transpose.tiled_transpose`), same bits; only
``warps_r x warps_c`` (tile ``warps_r * 8 * VEC`` x ``warps_c * 4 * VEC``) and ``min_blocks``
(``__launch_bounds__``' blocks per SM) differ.  Variant key ``shape`` = ``"WRxWC/MB"``.  Timed by
``bench/bench_transpose.py --cand``; removed once one ships or all are dropped.
"""

from .._declare import KernelDecl
from .batched_transpose import tiled_transpose

# dtype -> shapes "warps_r x warps_c / min_blocks" (the shipped ones: bf16 2x4/4, fp8 2x4/2)
SHAPES = {
    "bfloat16": ("1x4/8", "2x2/8", "4x4/2", "2x4/3", "1x2/16"),
    "float8_e4m3fn": ("1x2/8", "1x2/10", "2x2/4", "1x4/4"),
}


def tiles_candidate(dtype: str, shape: str):
    """The tiled transpose of ``dtype`` with the block shape and residency ``shape``."""
    warps, min_blocks = shape.split("/")
    warps_r, warps_c = (int(v) for v in warps.split("x"))
    return tiled_transpose(dtype, warps_r, warps_c, int(min_blocks))


KERNELS = (
    KernelDecl(
        name="transpose._tiles_candidate",
        factory=tiles_candidate,
        grid=tuple({"dtype": d, "shape": s} for d, shapes in SHAPES.items() for s in shapes),
        outputs=("out",),
        doc="Speed trial: transpose.batched_transpose's tiles with other block shapes / residency.",
    ),
)

__all__ = ["KERNELS", "SHAPES", "tiles_candidate"]
