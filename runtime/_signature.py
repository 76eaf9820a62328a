"""The fast plan-cache key of a call whose arguments are all plain ``torch.Tensor``s and numbers.

A key holds, per tensor, (dtype, size, stride, device) and, per scalar, its type (plus its
value when the value feeds a grid, a shape check or a kernel argument's expression).  It is
built without loops or per-argument calls for the common arities; anything else (a
keyword, a tensor subclass, a CUDA-array-interface object, an odd scalar type) returns
``None`` and the call takes the general path, which validates it or says what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable

from ._tensors import TORCH_TENSOR, torch_tensor_type

PLAIN_SCALARS = frozenset((int, float, bool))  # scalar types a plan-cache key may hold
Signature = Callable[[tuple], "tuple | None"]


def fast_signature(nparams: int, tensor_pos: tuple[int, ...], keyed_pos: tuple[int, ...],
                   direct_pos: tuple[int, ...]) -> Signature:
    """``f(args) -> key | None`` for a kernel with these parameter positions."""
    cell = TORCH_TENSOR  # [torch.Tensor] once torch is imported; [None] before
    if not keyed_pos and not direct_pos and len(tensor_pos) in (2, 3):
        return _unrolled(nparams, tensor_pos, cell)

    def signature(v: tuple) -> tuple | None:
        if len(v) != nparams:
            return None
        cls, key = cell[0] or torch_tensor_type(), []
        for i in tensor_pos:
            x = v[i]
            if x.__class__ is not cls:
                return None
            key += (x.dtype, x.size(), x.stride(), x.device)
        for i in keyed_pos:
            s = v[i]
            if s.__class__ not in PLAIN_SCALARS:
                return None
            key += (s.__class__, s)
        for i in direct_pos:
            key.append(v[i].__class__)
        return tuple(key)

    return signature


def _unrolled(nparams: int, tensor_pos: tuple[int, ...], cell: list) -> Signature:
    if len(tensor_pos) == 2:
        a, b = tensor_pos

        def two(v: tuple) -> tuple | None:
            if len(v) != nparams:
                return None
            x, y, cls = v[a], v[b], cell[0] or torch_tensor_type()
            if x.__class__ is not cls or y.__class__ is not cls:
                return None
            return (x.dtype, x.size(), x.stride(), x.device, y.dtype, y.size(), y.stride(), y.device)

        return two
    a, b, c = tensor_pos

    def three(v: tuple) -> tuple | None:
        if len(v) != nparams:
            return None
        x, y, z, cls = v[a], v[b], v[c], cell[0] or torch_tensor_type()
        if x.__class__ is not cls or y.__class__ is not cls or z.__class__ is not cls:
            return None
        return (x.dtype, x.size(), x.stride(), x.device, y.dtype, y.size(), y.stride(), y.device,
                z.dtype, z.size(), z.stride(), z.device)

    return three
