"""Speed candidates of ``mhc.multilayer_recompute`` (issue 9, round 6): the shipped kernel
(``multilayer_recompute.py``) with other (S, ITEMS, blocks per SM) at M = 4; M = 2 and 8 as shipped.
Same parameters, variants and bits (only the launch shape and the ring depth change).

Hypothesis: wave quantisation.  At M = 4 the shipped (3, 4, 5) makes ``tokens * chunks / 4`` blocks
and 132 x 5 = 660 resident: at 4096 x 4096 that is 4096 blocks = 6.2 waves (the last one 20 % full),
the shape that stays below 90 % of copy (89.3 %); 4096 x 7168 is 10.9 waves (91.4 %), 8192 x 4096
12.4 (92.4 %), 8192 x 7168 21.7 (93.4 %).  Two-item blocks make 12.4 waves at 4096 x 4096; three-item
blocks 8.3.
"""

from functools import partial

from .._declare import KernelDecl
from .multilayer_recompute import CONFIGS, MULTS, PASS_CONFIGS, multilayer_recompute

VARIANTS = {"i2s3": (3, 2, 5), "i2s2": (2, 2, 5), "i3s3": (3, 3, 5)}  # tag -> M = 4's (S, ITEMS, blocks/SM)


def _variant(tag: str, mhc_mult: int):
    """The shipped kernel with ``VARIANTS[tag]`` at M = 4, as shipped at M = 2 and 8."""
    return multilayer_recompute(mhc_mult, VARIANTS[tag] if mhc_mult == 4 else CONFIGS[mhc_mult])


KERNELS = tuple(
    KernelDecl(
        name=f"mhc._multilayer_recompute_candidate_{tag}",
        factory=partial(_variant, tag),
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=(),
        pass_configs=PASS_CONFIGS,
        doc=f"Speed candidate for mhc.multilayer_recompute: M = 4 at (S, ITEMS, blocks/SM) = {VARIANTS[tag]}.",
    )
    for tag in VARIANTS
)
