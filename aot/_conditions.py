"""Variant conditions: what a call must meet for a variant to serve it, as manifest expressions.

Two sources, both written into the variant's ``conditions`` (runtime/_manifest.py
``ConditionSpec``) and checked by the runtime when it picks a variant:

* the kernel's own ``T.assume(cond)`` statements whose condition reads only runtime symbols
  of the kernel's parameters (tensor sizes and strides, scalar parameters): the kernel is
  compiled assuming them, so a call that breaks one must never reach it;
* ``KernelDecl.conditions``: Python-like text such as ``"hidden % 128 == 0"`` or
  ``"n <= 4096 and m % block_m == 0"``, over runtime symbols and the variant's keys (a key
  stands for its value in that variant).  Allowed: integers, names, ``+ - * // %``,
  comparisons (chains too), ``and``, ``or``, ``not``, unary ``-``, parentheses.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import Any

from tilebin.runtime._expr import symbols_of

from ._errors import AotError

_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.FloorDiv: "floordiv", ast.Mod: "floormod"}
_COMPARE = {ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}
_HELP = ("write integers, names, + - * // %, comparisons, and/or/not and parentheses, "
         "e.g. 'hidden % 128 == 0 and num_tokens <= 65536'")


def declared_condition(text: Any, key: Mapping[str, Any], symbols: Iterable[str], where: str) -> Any:
    """``KernelDecl.conditions`` entry ``text`` as an expression tree for one variant."""
    if not isinstance(text, str) or not text.strip():
        raise AotError(f"{where}: a condition must be a non-empty string, got {text!r}; {_HELP}")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise AotError(f"{where}: condition {text!r} is not an expression ({exc.msg}); {_HELP}") from None
    known = set(symbols)
    return _Converter(text, key, known, where).convert(tree)


class _Converter:
    def __init__(self, text: str, key: Mapping[str, Any], symbols: set[str], where: str) -> None:
        self.text, self.key, self.symbols, self.where = text, key, symbols, where

    def fail(self, what: str) -> AotError:
        return AotError(f"{self.where}: condition {self.text!r}: {what}")

    def convert(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) in (int, bool):
            return int(node.value)
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return [_BINOPS[type(node.op)], self.convert(node.left), self.convert(node.right)]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return ["neg", self.convert(node.operand)]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ["not", self.convert(node.operand)]
        if isinstance(node, ast.BoolOp):
            op = "and" if isinstance(node.op, ast.And) else "or"
            return _chain(op, [self.convert(v) for v in node.values])
        if isinstance(node, ast.Compare) and all(type(o) in _COMPARE for o in node.ops):
            sides = [self.convert(node.left)] + [self.convert(c) for c in node.comparators]
            parts = [[_COMPARE[type(o)], a, b] for o, a, b in zip(node.ops, sides, sides[1:])]
            return _chain("and", parts)
        raise self.fail(f"`{ast.unparse(node)}` is not allowed; {_HELP}")

    def _name(self, name: str) -> Any:
        if name in self.key:
            value = self.key[name]
            if type(value) not in (int, bool):
                raise self.fail(f"variant key {name!r} is {value!r}; only int and bool keys can appear in a condition")
            return int(value)
        if name in self.symbols:
            return name
        known = ", ".join(sorted(self.symbols)) or "none"
        keys = ", ".join(sorted(self.key)) or "none"
        raise self.fail(f"{name!r} is neither a runtime symbol of the kernel (sizes, strides, scalars: {known}) "
                        f"nor a variant key ({keys})")


def _chain(op: str, parts: list) -> Any:
    tree = parts[0]
    for p in parts[1:]:
        tree = [op, tree, p]
    return tree


def assumed_conditions(func: Any, symbols: Iterable[str], to_tree: Any, where: str) -> list:
    """The kernel's ``T.assume`` conditions over runtime symbols only, as expression trees, in
    program order (an assume about a loop or thread variable cannot be checked at launch and is
    left out)."""
    from tilelang import tvm
    from tvm import tirx

    known, found = set(symbols), []

    def visit(node: Any) -> None:
        if isinstance(node, tirx.Call) and getattr(node.op, "name", "") == "tirx.assume" and node.args:
            found.append(node.args[0])

    tvm.tirx.stmt_functor.post_order_visit(func.body, visit)
    trees = []
    for cond in found:
        try:
            tree = to_tree(cond, where)
        except AotError:
            continue  # reads something other than integer math over symbols
        if symbols_of(tree) <= known and tree not in trees:
            trees.append(tree)
    return trees
