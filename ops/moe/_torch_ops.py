"""``tilebin::<op>`` declarations of the ``tilebin.ops.moe`` ops (see ``ops/_torch.py``).

Each op module declares its own ``TORCH_OPS`` (a :class:`TorchOp` per public op) or ``SPECS``
(its ``OpSpec`` objects, which write their declarations) beside the ops; this module gathers
them for ``register_all``.
"""

from __future__ import annotations

from . import _gating, _routing, _stats

TORCH_OPS = (*_gating.TORCH_OPS, *_routing.TORCH_OPS,
             *(spec.torch_op(getattr(_stats, spec.name)) for spec in _stats.SPECS))
