"""``quant.per_token_cast_e5m6``: bf16 -> packed E5M6 with one scale per token (fp32 input:
``quant.per_token_cast_e5m6_fp32``, the same algorithm with 4 cached units per thread).

Per token: ``amax = max |x|``; ``sf = max(amax, 1e-4) / 65024`` and ``sf_inv = 65024 / max(amax,
1e-4)`` (two IEEE divisions), or with ``round_sf`` sf rounded up to a power of two and sf_inv its
exact inverse.  Each ``v = x_fp32 * sf_inv`` becomes a 12-bit code: the top 12 bits of the half
that truncates ``v`` toward zero, plus one when the 17 low bits of ``v``'s fp32 pattern exceed
0x10000 (or equal it with an odd code); eight codes pack into three uint32 words (see
``cast_back_e5m6.py``).  Bit-for-bit the torch reference (``quant_ref.cast_to_e5m6``).

Parameters, in order:

* ``x``: ``[num_tokens, hidden]`` bfloat16, row stride ``x_stride`` (runtime), unit column
  stride.  (The factory also builds float32; the grid leaves it to ``quant.per_token_cast_e5m6_fp32``,
  which measured faster: 8 blocks per SM instead of 5.)
* ``out``: ``[num_tokens, out_bytes]`` uint8, ``out_bytes = hidden * 3 // 2``, contiguous.
* ``out_sf``: kernel orientation of a ``(1, hidden)``-block scale tensor: ``row`` fp32
  ``[num_tokens, 1]``; ``col`` fp32 ``[1, num_tokens]``; ``ue8m0`` uint8 ``[1, 4 * num_tokens]``
  (byte ``4 t`` the exponent, bytes ``4 t + 1..3`` written 0); runtime row stride ``sf_stride``.
* ``round_sf`` (int, 0/1; the ``ue8m0`` variant needs 1), ``tokens_per_block`` (1, 2 or 4).

Rules the op checks: ``hidden % 8 == 0``; x's row stride and pointer 16-byte aligned; int32
element counts.

Design: a block of 4 warps serves ``tokens_per_block`` tokens; a token's ``32 * 4 /
tokens_per_block`` threads own its 8-value units round robin (unit ``j`` of the row: 16 (bf16)
or 32 (fp32) input bytes, 12 output bytes), so a warp's loads cover 512 contiguous bytes.  The
first ``CACHED`` units of each thread stay in registers between the amax pass and the cast pass
(a full 7168-wide bf16 row with one token per block); units past those (hidden above
``CACHED * 8 * 128``) are read twice, the second time from L1/L2.  The amax is reduced with warp
shuffles and a 4-float shared array.  The op picks ``tokens_per_block`` so that short rows keep
every warp busy (4 tokens for hidden <= 2048, 2 up to 4096, else 1).

The code arithmetic and the kernel body live in ``_e5m6_common.py``, shared with
``quant.per_token_cast_e5m6_fp32``; this kernel is its ``CACHED = 8``, load-then-amax form.
"""

from .._declare import KernelDecl, product
from ._e5m6_common import IN_WORDS, SF_KINDS, e5m6_kernel

CACHED = 8  # units per thread kept in registers between the two passes


def per_token_cast_e5m6(in_dtype: str, sf_kind: str):
    """Build the PrimFunc for one (input dtype, scale layout)."""
    if in_dtype not in IN_WORDS or sf_kind not in SF_KINDS:
        raise ValueError(f"per_token_cast_e5m6: unsupported variant in_dtype={in_dtype!r} sf_kind={sf_kind!r}")
    # each cached unit loaded, then its amax taken; no __launch_bounds__ minimum
    return e5m6_kernel(in_dtype, sf_kind, cached=CACHED, loads_first=False, min_blocks=0)


KERNELS = (
    KernelDecl(
        name="quant.per_token_cast_e5m6",
        factory=per_token_cast_e5m6,
        grid=product(in_dtype=["bfloat16"], sf_kind=list(SF_KINDS)),  # fp32: quant.per_token_cast_e5m6_fp32
        outputs=("out", "out_sf"),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # e5m6_kernel guards every access
        doc="Per-token E5M6 cast (one scale per token): bf16 -> uint8 [tokens, hidden*3/2] + sf.",
    ),
)

__all__ = ["CACHED", "KERNELS", "per_token_cast_e5m6"]
