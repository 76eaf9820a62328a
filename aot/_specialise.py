"""``KernelDecl.specialise``: a PrimFunc with some run-time size symbols bound to constants.

The symbols are the ``T.dynamic`` names in the tensor parameters' shapes and strides.  TVM's
``PrimFunc.specialize`` binds them through the buffers: each tensor parameter whose shape or
strides name a symbol as a bare dim is matched to a buffer with that dim fixed; the value then
replaces the symbol everywhere in the function (loop bounds, index arithmetic, other buffers'
expressions).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import AotError


def size_symbols(func: Any) -> dict[str, Any]:
    """``{name: Var}`` of the bare size symbols in the tensor parameters' shapes and strides."""
    from tilelang import tvm

    found = {}
    for buf in func.buffer_map.values():
        for e in (*buf.shape, *buf.strides):
            if isinstance(e, tvm.tirx.Var):
                found.setdefault(e.name, e)
    return found


def specialise(func: Any, values: Mapping[str, int], where: str) -> Any:
    """``func`` with the size symbols ``values`` bound (AotError naming the symbols there are, when
    one is not a bare dim of a tensor parameter)."""
    from tilelang import tvm

    tirx = tvm.tirx
    symbols = size_symbols(func)
    missing = sorted(set(values) - set(symbols))
    if missing:
        raise AotError(f"{where}: specialise names {', '.join(map(repr, missing))}, which is not a size symbol of "
                       f"any tensor parameter (those are: {', '.join(sorted(symbols)) or 'none'}); fix the "
                       f"KernelDecl's specialise")
    bound = {n: tirx.IntImm(symbols[n].dtype, v) for n, v in values.items()}

    def is_bound(e: Any) -> bool:
        return isinstance(e, tirx.Var) and e.name in bound and e.same_as(symbols[e.name])

    def fixed(e: Any) -> Any:
        return bound[e.name] if is_bound(e) else e

    mapping = {}
    for param, buf in func.buffer_map.items():
        if not any(is_bound(e) for e in (*buf.shape, *buf.strides)):
            continue
        mapping[param] = tirx.decl_buffer([fixed(e) for e in buf.shape], buf.dtype, buf.name,
                                          strides=[fixed(e) for e in buf.strides], elem_offset=buf.elem_offset,
                                          data_alignment=buf.data_alignment, offset_factor=buf.offset_factor,
                                          scope=buf.scope())
    try:
        return func.specialize(mapping)
    except Exception as exc:  # TVM's own checks: name the job and the symbols
        raise AotError(f"{where}: binding {dict(values)} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
