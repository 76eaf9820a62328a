"""``tilebin.modeling.engram``: the Engram gate as a ``torch.autograd.Function``
(``tile_kernels.modeling.engram`` 1.0.0 API: ``engram_gate``, ``EngramGateFn``)."""

from ._gate import EngramGateFn, engram_gate

__all__ = ["EngramGateFn", "engram_gate"]
