"""``tilebin::<op>`` declarations of the ``tilebin.ops.transpose`` ops (see ``ops/_torch.py``)."""

from __future__ import annotations

from . import _transpose

# declared by their OpSpecs (ops/_spec.py), which write their schemas
TORCH_OPS = tuple(spec.torch_op(getattr(_transpose, spec.name)) for spec in _transpose.SPECS)
