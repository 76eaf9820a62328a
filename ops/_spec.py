"""Ops declared once: an :class:`OpSpec` states an op's parameters, outputs and mutations, and how
it launches; everything else about the op comes from it.

* **Checks**: each parameter's type, dtype, rank, range, contiguity and size limit, in the
  wording of :mod:`._common`'s checks, then the op's ``relations`` (checks between parameters),
  then the device of every tensor (last, so CPU tensors reach every other check).
* **Memo key**: a call's configuration is each argument's part as its parameter states it: a
  tensor's dtype, rank, device and sizes (but the first where that is the token count,
  ``rows_vary``), every other argument with its type (``True``, ``1`` and ``1.0`` differ; floats
  by their bits).  The first call of a configuration runs every check and builds the op's
  launch (``plan``); a later call of the same configuration runs only the per-call checks
  (contiguity, size limits, and the op's ``per_call`` check: token counts that must agree,
  strides, pointers) and that launch.  A call that fails a check stores nothing.  Where the
  runtime reads torch tensors through torch's C shim, the tensors' key parts and per-call tests
  are one C call (``ops/_compiled_key.py``), and a replay may run the plan's ``run.fast``.
* **Output allocation** and **launch**: the op's ``plan(values)`` returns the function that
  allocates the outputs and launches for a call's arguments; it is built once per configuration.
* **torch.library**: :meth:`OpSpec.torch_op` is the ``TorchOp`` of ``tilebin::<name>``, its schema
  written from the parameters (mutated tensors marked ``(a!)``) and the declared result; the op's
  tracing dispatch (:meth:`OpSpec.__call__` under ``torch.compile``) records that custom op.

An op module declares ``SPEC = OpSpec(...)`` and a public function with tile_kernels' signature
whose body is ``return SPEC.call(arg1, arg2, ...)`` (``SPEC(...)`` is the same, one frame more).
``ops/README.md`` shows one.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.compiler as _compiler
from torch.compiler import is_compiling, is_dynamo_compiling

from tilebin.runtime._record import Factory, record

from ._common import FLAT_TYPES, SOLE_GPU, TRACING, check_cuda, check_flag, check_int, check_tensor, fail, typed_key
from ._compiled_key import compiled_call_lines, compiled_key
from ._torch import TorchOp, traced

_MEMO_MAX = 256  # configurations kept per op (a process sees a handful; the cap bounds a shape sweep)


@record
class Fast:
    """What a tensor must be for its op's ``run.fast`` (the plan's run without its own per-call test),
    tested by the compiled key (``ops/_compiled_key.py``) only: contiguous, a data pointer that is a
    multiple of ``align`` bytes (non-empty tensors), at most ``max_numel`` elements.  A call that fails
    it takes the Python key, whose replay runs ``run`` (its own test, then the checks that raise, or
    the call); without the compiled key every replay runs ``run``."""

    contiguous: bool = True
    align: int = 16
    max_numel: Optional[int] = None


@record
class TensorParam:
    """A tensor parameter: one of ``dtypes``, ``ndim`` dims (None: any), contiguous if asked, at
    most ``max_numel`` elements and, if ``ptr_align``, a data pointer that is a multiple of that many
    bytes (both checked per call), written by the op if ``mutated``; None accepted if ``optional``.

    ``rows_vary``: its first size may differ between calls of one configuration (the token
    count): only the other sizes are part of the memo key, and a relation that involves the
    first size (two tensors' token counts agree) is checked per call: ``rows_of`` names the
    parameter whose first size this one's equals (both non-optional rows_vary tensors of a declared
    rank; the op's checks must refuse a call where they differ), anything else belongs in the
    spec's ``per_call`` check or the top of ``run``.
    False: the whole shape is part of the configuration (a bias ``[num_experts]``, a weight).
    """

    name: str
    dtypes: tuple
    ndim: Optional[int] = None
    contiguous: bool = False
    max_numel: Optional[int] = None
    mutated: bool = False
    optional: bool = False
    rows_vary: bool = True
    default: Optional[str] = None  # the schema's default, e.g. "None"
    ptr_align: int = 0  # bytes its data pointer must be a multiple of (checked per call, non-empty tensors); 0: any
    # the parameter whose first size (the token count) this one's equals: tested per call on the shapes
    # the memo key read (a call where they differ takes the checked path; the op's checks say why)
    rows_of: Optional[str] = None
    fast: Optional[Fast] = None  # the op's run.fast needs these facts (tested by the compiled key only)

    @property
    def schema_type(self) -> str:
        return ("Tensor(a!)" if self.mutated else "Tensor") + ("?" if self.optional else "")

    def check(self, op: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        check_tensor(op, self.name, value, self.dtypes, self.ndim)
        self.check_call(op, value)
        return value

    def check_call(self, op: str, t: Optional[torch.Tensor]) -> None:
        """The checks a replayed configuration still runs (they depend on the first size or strides)."""
        if t is None:
            return
        if self.contiguous and not t.is_contiguous():
            raise fail(op, f"{self.name} must be contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}); "
                           f"call {self.name}.contiguous()")
        limit = self.max_numel
        if limit is not None and t.numel() > limit:
            sizes = " x ".join(map(str, t.shape))
            most = f"2**{limit.bit_length() - 1}" if limit & (limit - 1) == 0 else str(limit)
            raise fail(op, f"{self.name} has {sizes} entries, more than {most}; split the tokens")
        align = self.ptr_align
        if align and not TRACING.on and t.numel() and t.data_ptr() % align:  # (fake tensors have no pointer)
            raise fail(op, f"{self.name}'s data pointer {t.data_ptr():#x} is not {align}-byte aligned (vector "
                           f"access); pass a {align}-byte aligned tensor (a fresh torch.empty is)")

    def key(self, t: Any) -> Any:
        """This argument's part of the memo key (AttributeError for a non-tensor: the checked path)."""
        if t is None:
            return None  # only an optional parameter's None ever reaches a stored key
        s, device = t.shape, (t.is_cuda if SOLE_GPU.on else t.device)
        if not self.rows_vary:
            return t.dtype, device, s
        return t.dtype, device, len(s), (s[-1] if len(s) == 2 else s[1:])  # (slicing a shape costs ~0.1 µs)


@record
class IntParam:
    """An int parameter in ``[lo, hi]`` (integer-likes converted; bools, floats and tensors refused);
    ``hi`` defaults to the kernels' int32 limit; None accepted if ``optional``."""

    name: str
    lo: int = -2**31
    hi: int = 2**31 - 1
    optional: bool = False
    default: Optional[str] = None

    @property
    def schema_type(self) -> str:
        return "int?" if self.optional else "int"

    def check(self, op: str, value: Any) -> Optional[int]:
        if value is None and self.optional:
            return None
        return check_int(op, self.name, value, self.lo, self.hi)

    def key(self, value: Any) -> Any:
        return type(value), value


@record
class FlagParam:
    """A bool parameter (the ints 0 and 1 accepted, as tile_kernels' callers pass them)."""

    name: str
    default: Optional[str] = None

    schema_type = "bool"

    def check(self, op: str, value: Any) -> bool:
        return check_flag(op, self.name, value)

    def key(self, value: Any) -> Any:
        return type(value), value


@record
class Param:
    """Any other parameter: ``schema_type`` as torch.library writes it (``"str"``, ``"float?"``,
    ``"int[]"``, ``"ScalarType"``...), checked by ``check_value(op, value) -> checked value`` (raise
    with :func:`._common.fail`; None: passed as given, for a parameter the op's ``relations`` or
    per-call checks judge with others).  Its memo-key part is the value with its type, element by
    element for tuples and lists and by its bits for a float (:func:`._common.typed_key`);
    ``key(value)`` overrides that (raise AttributeError or TypeError where a value must take
    the checked path every time)."""

    name: str
    schema_type: str
    check_value: Optional[Callable[[str, Any], Any]] = None
    key_of: Optional[Callable[[Any], Any]] = None
    default: Optional[str] = None
    call_check: Optional[Callable[[str, Any], None]] = None  # what a replayed call still checks (see TensorParam)

    def check(self, op: str, value: Any) -> Any:
        return value if self.check_value is None else self.check_value(op, value)

    def check_call(self, op: str, value: Any) -> None:
        if self.call_check is not None:
            self.call_check(op, value)

    def key(self, value: Any) -> Any:
        return typed_key(value) if self.key_of is None else self.key_of(value)


def block_key(value: Any) -> Any:
    """The memo-key part of a ``(rows, cols)`` block size (or None): its type and its elements' types
    and values.  TypeError for anything that is not two elements (the checked path says why).  For
    parameters whose checks take ints only: ``0.0`` and ``-0.0`` would not be kept apart."""
    if value is None:
        return None
    try:
        rows, cols = value
    except (TypeError, ValueError):
        raise TypeError("not two elements") from None
    return type(value), type(rows), type(cols), rows, cols


def _compile_key(name: str, params: tuple) -> Callable[[tuple], tuple]:
    """``key(args)``: the configuration of a call's arguments, one flat tuple (see the module
    docstring), as one generated function: the memo lookup is the hot path of every op, and
    inline attribute reads cost a fraction of a call per parameter.

    A tensor gives its dtype, device, rank and sizes (all but the first where ``rows_vary``; for
    a declared rank 1, 2 or 3 read by index, which is exact given the rank); an int, bool or
    str parameter its type and value; any other parameter its ``key(value)``.  AttributeError,
    IndexError, ValueError (argument count) or TypeError (unhashable, at the lookup) send the
    call to the checked path."""
    env: dict[str, Any] = {}
    SOLE_GPU.settle()  # before any key is computed: hand-written key parts read SOLE_GPU.on
    key = _key_expr(params, env)
    names = "".join(f"a{i}, " for i in range(len(params)))
    src = f"def key(args):\n    {names} = args\n    return {key}\n" if params else \
        "def key(args):\n    if args: raise ValueError\n    return ()\n"
    exec(compile(src, f"<OpSpec {name} key>", "exec"), env)  # noqa: S102 - source built above from fixed fragments
    return env["key"]


def _key_expr(params: tuple, env: dict, skip: frozenset = frozenset()) -> str:
    """The memo key of arguments ``a0, a1, ...`` as one tuple expression (its helpers put in ``env``);
    the parameters at the indices in ``skip`` left out (the compiled key holds them)."""
    parts = []
    for i, p in enumerate(params):
        a = f"a{i}"
        if i in skip:
            continue
        if isinstance(p, TensorParam) and type(p).key is TensorParam.key:
            frag = _tensor_key_expr(p, a, f"s{i}")
            parts.append(f"(None if {a} is None else ({frag}))" if p.optional else frag)
        elif type(p).key in (IntParam.key, FlagParam.key) or (
                isinstance(p, Param) and p.key_of is None and p.schema_type.rstrip("?") == "str"):
            parts.append(f"type({a}), {a}")
        elif isinstance(p, Param) and p.key_of is None and type(p).key is Param.key:
            # typed_key's tags, inline for flat values and for a nonzero float that is not NaN (equal such
            # floats have equal bits; zeros and NaNs take typed_key, so a NaN finds its configuration again)
            env["_FLAT"], env["_typed"] = FLAT_TYPES, typed_key
            t = f"t{i}"
            parts.append(f"({t} := type({a})), ({a} if {t} in _FLAT or {t} is float and {a} and {a} == {a} "
                         f"else _typed({a}))")
        else:
            # a Param's own key_of directly (Param.key would only forward to it: one call less per parameter)
            env[f"k{i}"] = p.key_of if isinstance(p, Param) and p.key_of is not None and type(p).key is Param.key \
                else p.key
            parts.append(f"k{i}({a})")
    return f"({', '.join(parts)},)" if parts else "()"


def _compile_call(spec: "OpSpec") -> Callable[..., Any]:
    """``call(a0, a1, ...)``: the op on its parameters (positionally), as one generated function.

    The same steps as ``OpSpec.__call__`` always had, in one frame: under torch.compile/export
    record the custom op; the memo key (:func:`_key_expr`) and lookup; a miss (or fake tensors)
    takes :meth:`OpSpec.checked`; a hit tests the ``rows_of`` token counts (:func:`_rows_test`: a
    mismatch takes the checked path too), runs the per-call checks (:func:`_call_checks`) and the
    configuration's ``run``.  The spec's ``memo``, ``checked`` and ``per_call`` are read through the
    spec on every call (tests replace them)."""
    SOLE_GPU.settle()  # before any key is computed: hand-written key parts read SOLE_GPU.on
    env: dict[str, Any] = {"_spec": spec, "_name": spec.name, "_TR": TRACING, "_dynamo": is_dynamo_compiling,
                           "_compiler": _compiler, "_traced": traced}
    n = len(spec.params)
    names = ", ".join(f"a{i}" for i in range(n))
    args = f"({names},)" if n else "()"
    rows = spec._rows  # the rows_of test, made (and its declaration checked) at import
    compiled = compiled_key(spec)  # the tensors' key part in C (ops/_compiled_key.py), or None
    lines = [f"def {'_py' if compiled else 'call'}({names}):",
             *_compile_test(n, names),
             "    try:",
             f"        key = {_key_expr(spec.params, env)}",
             "        run = _spec.memo.get(key)",
             "    except (AttributeError, TypeError, IndexError, ValueError):",
             f"        return _spec.checked({args}, None)",
             "    if run is None or _TR.on:  # fake tensors never replay a real configuration",
             f"        return _spec.checked({args}, key)",
             *([f"    if {rows}:  # token counts that differ: the checked path says why",
                f"        return _spec.checked({args}, None)"] if rows else []),
             *_call_checks(spec, env),
             f"    return run({names})", ""]
    if compiled is not None:
        lines += compiled_call_lines(spec, env, compiled, names, args, _compile_test(n, names),
                                     _key_expr(spec.params, env, compiled.keyed),
                                     _call_checks(spec, env, compiled.keyed, compiled.covered))
    exec(compile("\n".join(lines), f"<OpSpec {spec.name} call>", "exec"), env)  # noqa: S102 - fixed fragments
    return env["call"]


def _compile_test(n: int, names: str) -> list[str]:
    """The generated call's first lines: under torch.compile/export, record the custom op instead."""
    # torch.compiler.is_compiling(), minus its torch.jit.is_scripting() call (dynamo folds either to True)
    return ["    if _dynamo() or _compiler._is_compiling_flag:",
            "        if not _TR.on:",
            f"            return _traced(_name{', ' if n else ''}{names})"]


def _rows_test(spec: "OpSpec") -> str:
    """The generated test that is true when a ``rows_of`` tensor's first size differs from its
    reference's (both shapes bound by the memo key as ``s<i>``), or ""."""
    index = {p.name: i for i, p in enumerate(spec.params)}
    tests = []
    for i, p in enumerate(spec.params):
        ref = getattr(p, "rows_of", None)
        if ref is None:
            continue
        j = index.get(ref)
        for q in (p, None if j is None else spec.params[j]):
            if not (isinstance(q, TensorParam) and type(q).key is TensorParam.key and q.rows_vary
                    and not q.optional and q.ndim in (1, 2, 3)):
                raise ValueError(f"OpSpec {spec.name}: {p.name}.rows_of={ref!r} needs both to be non-optional "
                                 "rows_vary TensorParams of rank 1, 2 or 3 (their shapes are the key's)")
        tests.append(f"s{i}[0] != s{j}[0]")
    return " or ".join(tests)


def _call_checks(spec: "OpSpec", env: dict, in_c: frozenset = frozenset(),
                 covered: frozenset = frozenset()) -> list[str]:
    """The generated lines of a replayed call's per-call checks, in parameter order, then ``per_call``.

    A parameter's cheap test (a TensorParam's declared contiguity, size limit and alignment, or
    a subclass's ``call_test``) guards its ``check_call``, which raises with the first call's
    wording; a test is true whenever ``check_call`` would raise.  With the compiled key, the
    parameters it keys (``in_c``: their shapes are not bound) and tests (``covered``) differ."""
    lines = []
    for i, p in spec._per_call:
        if i in covered:
            continue
        a, call = f"a{i}", f"p{i}.check_call(_name, a{i})"
        env[f"p{i}"] = p
        keyed = type(p).key is TensorParam.key and p.rows_vary and not p.optional and i not in in_c  # s{i} bound
        test = _call_test(p, a, f"s{i}" if keyed else f"c{i}")
        if not keyed and "{s}" in (_call_template(p) or ""):
            lines.append(f"    c{i} = {a}.shape")
        lines += [f"    if {test}:", f"        {call}"] if test else [f"    {call}"]
    if spec.per_call is not None:
        lines.append(f"    _spec.per_call(_name, ({''.join(f'a{i}, ' for i in range(len(spec.params)))}))")
    return lines


def _call_test(p: Any, a: str, s: str) -> Optional[str]:
    """An expression over argument ``a`` (``s``: the name of its ``shape``, read before) that is true
    whenever ``p.check_call`` may raise, or None (call it every time)."""
    if not isinstance(p, TensorParam):
        return None
    if type(p).check_call is not TensorParam.check_call:
        test = _call_template(p)
        return None if test is None else f"({test.format(a=a, s=s)})"
    tests = ([f"not {a}.is_contiguous()"] if p.contiguous else []) + (
        [f"{a}.numel() > {p.max_numel}"] if p.max_numel is not None else []) + (
        [f"{a}.numel() and {a}.data_ptr() % {p.ptr_align}"] if p.ptr_align else [])
    body = " or ".join(tests) or "False"
    return f"({a} is not None and ({body}))" if p.optional else f"({body})"


def _call_template(p: Any) -> Optional[str]:
    """A TensorParam subclass's ``call_test`` (a template over ``{a}``, the argument, and ``{s}``, its shape)."""
    return getattr(type(p), "call_test", None)


def _tensor_key_expr(p: TensorParam, a: str, s: str) -> str:
    device = SOLE_GPU.attr()
    if not p.rows_vary:
        return f"{a}.dtype, {a}.{device}, {a}.shape"
    # sizes by index: slicing a torch.Size costs ~0.1 µs more (any rank: a 2-D tensor's by index too)
    sizes = {1: "", 2: f", {s}[-1]", 3: f", {s}[-2], {s}[-1]"}.get(
        p.ndim, f", ({s}[-1] if len({s}) == 2 else {s}[1:])")
    return f"{a}.dtype, {a}.{device}, len({s} := {a}.shape){sizes}"


def _checks_per_call(p: Any) -> bool:
    """Whether parameter ``p`` has checks a replayed call must repeat: a TensorParam that is
    contiguous or size-limited, one whose class redefines ``check_call``, a Param with ``call_check``."""
    if isinstance(p, TensorParam):
        return (p.contiguous or p.max_numel is not None or p.ptr_align
                or type(p).check_call is not TensorParam.check_call)
    return getattr(p, "call_check", None) is not None


@record(frozen=False, eq=False)
class OpSpec:
    """One op, declared once (see the module docstring).

    ``params``: the public parameters in order.  ``returns``: the schema's result, e.g.
    ``"Tensor"``, ``"(Tensor, Tensor)"`` or ``"()"``.  ``plan(values)``: called once per
    configuration with the checked values (a dict by parameter name), returns
    ``run(*args) -> result``, which allocates the outputs and launches for one call's (already
    checked) arguments; ``run`` reads only the tensors among them (a replayed call passes the
    caller's objects: scalars as given, e.g. a numpy int), the scalars' checked values come from
    ``plan``'s ``values``.  ``relations(op, values)``: checks between parameters, run once per
    configuration (raise with :func:`._common.fail`).  ``per_call(op, args)``: the checks that
    depend on what the memo key leaves out (token counts that must agree, strides, pointers),
    run on every call, the first one included (after the parameters' own checks, before
    ``relations``), on the caller's arguments.  An op may leave ``per_call`` None and test the same
    facts at the top of its ``run`` instead (one frame and one argument tuple less per call), when
    its ``relations`` run those checks first on a first call (so its errors keep their order).

    Where the public signature does not map one to one onto the torch schema (a ``(data, sf)``
    pair, outputs that are views of one buffer, a data-dependent output size), ``schema_args``
    replaces the schema's argument list and ``torch`` holds :class:`TorchOp`'s conversions
    (``to_schema``, ``to_public``, ``result_to_schema``, ``result_to_public``, ``eager_only``).
    """

    name: str
    params: tuple
    returns: str
    plan: Callable[[dict], Callable[..., Any]]
    relations: Optional[Callable[[str, dict], None]] = None
    per_call: Optional[Callable[[str, tuple], None]] = None
    schema_args: Optional[str] = None
    torch: dict = Factory(dict)
    memo: dict = Factory(dict)

    def __post_init__(self) -> None:
        params = self.params
        self._tensors = tuple(i for i, p in enumerate(params) if isinstance(p, TensorParam))
        # the per-call checks of a replayed call, in parameter order (as the first call runs them)
        self._per_call = tuple((i, p) for i, p in enumerate(params) if _checks_per_call(p))
        self._rows = _rows_test(self)  # a misdeclared rows_of fails here, at import
        self._fast = any(getattr(p, "fast", None) is not None for p in params)  # plan's run has .fast
        # compiled at the op's first call: importing the ops compiles nothing
        self.key, self.call = self._first_key, self._first_call

    def _first_key(self, args: tuple) -> tuple:
        """:meth:`key` of the first call: compiles the spec's key function, which then serves every call."""
        self.key = _compile_key(self.name, self.params)
        return self.key(args)

    def _first_call(self, *args: Any) -> Any:
        """:attr:`call` of the first call: compiles it (:func:`_compile_call`), which then serves every call."""
        self.call = _compile_call(self)
        return self.call(*args)

    def __call__(self, *args: Any) -> Any:
        """The op on its arguments (every parameter, positionally); an op's public function calls
        :attr:`call` (the same, one frame less): under torch.compile/export it records
        ``tilebin::<name>``; a configuration seen before (memo key, module docstring) runs its
        per-call checks and launch; anything else every check (:meth:`checked`)."""
        if len(args) == len(self.params):
            return self.call(*args)
        if is_compiling() and not TRACING.on:  # torch.compile / export: record tilebin::<name>
            return traced(self.name, *args)
        return self.checked(args, None)  # a wrong argument count: the checks say

    def checked(self, args: tuple, key: Optional[tuple]) -> Any:
        """Every check, then the launch; stores the configuration when every check passed."""
        op = self.name
        if len(args) != len(self.params):
            raise fail(op, f"takes {len(self.params)} arguments, got {len(args)}")
        values = {p.name: p.check(op, v) for p, v in zip(self.params, args)}
        if self.per_call is not None:
            self.per_call(op, args)
        if self.relations is not None:
            self.relations(op, values)
        check_cuda(op, **{self.params[i].name: args[i] for i in self._tensors})
        run = self.plan(values)
        if self._fast and not callable(getattr(run, "fast", None)):
            raise TypeError(f"OpSpec {op}: a parameter declares Fast, so its plan's run needs run.fast")
        result = run(*(values[p.name] for p in self.params))
        if key is not None and not TRACING.on and len(self.memo) < _MEMO_MAX:
            self.memo[key] = run  # after the launch: a call that raised stores nothing
        return result

    def fake(self, *args: Any) -> Any:
        """The op without its memo: what ``torch.library``'s fake implementation runs (on fake tensors)."""
        return self.checked(args, None)

    def schema(self) -> str:
        """The torch.library schema: the parameters in order (mutated tensors marked ``(a!)``,
        declared defaults written), or ``schema_args``."""
        if self.schema_args is not None:
            return f"({self.schema_args}) -> {self.returns}"
        parts = []
        for p in self.params:
            default = "" if p.default is None else f"={p.default}"
            parts.append(f"{p.schema_type} {p.name}{default}")
        return f"({', '.join(parts)}) -> {self.returns}"

    def torch_op(self, public: Callable[..., Any]) -> TorchOp:
        """The ``tilebin::<name>`` declaration (``ops/_torch.py``) of ``public``, this spec's op."""
        return TorchOp(self.name, self.schema(), public, self.fake, **self.torch)


__all__ = ["Fast", "FlagParam", "IntParam", "OpSpec", "Param", "TensorParam", "block_key"]
