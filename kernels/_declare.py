"""The one declaration a kernel file makes: its public name, factory and variant grid.

``tilebin.aot`` builds from it, tests and benchmarks read it.  The AOT tool accepts any
object with the same attributes, so kernels outside this package can be built too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

_NAME = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")
_SCALAR_TYPES = (bool, int, float, str)


def _freeze(variant: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    for key, value in variant.items():
        if not isinstance(key, str) or not isinstance(value, _SCALAR_TYPES):
            raise TypeError(
                f"{where}: variant values must be bool/int/float/str keyed by str "
                f"(got {key!r}: {type(value).__name__})"
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
    outputs   tensor parameters the kernel writes; the runtime refuses calls where an
              output overlaps another tensor argument.
    align     bytes every tensor's data pointer must be aligned to (16 covers 128-bit
              vector access and TMA).
    pass_configs  TileLang pass configs applied when lowering every variant.
    doc       one line saying what the kernel computes (``runtime.spec(name).doc``).
    meta      constants the callers need (tile widths, limits), written into the manifest:
              ``runtime.spec(name).meta`` serves them to op layers, which never copy them.
              Values: bool/int/float/str, or tuples of those.
    """

    name: str
    factory: Callable[..., Any]
    grid: tuple[Mapping[str, Any], ...]
    outputs: tuple[str, ...] = ()
    align: int = 16
    pass_configs: Mapping[str, Any] = field(default_factory=dict)
    doc: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"kernel name must look like 'family.op' in lower case (got {self.name!r})")
        if not callable(self.factory):
            raise TypeError(f"{self.name}: factory must be callable (got {type(self.factory).__name__})")
        if not self.grid:
            raise ValueError(f"{self.name}: the variant grid is empty; declare at least one variant")
        if self.align <= 0 or self.align & (self.align - 1):
            raise ValueError(f"{self.name}: align must be a power of two (got {self.align})")
        frozen = tuple(_freeze(v, f"{self.name} variant {i}") for i, v in enumerate(self.grid))
        keys = [tuple(v.items()) for v in frozen]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{self.name}: the variant grid lists the same variant twice")
        object.__setattr__(self, "grid", frozen)
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "pass_configs", MappingProxyType(dict(self.pass_configs)))
        object.__setattr__(self, "meta", _freeze_meta(self.meta, self.name))


def _freeze_meta(meta: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    frozen = {}
    for key, value in meta.items():
        items = value if isinstance(value, (tuple, list)) else (value,)
        if not isinstance(key, str) or not all(isinstance(v, _SCALAR_TYPES) for v in items):
            raise TypeError(f"{name}: meta values must be bool/int/float/str or tuples of them, keyed by str "
                            f"(got {key!r}: {value!r})")
        frozen[key] = tuple(value) if isinstance(value, (tuple, list)) else value
    return MappingProxyType(dict(sorted(frozen.items())))


def product(**axes: list[Any] | tuple[Any, ...]) -> tuple[dict[str, Any], ...]:
    """Every combination of the given axes, first axis slowest: ``product(dtype=[...], n=[...])``."""
    combos: list[dict[str, Any]] = [{}]
    for key, values in axes.items():
        combos = [{**c, key: v} for c in combos for v in values]
    return tuple(combos)
