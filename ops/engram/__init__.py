"""``tilebin.ops.engram``: the Engram ops of ``tile_kernels.engram`` 1.0.0, same API.

``engram_hash`` (n-gram hashes into embedding-table rows), ``fused_weight`` (the gate's fused
RMSNorm weight), ``engram_gate_fwd`` / ``engram_gate_bwd`` (the gate and its gradients) and
``grad_w_reduce`` (the weight gradients from the backward's per-block partials, accumulated in
place, e.g. into ``main_grad``).  ``from tilebin.ops import engram`` replaces ``from tile_kernels
import engram``; the autograd layer is :mod:`tilebin.modeling.engram`.  Hidden size, token
count, hc_mult, eps, clamp value and SM count are run-time values.
"""

from ._gate import engram_gate_bwd, engram_gate_fwd, grad_w_reduce
from ._hash import engram_hash, fused_weight

__all__ = ["engram_gate_bwd", "engram_gate_fwd", "engram_hash", "fused_weight", "grad_w_reduce"]
