"""``tilebin.modeling.mhc``: manifold-constrained hyper-connections (mHC, arXiv:2512.24880), the
``tile_kernels.modeling.mhc`` 1.0.0 API.

The layer-level functions :func:`expand_from_embedding`, :func:`mhc_pre` and :func:`mhc_head` are
here (see :mod:`.functional`); the ops they compose, with ``mhc_post`` and
``mhc_multilayer_recompute``, are in :mod:`tilebin.modeling.mhc.ops`.
"""

from .functional import expand_from_embedding, mhc_head, mhc_pre

__all__ = ["expand_from_embedding", "mhc_head", "mhc_pre"]
