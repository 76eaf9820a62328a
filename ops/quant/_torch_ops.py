"""``tilebin::<op>`` declarations of the ``tilebin.ops.quant`` ops (see ``ops/_torch.py``).

Each op module declares its own ``TORCH_OPS`` (a :class:`TorchOp` per public op, or its
``OpSpec.torch_op``) beside the op; this module gathers them for ``register_all``.
"""

from __future__ import annotations

from . import _cast_back, _e5m6, _per_block, _per_channel, _per_token, _swiglu

TORCH_OPS = (*_per_token.TORCH_OPS, *_per_block.TORCH_OPS, *_per_channel.TORCH_OPS, *_swiglu.TORCH_OPS,
             *_cast_back.TORCH_OPS, *_e5m6.TORCH_OPS)
