"""The one declaration a kernel file makes: its public name, factory and variant grid.

``tilebin.aot`` builds from it, tests and benchmarks read it.  The AOT tool accepts any
object with the same attributes, so kernels outside this package can be built too.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

_NAME = re.compile(r"^[a-z][a-z0-9_]*\.[a-z_][a-z0-9_]*$")  # a leading "_" in the op: internal
_SCALAR_TYPES = (bool, int, float, str)


class DeclarationError(ValueError, TypeError):
    """A kernel declaration is wrong; the message names the kernel and the fix.  (A ValueError and a
    TypeError both, as the checks raised before it existed.)"""


def is_tilelang_jit(obj: Any) -> bool:
    """Whether ``obj`` is a ``@tilelang.jit``-decorated function (TileLang's ``JITImpl``), without
    importing TileLang: such an object exists only once ``tilelang.jit`` is imported."""
    impl = getattr(sys.modules.get("tilelang.jit"), "JITImpl", None)
    if impl is not None and isinstance(obj, impl):
        return True
    return type(obj).__name__ == "JITImpl" and hasattr(obj, "get_tir")


def _freeze(variant: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    if not isinstance(variant, Mapping):
        raise DeclarationError(f"{where}: a variant must be a dict of compile-time values (got {type(variant).__name__})")
    for key, value in variant.items():
        if not isinstance(key, str) or not isinstance(value, _SCALAR_TYPES):
            raise DeclarationError(
                f"{where}: variant values must be bool/int/float/str keyed by str "
                f"(got {key!r}: {type(value).__name__}); a config object needs KernelDecl.from_jit, "
                f"or a str key that your factory maps to it"
            )
    return MappingProxyType(dict(sorted(variant.items())))


@dataclass(frozen=True)
class KernelDecl:
    """A TileLang kernel factory plus the variants to prebuild.

    name      public name ``family.op`` (``runtime.launch`` takes it).
    factory   ``factory(**variant) -> tilelang PrimFunc``; every variant value is a
              compile-time constant, everything else stays a runtime symbol.
    grid      the variants, in preference order: when several match a call, the
              runtime takes the first.
    outputs   tensor parameters the kernel writes, by name (or by position, as TileLang's
              ``out_idx``); the runtime refuses calls where an output overlaps another
              tensor argument.
    align     bytes every tensor's data pointer must be aligned to (16 covers 128-bit
              vector access and TMA).
    pass_configs  TileLang pass configs applied when lowering every variant.
    doc       one line saying what the kernel computes (``runtime.spec(name).doc``).
    meta      constants the callers need (tile widths, limits), written into the manifest:
              ``runtime.spec(name).meta`` serves them to op layers, which never copy them.
              Values: bool/int/float/str, or tuples of those.
    optional  tensor parameters a call may pass as ``None`` (the kernel gets a null pointer
              and must not dereference it then); their sizes must be bound by other
              parameters too.
    conditions  what a call must meet for a variant to serve it, as text over the kernel's
              size/stride/scalar symbols and the variant's keys: ``"hidden % block == 0"``.
              The kernel's own ``T.assume`` conditions are added by the build.  The runtime
              checks them when it picks a variant (the first whose conditions hold serves);
              a call no variant serves raises ``NoVariantError`` naming the condition.
    specialise  named production shapes to build with sizes fixed at compile time, alongside the
              run-time-size variants: each entry maps size symbols of the tensor parameters (the
              ``T.dynamic`` names, e.g. ``{"num_topk": 8}``) to values.  For every grid variant the
              build adds one variant per entry, just ahead of it, with those symbols bound (loops over
              them get constant trip counts, their tensors' dims become static).  Its key is the grid
              key plus the entry, and the manifest lists the entry's names as ``specialised``.
              ``runtime.launch`` picks it for calls whose sizes match (by its static dims) and the
              run-time-size variant for every other call; op layers pick it once per memo key
              (``tilebin.ops._common.specialised_launcher``).
    also_dtypes  tensor parameters that take other dtypes of the same item size as their bits,
              by name: ``{"x_sf": ("float32",)}`` lets an int32 parameter take fp32 scales
              as they are, so an op passes the user's tensor instead of a ``view(dtype)``.
              The build checks that the item sizes agree; ``runtime.launch`` accepts them.
    """

    name: str
    factory: Callable[..., Any]
    grid: tuple[Mapping[str, Any], ...]
    outputs: tuple[str, ...] = ()
    align: int = 16
    pass_configs: Mapping[str, Any] = field(default_factory=dict)
    doc: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    optional: tuple[str, ...] = ()
    conditions: tuple[str, ...] = ()
    specialise: tuple[Mapping[str, int], ...] = ()
    also_dtypes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise DeclarationError(f"kernel name must look like 'family.op' in lower case (got {self.name!r})")
        if is_tilelang_jit(self.factory):
            raise DeclarationError(f"{self.name}: factory is a @tilelang.jit kernel, which KernelDecl cannot call "
                                   f"for its TIR; declare it with KernelDecl.from_jit({self.name!r}, jit_fn, grid=...)")
        if not callable(self.factory):
            raise DeclarationError(f"{self.name}: factory must be callable (got {type(self.factory).__name__})")
        if isinstance(self.grid, Mapping) or not isinstance(self.grid, (tuple, list)):
            raise DeclarationError(f"{self.name}: grid must be a tuple of variant dicts (got {type(self.grid).__name__}); "
                                   f"one variant is grid=({{...}},), several: product(...)")
        if not self.grid:
            raise DeclarationError(f"{self.name}: the variant grid is empty; declare at least one variant")
        if isinstance(self.align, bool) or not isinstance(self.align, int) or self.align <= 0 or self.align & (self.align - 1):
            raise DeclarationError(f"{self.name}: align must be a power of two (got {self.align})")
        frozen = tuple(_freeze(v, f"{self.name} variant {i}") for i, v in enumerate(self.grid))
        keys = [tuple(v.items()) for v in frozen]
        if len(set(keys)) != len(keys):
            twice = next(dict(k) for k in keys if keys.count(k) > 1)
            raise DeclarationError(f"{self.name}: the variant grid lists the same variant twice ({twice})")
        object.__setattr__(self, "grid", frozen)
        object.__setattr__(self, "outputs", _check_outputs(self.outputs, self.name))
        object.__setattr__(self, "pass_configs", MappingProxyType(dict(self.pass_configs)))
        object.__setattr__(self, "meta", _freeze_meta(self.meta, self.name))
        object.__setattr__(self, "optional", _strings(self.optional, "optional", self.name))
        object.__setattr__(self, "conditions", _strings(self.conditions, "conditions", self.name))
        object.__setattr__(self, "specialise", _check_specialise(self.specialise, frozen, self.name))
        object.__setattr__(self, "also_dtypes", _check_also_dtypes(self.also_dtypes, self.name))

    @classmethod
    def from_jit(cls, name: str, jit_fn: Any, grid: tuple[Mapping[str, Any], ...], outputs: tuple[str | int, ...] | None = None,
                 align: int = 16, pass_configs: Mapping[str, Any] | None = None, doc: str = "",
                 meta: Mapping[str, Any] | None = None, optional: tuple[str, ...] = (),
                 conditions: tuple[str, ...] = (), specialise: tuple[Mapping[str, int], ...] = (),
                 also_dtypes: Mapping[str, tuple[str, ...]] | None = None) -> KernelDecl:
        """Declare a ``@tilelang.jit``-decorated kernel factory: lazy style (it returns its
        PrimFunc) or eager style (tensor annotations; TileLang traces it with sizes left symbolic).

        Each variant's TIR comes from ``jit_fn.get_tir(**variant)``, lowered with the jit's
        ``pass_configs`` (its ``compile_flags`` join them as ``tl.device_compile_flags``, as
        TileLang does; ``pass_configs`` given here override both).  ``outputs`` defaults to the
        jit's ``out_idx`` (the runtime then expects those tensors from the caller, like any
        output).  The jit's ``target`` and ``execution_backend`` are not used: tilebin traces and
        lowers for sm_90a and launches with its own runtime.

        Variant values are bool/int/float/str, or any value TileLang's jit takes as a compile-time
        argument: a hashable config object (a frozen dataclass, a tuple) or a list/dict of them.
        The manifest key of such a value is its ``repr`` (e.g. ``"CastConfig(block=128)"``), which
        is what ``runtime.launch`` takes for it; the repr must be the same in every process (a
        dataclass's is, ``<object at 0x...>`` is not).  Raises :class:`DeclarationError`.
        """
        if not is_tilelang_jit(jit_fn):
            raise DeclarationError(f"{name}: from_jit takes a @tilelang.jit-decorated function (got "
                                   f"{type(jit_fn).__name__}); for a plain factory returning a PrimFunc "
                                   f"use KernelDecl(name, factory, grid)")
        if isinstance(grid, Mapping) or not isinstance(grid, (tuple, list)):
            raise DeclarationError(f"{name}: grid must be a tuple of variant dicts (got {type(grid).__name__})")
        keys, objects = _label_config_objects(grid, name)
        out_idx = getattr(jit_fn, "out_idx", None)
        if outputs is None:
            outputs = () if out_idx is None else ((out_idx,) if isinstance(out_idx, int) else tuple(out_idx))
        return cls(name, _jit_factory(jit_fn, objects), keys, outputs=outputs, align=align,
                   pass_configs={**_jit_pass_configs(jit_fn), **_plain_keys(pass_configs or {})}, doc=doc,
                   meta=meta or {}, optional=optional, conditions=conditions, specialise=specialise,
                   also_dtypes=also_dtypes or {})


def _plain_keys(configs: Mapping[Any, Any]) -> dict[str, Any]:
    """Pass-config keys as their strings (TileLang's PassConfigKey enum members hash by member name)."""
    return {str(getattr(k, "value", k)): v for k, v in configs.items()}


def _jit_pass_configs(jit_fn: Any) -> dict[str, Any]:
    configs = _plain_keys(getattr(jit_fn, "pass_configs", None) or {})
    flags = getattr(jit_fn, "compile_flags", None)
    if flags:
        given = configs.get("tl.device_compile_flags") or []
        given = [given] if isinstance(given, str) else list(given)
        configs["tl.device_compile_flags"] = given + ([flags] if isinstance(flags, str) else list(flags))
    return configs


def _label_config_objects(grid: Any, name: str) -> tuple[tuple[dict[str, Any], ...], dict[tuple[str, str], Any]]:
    """The grid with each config object replaced by its repr (the manifest key), and the objects by
    (argument, repr) for the factory to pass to the jit."""
    keys, objects, strings = [], {}, set()
    for i, variant in enumerate(grid):
        if not isinstance(variant, Mapping):
            raise DeclarationError(f"{name} variant {i}: a variant must be a dict of compile-time values "
                                   f"(got {type(variant).__name__})")
        key = {}
        for arg, value in variant.items():
            if isinstance(value, _SCALAR_TYPES):
                key[arg] = value
                strings.update([(arg, value)] if isinstance(value, str) else [])
                continue
            key[arg] = _config_label(value, f"{name} variant {i}: {arg}")
            if objects.setdefault((arg, key[arg]), value) != value:
                raise DeclarationError(f"{name} variant {i}: {arg}: two different values have the repr {key[arg]!r}")
        keys.append(key)
    clash = sorted(strings & objects.keys())
    if clash:
        raise DeclarationError(f"{name}: {clash[0][0]}={clash[0][1]!r} is both a str value and the repr of a config "
                               f"object in the grid; the manifest key cannot tell them apart")
    return tuple(keys), objects


def _config_label(value: Any, where: str) -> str:
    try:
        if not isinstance(value, (list, dict, set)):
            hash(value)  # TileLang keys its jit cache by compile-time arguments: they must hash
    except TypeError:
        raise DeclarationError(f"{where}: a {type(value).__name__} cannot be a compile-time value: TileLang's jit "
                               f"needs it hashable (a frozen dataclass, a tuple)") from None
    label = repr(value)
    if " at 0x" in label or " object at " in label:
        raise DeclarationError(f"{where}: the repr of this {type(value).__name__} ({label}) names a memory address, "
                               f"so it cannot be the variant's manifest key; give the class a repr that states its "
                               f"fields (a @dataclass has one)")
    return label


def _jit_factory(jit_fn: Any, objects: Mapping[tuple[str, str], Any]) -> Callable[..., Any]:
    """``factory(**key) -> PrimFunc``: the key's config-object reprs swapped back for the objects."""

    def factory(**key: Any) -> Any:
        args = {arg: objects.get((arg, value), value) if isinstance(value, str) else value for arg, value in key.items()}
        if getattr(jit_fn, "target", None) is None or not hasattr(jit_fn, "initialize_jit_mode"):
            return jit_fn.get_tir(**args)
        # get_tir would trace under the jit's own target (``"cuda"`` means sm_50 on a machine with no
        # GPU); trace under the build's sm_90a target instead, as lowering does: get_tir's steps
        jit_fn.initialize_jit_mode(**args)
        return jit_fn.func(**args)

    # decl_site and tracebacks name the jit's function, not this wrapper
    factory.__wrapped__ = getattr(getattr(jit_fn, "func", None), "orig_func", None) or jit_fn  # type: ignore[attr-defined]
    factory.__name__ = getattr(factory.__wrapped__, "__name__", "jit_factory")
    return factory


def _check_outputs(outputs: Any, name: str) -> tuple[str | int, ...]:
    items = (outputs,) if isinstance(outputs, (str, int)) else tuple(outputs)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise DeclarationError(f"{name}: outputs names tensor parameters by name or position "
                                   f"(got {item!r}: {type(item).__name__})")
    return items


def _strings(values: Any, what: str, name: str) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    if not isinstance(values, (tuple, list)) or not all(isinstance(v, str) and v.strip() for v in values):
        raise DeclarationError(f"{name}: {what} must be a tuple of non-empty strings (got {values!r})")
    return tuple(values)


def _check_specialise(entries: Any, grid: tuple[Mapping[str, Any], ...], name: str) -> tuple[Mapping[str, int], ...]:
    """``specialise`` as a tuple of frozen ``{size symbol: int}`` entries, each distinct, none naming a grid key."""
    if isinstance(entries, Mapping) or not isinstance(entries, (tuple, list)):
        raise DeclarationError(f"{name}: specialise must be a tuple of dicts such as ({{'num_topk': 8}},) "
                               f"(got {type(entries).__name__})")
    keys = set().union(*(v.keys() for v in grid))
    frozen = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or not entry:
            raise DeclarationError(f"{name}: specialise entry {i} must be a non-empty dict of size symbols to ints "
                                   f"(got {entry!r})")
        for sym, value in entry.items():
            if not isinstance(sym, str) or isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DeclarationError(f"{name}: specialise entry {i}: sizes are positive ints keyed by the size "
                                       f"symbol's name (got {sym!r}: {value!r})")
            if sym in keys:
                raise DeclarationError(f"{name}: specialise entry {i} names {sym!r}, which is a compile-time key of "
                                       f"the grid already; specialise binds run-time size symbols only")
        item = MappingProxyType(dict(sorted(entry.items())))
        if item in frozen:
            raise DeclarationError(f"{name}: specialise lists {dict(item)} twice")
        frozen.append(item)
    return tuple(frozen)


def _check_also_dtypes(also: Any, name: str) -> Mapping[str, tuple[str, ...]]:
    """``also_dtypes`` as a frozen ``{tensor parameter: (dtype name, ...)}`` (torch's dtype names)."""
    if not isinstance(also, Mapping):
        raise DeclarationError(f"{name}: also_dtypes must be a dict such as {{'x_sf': ('float32',)}} "
                               f"(got {type(also).__name__})")
    frozen = {}
    for param, dtypes in also.items():
        dtypes = (dtypes,) if isinstance(dtypes, str) else dtypes
        if not isinstance(param, str) or not isinstance(dtypes, (tuple, list)) or not dtypes \
                or not all(isinstance(d, str) and d for d in dtypes):
            raise DeclarationError(f"{name}: also_dtypes maps a tensor parameter's name to a tuple of dtype names "
                                   f"(got {param!r}: {dtypes!r})")
        frozen[param] = tuple(dict.fromkeys(dtypes))
    return MappingProxyType(frozen)


def _freeze_meta(meta: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    frozen = {}
    for key, value in meta.items():
        items = value if isinstance(value, (tuple, list)) else (value,)
        if not isinstance(key, str) or not all(isinstance(v, _SCALAR_TYPES) for v in items):
            raise DeclarationError(f"{name}: meta values must be bool/int/float/str or tuples of them, keyed by str "
                            f"(got {key!r}: {value!r})")
        frozen[key] = tuple(value) if isinstance(value, (tuple, list)) else value
    return MappingProxyType(dict(sorted(frozen.items())))


def product(**axes: list[Any] | tuple[Any, ...]) -> tuple[dict[str, Any], ...]:
    """Every combination of the given axes, first axis slowest: ``product(dtype=[...], n=[...])``."""
    combos: list[dict[str, Any]] = [{}]
    for key, values in axes.items():
        combos = [{**c, key: v} for c in combos for v in values]
    return tuple(combos)
