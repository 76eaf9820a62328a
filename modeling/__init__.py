"""``tilebin.modeling``: autograd layers over :mod:`tilebin.ops` (``tile_kernels.modeling``'s API).

``from tilebin.modeling import engram`` replaces ``from tile_kernels.modeling import engram``.
Nothing is imported here; each submodule imports torch and :mod:`tilebin.ops` only.
"""
