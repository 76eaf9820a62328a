"""Translate TIR integer expressions into the manifest's expression trees (runtime/_expr.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tilelang import tvm
from tvm import tirx

from ._errors import AotError

_BINARY = {
    tirx.Add: "add",
    tirx.Sub: "sub",
    tirx.Mul: "mul",
    tirx.FloorDiv: "floordiv",
    tirx.FloorMod: "floormod",
    tirx.Div: "truncdiv",
    tirx.Mod: "truncmod",
    tirx.Min: "min",
    tirx.Max: "max",
    # comparisons and logic: variant conditions (T.assume), see aot/_conditions.py
    tirx.EQ: "eq",
    tirx.NE: "ne",
    tirx.LT: "lt",
    tirx.LE: "le",
    tirx.GT: "gt",
    tirx.GE: "ge",
    tirx.And: "and",
    tirx.Or: "or",
}


def to_tree(expr: Any, where: str, lets: Mapping[str, Any] | None = None,
            rename: Callable[[str], str] | None = None) -> Any:
    """TIR expression -> int | symbol | [op, a, b].

    ``lets`` maps names of host-side let-bound variables to their values, inlined where
    they are not runtime symbols themselves; ``rename`` maps a variable name to the
    symbol the manifest uses.  Anything else (loads, calls, floats) is an AotError:
    the launch cannot be expressed as data.
    """
    lets = lets or {}
    if isinstance(expr, int) and not isinstance(expr, bool):
        return expr
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.Var):
        name = expr.name
        if name in lets:
            return to_tree(lets[name], where, lets, rename)
        return rename(name) if rename else name
    if isinstance(expr, tirx.Cast):
        if not str(expr.dtype).startswith(("int", "uint")):
            raise AotError(f"{where}: cast to {expr.dtype} in a launch expression: {expr}")
        return to_tree(expr.value, where, lets, rename)
    if isinstance(expr, tirx.Not):
        return ["not", to_tree(expr.a, where, lets, rename)]
    for node_type, op in _BINARY.items():
        if isinstance(expr, node_type):
            return [op, to_tree(expr.a, where, lets, rename), to_tree(expr.b, where, lets, rename)]
    raise AotError(
        f"{where}: the launch expression `{expr}` ({type(expr).__name__}) cannot be written into "
        "the manifest; express grid/argument sizes with + - * // % min max over shape symbols"
    )


def host_lets(host_func: tirx.PrimFunc) -> dict[str, Any]:
    """Let-bound scalar variables in the host function body, by name."""
    lets: dict[str, Any] = {}

    def visit(node: Any) -> None:
        if isinstance(node, (tirx.Bind, tirx.Let)):
            lets[node.var.name] = node.value

    tvm.tirx.stmt_functor.post_order_visit(host_func.body, visit)
    return lets
