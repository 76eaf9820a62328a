"""Launch expressions: small trees over runtime symbols, stored as JSON data in the manifest.

A tree is an ``int``, a ``str`` (a runtime symbol: a dynamic dim, a stride or a scalar
argument), or a list ``[op, arg, ...]`` with ``op`` in :data:`OPS`.  Trees are checked when
the manifest is parsed and interpreted here; nothing from an artifact is ever passed to
``eval``/``exec``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Union

from ._errors import ArtifactError

Expr = Union[int, str, list]
Env = Mapping[str, Any]


def _truncdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


OPS: dict[str, tuple[int, Callable[..., Any]]] = {
    "add": (2, lambda a, b: a + b),
    "sub": (2, lambda a, b: a - b),
    "mul": (2, lambda a, b: a * b),
    "floordiv": (2, lambda a, b: a // b),
    "floormod": (2, lambda a, b: a % b),
    "truncdiv": (2, _truncdiv),
    "truncmod": (2, lambda a, b: a - _truncdiv(a, b) * b),
    "min": (2, min),
    "max": (2, max),
    "neg": (1, lambda a: -a),
    # variant conditions (VariantSpec.conditions): comparisons and logic, 1 for true, 0 for false
    "eq": (2, lambda a, b: int(a == b)),
    "ne": (2, lambda a, b: int(a != b)),
    "lt": (2, lambda a, b: int(a < b)),
    "le": (2, lambda a, b: int(a <= b)),
    "gt": (2, lambda a, b: int(a > b)),
    "ge": (2, lambda a, b: int(a >= b)),
    "and": (2, lambda a, b: int(bool(a) and bool(b))),
    "or": (2, lambda a, b: int(bool(a) or bool(b))),
    "not": (1, lambda a: int(not a)),
}

# how to_text spells each operator, and its precedence (higher binds tighter), Python's
_TEXT = {"add": ("+", 5), "sub": ("-", 5), "mul": ("*", 6), "floordiv": ("//", 6), "floormod": ("%", 6),
         "eq": ("==", 3), "ne": ("!=", 3), "lt": ("<", 3), "le": ("<=", 3), "gt": (">", 3), "ge": (">=", 3),
         "and": ("and", 1), "or": ("or", 0)}


def symbols_of(tree: Expr) -> set[str]:
    """The runtime symbols a tree reads."""
    if isinstance(tree, str):
        return {tree}
    if isinstance(tree, list):
        found: set[str] = set()
        for arg in tree[1:]:
            found |= symbols_of(arg)
        return found
    return set()


def check_expr(tree: Expr, where: str = "expression") -> None:
    """Raise :class:`ArtifactError` unless ``tree`` is a well-formed expression."""
    if isinstance(tree, bool) or not isinstance(tree, (int, str, list)):
        raise ArtifactError(f"{where}: expected int, symbol or [op, ...], got {tree!r}")
    if isinstance(tree, list):
        if not tree or tree[0] not in OPS:
            raise ArtifactError(f"{where}: unknown operator in {tree!r}; known: {sorted(OPS)}")
        if len(tree) != OPS[tree[0]][0] + 1:
            raise ArtifactError(f"{where}: {tree[0]!r} takes {OPS[tree[0]][0]} operand(s), got {tree!r}")
        for arg in tree[1:]:
            check_expr(arg, where)


def evaluate(tree: Expr, env: Env) -> Any:
    """The value of a checked tree with ``env`` binding its symbols (KeyError if one is unbound)."""
    if isinstance(tree, list):
        return OPS[tree[0]][1](*(evaluate(a, env) for a in tree[1:]))
    return env[tree] if isinstance(tree, str) else tree


def to_text(tree: Expr) -> str:
    """A checked tree as Python-like text, for messages: ``["eq", ["floormod", "n", 16], 0]`` ->
    ``n % 16 == 0``."""
    return _text(tree, -1)


def _text(tree: Expr, outer: int) -> str:
    if not isinstance(tree, list):
        return str(tree)
    op, args = tree[0], tree[1:]
    if op in _TEXT:
        sym, prec = _TEXT[op]
        compare = prec == 3  # comparisons do not chain: parenthesise both sides
        left = prec + 1 if compare else prec
        right = prec if op in ("and", "or", "add", "mul") else prec + 1  # associative ones need none
        text = f"{_text(args[0], left)} {sym} {_text(args[1], right)}"
        return f"({text})" if prec < outer else text
    if op == "not":
        return f"not {_text(args[0], 2)}" if outer <= 2 else f"(not {_text(args[0], 2)})"
    if op == "neg":
        return f"-{_text(args[0], 7)}"
    return f"{op}({', '.join(_text(a, -1) for a in args)})"
