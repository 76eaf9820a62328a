"""Ops declared once: an :class:`OpSpec` states an op's parameters, outputs and mutations, and how
it launches; everything else about the op comes from it.

* **Checks**: each parameter's type, dtype, rank, range, contiguity and size limit, in the
  wording of :mod:`._common`'s checks, then the op's ``relations`` (checks between parameters),
  then the device of every tensor (last, so CPU tensors reach every other check).
* **Memo key**: a call's configuration is every tensor's dtype, rank, device and sizes but the
  first (the token count), and every other argument with its type (``True``, ``1`` and ``1.0``
  differ).  The first call of a configuration runs every check and builds the op's launch
  (``plan``); a later call of the same configuration runs only the per-call checks (the first
  size's limit, contiguity) and that launch.  A call that fails a check stores nothing.
* **Output allocation** and **launch**: the op's ``plan(values)`` returns the function that
  allocates the outputs and launches for a call's arguments; it is built once per configuration.
* **torch.library**: :meth:`OpSpec.torch_op` is the ``TorchOp`` of ``tilebin::<name>``, its schema
  written from the parameters (mutated tensors marked ``(a!)``) and the declared result; the op's
  tracing dispatch (:meth:`OpSpec.__call__` under ``torch.compile``) records that custom op.

An op module declares ``SPEC = OpSpec(...)`` and a public function with tile_kernels' signature
whose body is ``return SPEC(arg1, arg2, ...)``.  ``ops/README.md`` shows one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.compiler import is_compiling

from ._common import TRACING, check_cuda, check_flag, check_int, check_tensor, fail
from ._torch import TorchOp, traced

_MEMO_MAX = 256  # configurations kept per op (a process sees a handful; the cap bounds a shape sweep)


@dataclass(frozen=True)
class TensorParam:
    """A tensor parameter: one of ``dtypes``, ``ndim`` dims (None: any), contiguous if asked, at
    most ``max_numel`` elements (checked per call), written by the op if ``mutated``."""

    name: str
    dtypes: tuple
    ndim: Optional[int] = None
    contiguous: bool = False
    max_numel: Optional[int] = None
    mutated: bool = False

    schema_type = "Tensor"

    def check(self, op: str, value: Any) -> Any:
        check_tensor(op, self.name, value, self.dtypes, self.ndim)
        self.check_call(op, value)
        return value

    def check_call(self, op: str, t: torch.Tensor) -> None:
        """The checks a replayed configuration still runs (they depend on the first size or strides)."""
        if self.contiguous and not t.is_contiguous():
            raise fail(op, f"{self.name} must be contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}); "
                           f"call {self.name}.contiguous()")
        limit = self.max_numel
        if limit is not None and t.numel() > limit:
            sizes = " x ".join(map(str, t.shape))
            most = f"2**{limit.bit_length() - 1}" if limit & (limit - 1) == 0 else str(limit)
            raise fail(op, f"{self.name} has {sizes} entries, more than {most}; split the tokens")


@dataclass(frozen=True)
class IntParam:
    """An int parameter in ``[lo, hi]`` (integer-likes converted; bools, floats and tensors refused);
    ``hi`` defaults to the kernels' int32 limit."""

    name: str
    lo: int = -2**31
    hi: int = 2**31 - 1

    schema_type = "int"

    def check(self, op: str, value: Any) -> int:
        return check_int(op, self.name, value, self.lo, self.hi)


@dataclass(frozen=True)
class FlagParam:
    """A bool parameter (the ints 0 and 1 accepted, as tile_kernels' callers pass them)."""

    name: str

    schema_type = "bool"

    def check(self, op: str, value: Any) -> bool:
        return check_flag(op, self.name, value)


Param = Any  # TensorParam | IntParam | FlagParam


@dataclass
class OpSpec:
    """One op, declared once (see the module docstring).

    ``params``: the public parameters in order.  ``returns``: the schema's result, e.g.
    ``"Tensor"``, ``"(Tensor, Tensor)"`` or ``"()"``.  ``plan(values)``: called once per
    configuration with the checked values (a dict by parameter name), returns
    ``run(*args) -> result``, which allocates the outputs and launches for one call's (already
    checked) arguments; ``run`` reads only the tensors among them (a replayed call passes the
    caller's objects: scalars as given, e.g. a numpy int), the scalars' checked values come from
    ``plan``'s ``values``.  ``relations(op, values)``: checks between parameters (raise with
    :func:`._common.fail`).
    """

    name: str
    params: tuple
    returns: str
    plan: Callable[[dict], Callable[..., Any]]
    relations: Optional[Callable[[str, dict], None]] = None
    memo: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._tensors = tuple(i for i, p in enumerate(self.params) if isinstance(p, TensorParam))
        self._per_call = tuple((i, self.params[i]) for i in self._tensors
                               if self.params[i].contiguous or self.params[i].max_numel is not None)
        # one leading 2-D / 3-D tensor, then scalars (every op declared so far): the key inline
        self._lead = self._tensors == (0,) and self.params[0].ndim in (2, 3)
        self._scalars = len(self.params) > 1

    def __call__(self, *args: Any) -> Any:
        """The op on its arguments (every parameter, positionally)."""
        if is_compiling() and not TRACING.on:  # torch.compile / export: record tilebin::<name>
            return traced(self.name, *args)
        try:
            if self._lead:  # one leading 2-D / 3-D tensor, then scalars: the key inline (every replay)
                x = args[0]
                s = x.shape
                key = (x.dtype, x.device, len(s), s[-1] if len(s) == 2 else (s[1], s[2]))
                if self._scalars:
                    key = (key, args[1:], tuple(map(type, args)))
            else:
                key = self.key(args)
            run = self.memo.get(key)
        except (AttributeError, TypeError, IndexError):  # not a tensor where one belongs, unhashable: checks say
            key = run = None
        if run is not None and not TRACING.on:  # fake tensors never replay a real configuration
            for i, p in self._per_call:
                p.check_call(self.name, args[i])
            return run(*args)
        return self.checked(args, key)

    def key(self, args: tuple) -> tuple:
        """The configuration of ``args`` (:meth:`__call__` computes the same inline for a
        leading 2-D / 3-D tensor): per tensor its dtype, device, rank and sizes but the first;
        every other argument with its type.  AttributeError or IndexError where a tensor is
        not one, TypeError (at the memo lookup) where an argument is unhashable: those calls
        take the checked path.  Float parameters would need their bits (``0.0 == -0.0``): none
        is declared yet."""
        return tuple((v.dtype, v.device, v.dim(), tuple(v.shape[1:])) if i in self._tensors else (type(v), v)
                     for i, v in enumerate(args))

    def checked(self, args: tuple, key: Optional[tuple]) -> Any:
        """Every check, then the launch; stores the configuration when every check passed."""
        op = self.name
        if len(args) != len(self.params):
            raise fail(op, f"takes {len(self.params)} arguments, got {len(args)}")
        values = {p.name: p.check(op, v) for p, v in zip(self.params, args)}
        if self.relations is not None:
            self.relations(op, values)
        check_cuda(op, **{self.params[i].name: args[i] for i in self._tensors})
        run = self.plan(values)
        result = run(*(values[p.name] for p in self.params))
        if key is not None and not TRACING.on and len(self.memo) < _MEMO_MAX:
            self.memo[key] = run  # after the launch: a call that raised stores nothing
        return result

    def schema(self) -> str:
        """The torch.library schema: the parameters in order, mutated tensors marked ``(a!)``."""
        parts = []
        for p in self.params:
            kind = "Tensor(a!)" if getattr(p, "mutated", False) else p.schema_type
            parts.append(f"{kind} {p.name}")
        return f"({', '.join(parts)}) -> {self.returns}"

    def torch_op(self, public: Callable[..., Any]) -> TorchOp:
        """The ``tilebin::<name>`` declaration (``ops/_torch.py``) of ``public``, this spec's op."""
        return TorchOp(self.name, self.schema(), public)


__all__ = ["FlagParam", "IntParam", "OpSpec", "TensorParam"]
