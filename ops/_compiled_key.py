"""An op's memo key for its tensors, read in C (``csrc/_hot_opkey.h``) where the runtime can.

An op's generated call (``_spec._compile_call``) reads each tensor's dtype, device, rank and sizes
for its memo key and then runs the per-call tests of a replayed configuration (contiguity, pointer
alignment, an element limit, token counts that must agree).  Through torch's Python accessors that
is ~0.3 µs a tensor.  When the runtime's compiled hot path reads torch tensors through torch's C
shim (``tilebin.runtime._tensors.op_key``), :func:`compiled_key` hands those reads, for every
TensorParam with the standard key, to one C call, and the generated call becomes:

1. under torch.compile/export: record the custom op (as before);
2. ``tk = key_in_c(a0, a1, ...)``: ``False`` (a tensor the shim does not read: not on the GPU, a
   subclass, a fake tensor, not a tensor at all) or ``None`` (a per-call test or a ``Fast`` failed)
   runs the Python-key call (``_py``, the same function as without the compiled key): its own
   per-call checks and ``run`` say what is wrong, or run a call that a test was stricter than
   (e.g. a view that ``run`` copies aligned), and replay it from then on;
3. the memo key is ``(tk, <the other parameters' key parts>)``, and a stored configuration runs
   the per-call checks the C call did not make (a subclass's ``call_test``, the spec's
   ``per_call``) and its launch: ``run``, or ``run.fast`` where parameters declare ``Fast`` (the
   C call tested those facts too, so the run's own per-call test is skipped).

The two keys never meet in the memo (the compiled one holds bytes), and either one stores only a
configuration whose every check passed.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from tilebin.runtime._tensors import op_key

_OPTIONAL, _ROWS, _CONTIGUOUS = 1, 2, 4  # csrc/_hot_opkey.h: OK_OPTIONAL, OK_ROWS, OK_CONTIG


class CompiledKey(NamedTuple):
    key: Any  # the bound OpKey.key
    keyed: frozenset  # parameter indices whose key part it reads
    covered: frozenset  # ... whose per-call checks it makes (TensorParam's own check_call)
    fast: bool  # it also tests every parameter's Fast: a replay runs the plan's run.fast


def compiled_key(spec: Any) -> Optional[CompiledKey]:
    """The C key of ``spec``'s tensors, or None (no compiled hot path or shim, or no such tensor)."""
    from ._spec import TensorParam

    params = spec.params
    picked = [i for i, p in enumerate(params) if isinstance(p, TensorParam) and type(p).key is TensorParam.key]
    if not picked:
        return None
    entry_of = {params[i].name: n for n, i in enumerate(picked)}
    entries, covered = [], set()
    fast = getattr(spec, "_fast", False)
    if fast and any(getattr(p, "fast", None) is not None for i, p in enumerate(params) if i not in picked):
        return None  # a Fast it cannot test (a TensorParam with its own key): run.fast is never safe
    for i in picked:
        p = params[i]
        own = type(p).check_call is TensorParam.check_call  # its per-call checks are contiguity, limit, alignment
        f = p.fast
        limits = [n for n in (p.max_numel if own else None, f and f.max_numel) if n is not None]
        flags = (_OPTIONAL if p.optional else 0) | (_ROWS if p.rows_vary else 0) | (
            _CONTIGUOUS if (own and p.contiguous) or (f and f.contiguous) else 0)
        rows_of = entry_of[p.rows_of] if p.rows_of is not None else -1  # (declarations checked at import)
        entries.append((i, flags, -1 if p.ndim is None else p.ndim, max(p.ptr_align if own else 0, f.align if f else 0),
                        min(limits) if limits else -1, rows_of))
        if own:
            covered.add(i)
    c = op_key(len(params), tuple(entries))
    return None if c is None else CompiledKey(c.key, frozenset(picked), frozenset(covered), fast)


def compiled_call_lines(spec: Any, env: dict, c: CompiledKey, names: str, args: str, compile_test: list,
                        rest_key: str, checks: list) -> list[str]:
    """The generated ``call`` with the compiled key (the module docstring); ``_py`` is defined before it."""
    env["_ck"] = c.key
    key = "tk" if rest_key == "()" else f"(tk, {rest_key})"
    return [f"def call({names}):",
            *compile_test,
            f"    tk = _ck({names})",
            "    if not tk:  # a tensor the C call does not read, or a failed test: the Python key and checks",
            f"        return _py({names})",
            "    try:",
            f"        key = {key}",
            "        run = _spec.memo.get(key)",
            "    except (AttributeError, TypeError, IndexError, ValueError):",
            f"        return _spec.checked({args}, None)",
            "    if run is None or _TR.on:",
            f"        return _spec.checked({args}, key)",
            *checks,
            f"    return run{'.fast' if c.fast else ''}({names})", ""]
