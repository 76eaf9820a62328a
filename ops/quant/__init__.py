"""``tilebin.ops.quant``: the quantization ops of ``tile_kernels.quant`` 1.0.0, same API.

Names, signatures, defaults and output layouts (dtype, shape, strides) follow tile_kernels, so
``from tilebin.ops import quant`` replaces ``from tile_kernels import quant``.  Every op checks
its arguments before touching the GPU (:class:`tilebin.runtime.ArgumentError` naming the op,
the value and what is supported), allocates its outputs and launches on torch's current stream.
"""

from ._cast_back import cast_back, per_token_cast_back, unpack_from_e2m1fn_x2
from ._per_block import (
    per_block_cast,
    per_block_cast_lossless,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
)
from ._per_token import per_token_cast, per_token_cast_with_precomputed_sf, per_token_cast_with_sf_only
from ._per_channel import per_channel_cast, per_channel_cast_and_transpose, per_channel_cast_fused
from ._swiglu import (
    swiglu_backward_and_per_token_cast,
    swiglu_forward_and_per_channel_cast_and_transpose,
    swiglu_forward_and_per_token_cast,
)

__all__ = [
    "per_token_cast", "per_token_cast_with_precomputed_sf", "per_token_cast_with_sf_only",
    "cast_back", "per_token_cast_back", "unpack_from_e2m1fn_x2",
    "per_block_cast", "per_block_cast_lossless", "per_block_cast_with_precomputed_sf", "per_block_cast_with_sf_only",
    "per_channel_cast", "per_channel_cast_and_transpose", "per_channel_cast_fused",
    "swiglu_backward_and_per_token_cast", "swiglu_forward_and_per_channel_cast_and_transpose",
    "swiglu_forward_and_per_token_cast",
]
