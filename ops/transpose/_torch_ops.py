"""``tilebin::<op>`` declarations of the ``tilebin.ops.transpose`` ops (see ``ops/_torch.py``)."""

from __future__ import annotations

from .._torch import TorchOp
from ._transpose import batched_transpose, transpose

TORCH_OPS = (
    TorchOp("transpose", "(Tensor x) -> Tensor", transpose),
    TorchOp("batched_transpose", "(Tensor x) -> Tensor", batched_transpose),
)
