"""``tilebin.ops.transpose``: the transpose ops of ``tile_kernels.transpose`` 1.0.0, same API.

``transpose(x)`` (2-D ``[m, n]`` -> ``[n, m]``) and ``batched_transpose(x)`` (3-D ``[b, m, n]``
-> ``[b, n, m]``) return a fresh contiguous tensor of x's dtype, so ``from tilebin.ops import
transpose`` replaces ``from tile_kernels import transpose``.  Unlike tile_kernels, ``m`` and ``n``
need not be multiples of 64 (any size, 0 and 1 included), and x may have any strides.
"""

from ._transpose import batched_transpose, transpose

__all__ = ["batched_transpose", "transpose"]
