"""Every ``tilebin.ops`` op as a ``torch.library`` custom op, ``tilebin::<op>``, for ``torch.compile``
and ``torch.export``; eager calls never go through it.

An op declares itself once, next to its code, as a :class:`TorchOp`: its schema (with ``(a!)`` on
what it mutates), the public function, and, where the public signature does not map one to one
onto the schema (a ``(data, sf)`` pair, an optional ``out``, outputs that are views of one
buffer), the two conversions.  From that declaration come:

* the registration (:func:`register_all`): the real implementation is the public function, the
  fake implementation is the same function run on fake tensors with ``ops._common.TRACING`` set
  (launches are no-ops, pointers read 0, nothing is memoized), so shapes, dtypes, strides and
  argument errors come from the op's one code path;
* the dispatch: each public op starts with
  ``if is_compiling() and not TRACING.on: return traced("<op>", *args)`` -- under
  ``torch.compile`` / ``torch.export`` it records ``tilebin::<op>`` instead of running.  In eager
  mode that costs one ``torch.compiler.is_compiling()`` call (~0.1 us), never a custom-op dispatch
  (~20-30 us).

Registration happens at the first traced call (the registering function carries the marker
``torch.compiler.assume_constant_result`` sets, so dynamo runs it while tracing, with no graph
break), or explicitly with :func:`register_all` -- which a process must call before ``torch.export.load`` of a program that
uses tilebin ops.  Importing ``tilebin.ops`` registers nothing (~10 ms) and imports no
``torch._dynamo`` (seconds; a test checks it).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any, Callable, Optional

import torch

from tilebin.runtime._record import record

from ._common import TRACING, check_flag, check_int, fail

# modules that declare TORCH_OPS (imported by register_all, in this order): one per family
# (quant, moe and mHC keep theirs beside the ops, in _torch_ops.py), or the op module itself
OP_MODULES = (
    "tilebin.ops.quant._torch_ops", "tilebin.ops.moe._torch_ops",
    "tilebin.ops.engram._gate", "tilebin.ops.engram._hash", "tilebin.ops.transpose._torch_ops",
    "tilebin.modeling.mhc.ops._torch_ops",
)
NAMESPACE = "tilebin"


def pair_to_schema(x: Any, *rest: Any) -> tuple:
    """A ``(data, sf)`` input as the schema's ``x, x_sf`` (a plain tensor: ``x, None``)."""
    data, x_sf = (x[0], x[1]) if isinstance(x, tuple) and len(x) == 2 else (x, None)
    return (data, x_sf, *rest)


def pair_to_public(x: torch.Tensor, x_sf: Optional[torch.Tensor], *rest: Any) -> tuple:
    """The schema's ``x, x_sf`` as the public input: ``(x, x_sf)``, or ``x`` when x_sf is None."""
    return ((x, x_sf) if x_sf is not None else x, *rest)


def _same(*args: Any) -> tuple:
    return args


def _one(result: Any) -> Any:
    return result


@record
class TorchOp:
    """How public op ``name`` maps onto the custom op ``tilebin::<name>``.

    ``schema``: the argument and return list, e.g. ``"(Tensor x, int n) -> Tensor"``.
    ``public``: the op itself (the real implementation).  ``fake``: the op's checked path that
    never consults a memo (default ``public``; the quantization ops' memo lookups are not
    guarded by ``TRACING``, so they name their checked path here).
    ``to_schema(*public_args)``: the schema's arguments (default: the same, in order).
    ``to_public(*schema_args)``: back (default: the same).
    ``result_to_schema(result)`` / ``result_to_public(outputs)``: the public result as the
    schema's outputs (none for ``-> ()``) and back (default: unchanged).
    ``eager_only(*public_args)``: True where the call cannot be traced (its output size depends
    on data); it then runs eagerly through ``torch.compiler.disable``: a graph break on purpose,
    an error under ``fullgraph=True``.
    """

    name: str
    schema: str
    public: Callable[..., Any]
    fake: Optional[Callable[..., Any]] = None
    to_schema: Callable[..., tuple] = _same
    to_public: Callable[..., tuple] = _same
    result_to_schema: Callable[[Any], Any] = _one
    result_to_public: Callable[[Any], Any] = _one
    eager_only: Optional[Callable[..., bool]] = None

    def run(self, *schema_args: Any, **schema_kwargs: Any) -> Any:
        """The real implementation: the public op on the schema's arguments."""
        args = self.to_public(*_complete(self.name, schema_args, schema_kwargs))
        return self.result_to_schema(self.public(*args))

    def run_fake(self, *schema_args: Any, **schema_kwargs: Any) -> Any:
        """The fake implementation: the op's own code on fake tensors, launching nothing."""
        full = _complete(self.name, schema_args, schema_kwargs)
        args = self.to_public(*full)
        # torch calls a fake implementation with its fake mode off: allocations need it back on
        # (else torch.empty(device=x.device) would allocate real device memory)
        mode = next(t.fake_mode for t in full if isinstance(t, torch.Tensor) and hasattr(t, "fake_mode"))
        before = TRACING.on
        TRACING.on = True
        try:
            with mode:
                return self.result_to_schema((self.fake or self.public)(*args))
        finally:
            TRACING.on = before


def _complete(name: str, args: tuple, kwargs: dict) -> tuple:
    """Every schema argument in order: the dispatcher drops trailing ones equal to their defaults
    and may pass some by name.  Lists (``int[]``) become the tuples the public ops take."""
    full = [tuple(a) if type(a) is list else a for a in args]  # int[] arguments: the ops take tuples
    for arg, _, default in _ARGS[name][len(args):]:
        full.append(kwargs.get(arg, default))
    return tuple(full)


_OPS: dict[str, TorchOp] = {}
_LIB: list[Any] = []
_LOCK = threading.Lock()


def register_all() -> dict[str, TorchOp]:
    """Register every op as ``tilebin::<op>`` (idempotent, thread-safe); returns them by name."""
    with _LOCK:
        if not _LIB:
            lib = torch.library.Library(NAMESPACE, "FRAGMENT")
            ops: dict[str, TorchOp] = {}
            for module in OP_MODULES:
                for op in importlib.import_module(module).TORCH_OPS:
                    _register(lib, op)
                    ops[op.name] = op
            _OPS.update(ops)
            _LIB.append(lib)
    return _OPS


# op -> ((argument name, schema type, default), ...), read once at registration: the real and fake
# implementations and the tracing-time coercion use it without looking the schema up again
_ARGS: dict[str, tuple[tuple[str, str, Any], ...]] = {}


def _register(lib: Any, op: TorchOp) -> None:
    lib.define(op.name + op.schema)
    for key in ("CUDA", "CPU"):  # CPU: the ops' tests run them on CPU tensors with the launch stubbed
        lib.impl(op.name, op.run, key)
    torch.library.register_fake(f"{NAMESPACE}::{op.name}", op.run_fake, lib=lib)
    # read the schema only now: looking the op up before register_fake hides the fake implementation
    schema = getattr(getattr(torch.ops, NAMESPACE), op.name).default._schema
    _ARGS[op.name] = tuple((a.name, _kind(a.type), a.default_value) for a in schema.arguments)


def _kind(t: Any) -> str:
    """A schema type as ``Tensor``, ``int``, ``int[]``, ``bool``, ``float``, ``str`` (ScalarType reads as
    int), with ``?`` when optional."""
    optional = t.kind() == "OptionalType"
    name = str(t.getElementType() if optional else t).replace("List[int]", "int[]")
    return name + ("?" if optional else "")


def _registered() -> bool:
    """Registers at trace time (dynamo runs this once and keeps its result: no graph break)."""
    register_all()
    return True


# What torch.compiler.assume_constant_result(_registered) does, without its import of
# torch._dynamo (seconds at `import tilebin.ops`, and not needed unless something compiles).
# tests/ops/test_torch_library.py compiles with fullgraph=True: a rename of the marker fails it.
_registered._dynamo_marked_constant = True  # type: ignore[attr-defined]


def traced(name: str, *args: Any) -> Any:
    """Public op ``name`` on ``args`` (its parameters in order) as the custom op ``tilebin::<name>``:
    what an op does while ``torch.compile`` or ``torch.export`` traces it."""
    _registered()
    op = _OPS[name]
    if op.eager_only is not None and op.eager_only(*args):
        return torch.compiler.disable(op.public, recursive=True)(*args)
    schema_args = _coerce(op, op.to_schema(*args))
    outputs = getattr(getattr(torch.ops, NAMESPACE), name)(*schema_args)
    return op.result_to_public(outputs)


def _coerce(op: TorchOp, args: tuple) -> tuple:
    """``args`` as the schema's types, or the ArgumentError the op raises for a wrong type
    (bools: bool or 0/1 as the ops take them; ints: no bools; floats: ints too)."""
    out = []
    for (name, kind, _), value in zip(_ARGS[op.name], args):
        if value is None and not kind.endswith("?"):
            raise fail(op.name, f"{name} is required, got None")
        kind = kind.rstrip("?")
        if value is None:
            out.append(value)
        elif kind == "Tensor":
            if not isinstance(value, torch.Tensor):
                raise fail(op.name, f"{name} must be a torch.Tensor, got {type(value).__name__}")
            out.append(value)
        elif kind == "bool":
            out.append(check_flag(op.name, name, value))
        elif kind == "int":  # also ScalarType (a torch.dtype)
            out.append(value if isinstance(value, torch.dtype) else check_int(op.name, name, value, -2**63, 2**63 - 1))
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise fail(op.name, f"{name} must be a float, got {type(value).__name__} {value!r}")
            out.append(float(value))
        elif kind == "int[]":
            if not isinstance(value, (tuple, list)):
                raise fail(op.name, f"{name} must be a tuple of ints, got {type(value).__name__} {value!r}")
            out.append([check_int(op.name, name, v, -2**63, 2**63 - 1) for v in value])
        elif kind == "str" and not isinstance(value, str):
            raise fail(op.name, f"{name} must be a str, got {type(value).__name__} {value!r}")
        else:  # the op's own checks judge the value
            out.append(value)
    return tuple(out)


__all__ = ["TorchOp", "register_all", "traced", "OP_MODULES", "pair_to_schema", "pair_to_public"]
