"""``tilebin.modeling``: autograd layers over :mod:`tilebin.ops` (``tile_kernels.modeling``'s API).

``from tilebin.modeling import engram`` replaces ``from tile_kernels.modeling import engram``
(likewise ``mhc``: ``tilebin.modeling.mhc`` and ``tilebin.modeling.mhc.ops``).
Nothing is imported here; each submodule imports torch and :mod:`tilebin.ops` only.
"""
