"""The artifact contract: a versioned JSON manifest, parsed into frozen specs.

The manifest is data only.  :func:`parse_manifest` checks its structure and the consistency of its
expressions, so a bad artifact fails with an :class:`ArtifactError` naming the kernel, never halfway
through a launch: all of it up front (the build and wheel checks), or, for a runtime registry
(``lazy=True``), the envelope at load and each kernel before its first launch.
``tilebin.aot`` writes it with :meth:`Manifest.to_json`: the envelope on the first line, then one
kernel per line, so that a runtime registry decodes only the kernels a process uses (all 64 took
11-13 ms of a cold start).  Any other layout of the same data (hand-edited, pretty-printed) is read whole.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from ._record import Factory, is_record, record, record_fields
from ._errors import ArtifactError
from ._expr import Expr, check_expr, symbols_of

SCHEMA_VERSION = 1
ARG_KINDS = ("ptr", "scalar", "tma")


@record
class ParamSpec:
    """A positional parameter of ``launch``: a tensor (with its rank) or a scalar."""

    name: str
    kind: str  # "tensor" | "scalar"
    rank: int = 0
    optional: bool = False  # a tensor the call may pass as None (its pointer is then null)


@record
class TensorSpec:
    """What a variant needs of one tensor argument.

    shape/strides entries: int (static), str (runtime symbol, bound from the argument),
    or an expression tree over earlier symbols (checked).  Strides are in elements.
    """

    name: str
    dtype: str
    shape: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    align: int = 16
    output: bool = False
    max_elements: int | None = None
    also_dtypes: tuple[str, ...] = ()  # dtypes of the same item size also taken, as bits (KernelDecl)


@record
class ScalarSpec:
    name: str
    dtype: str


@record
class TmaSpec:
    """A ``cuTensorMapEncodeTiled`` call; the global address is the tensor ``param``'s pointer."""

    param: str
    dtype: int  # CUtensorMapDataType value
    rank: int
    dims: tuple[Expr, ...]
    strides: tuple[Expr, ...]  # bytes, rank - 1 entries (the innermost stride is implicit)
    box: tuple[int, ...]
    elem_strides: tuple[int, ...]
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int


@record
class ArgSpec:
    """One device-kernel argument: a tensor pointer, a scalar expression or a TMA descriptor."""

    kind: str
    param: str | None = None  # ptr: the tensor
    dtype: str | None = None  # scalar: its C type name (int32, float32, ...)
    value: Expr | None = None  # scalar: its expression
    tma: int | None = None  # tma: index into VariantSpec.tma


@record
class LaunchSpec:
    entry: str
    grid: tuple[Expr, Expr, Expr]
    block: tuple[Expr, Expr, Expr]
    smem: int
    args: tuple[ArgSpec, ...]
    cluster: tuple[int, int, int] = (1, 1, 1)
    cooperative: bool = False
    pdl: bool = False


@record
class ConditionSpec:
    """What a call must meet for a variant to serve it: ``expr`` over the variant's runtime symbols is
    nonzero (``hidden % 128 == 0``); ``source``: ``"assume"`` (a ``T.assume``) or ``"declared"``
    (``KernelDecl.conditions``).  A call no variant serves raises ``NoVariantError`` naming it."""

    expr: Expr
    source: str = "declared"  # one of CONDITION_SOURCES


CONDITION_SOURCES = ("assume", "declared")


@record
class VariantSpec:
    key: Mapping[str, Any]
    cubin: str  # path relative to the manifest's folder
    sha256: str
    tensors: tuple[TensorSpec, ...]
    scalars: tuple[ScalarSpec, ...]
    launches: tuple[LaunchSpec, ...]
    tma: tuple[TmaSpec, ...] = ()
    conditions: tuple[ConditionSpec, ...] = ()
    specialised: tuple[str, ...] = ()  # key entries that are sizes fixed at compile time (KernelDecl.specialise)


@record
class KernelSpec:
    name: str
    params: tuple[ParamSpec, ...]
    variants: tuple[VariantSpec, ...]
    doc: str = ""
    meta: Mapping[str, Any] = Factory(dict)  # the declaration's constants (lists as tuples)


@record
class BuildInfo:
    arch: str  # "sm_90a"
    min_driver_cuda: int  # cuDriverGetVersion() value the cubins need, e.g. 13000
    tilelang: str = ""
    nvcc: str = ""
    lineinfo: bool = False
    tilebin: str = ""


@record
class Manifest:
    build: BuildInfo
    kernels: Mapping[str, KernelSpec] = Factory(dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        """Deterministic JSON (sorted keys, no timestamps): same inputs, same bytes.  The envelope
        (``build``, ``schema_version``) first, then ``"kernels"`` with one kernel per line, in name
        order (the layout :func:`split_kernel_lines` reads)."""
        head = json.dumps({"build": to_plain(self.build), "schema_version": self.schema_version}, sort_keys=True)
        lines = [json.dumps(name) + ": " + json.dumps(to_plain(k), sort_keys=True, separators=(",", ":"))
                 for name, k in sorted(self.kernels.items())]
        return head[:-1] + _KERNELS_OPEN + ",\n".join(lines) + _KERNELS_CLOSE


def to_plain(obj: Any) -> Any:
    if is_record(obj):
        return {n: to_plain(getattr(obj, n)) for n in record_fields(obj)}
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def _build(cls: type, data: Mapping[str, Any], where: str, **nested: Any) -> Any:
    try:
        fields = {k: v for k, v in data.items() if k not in nested}
        return cls(**fields, **nested)
    except TypeError as exc:
        raise ArtifactError(f"{where}: malformed {cls.__name__} ({exc})") from None


def _exprs(values: Any, where: str) -> tuple:
    if not isinstance(values, list):
        raise ArtifactError(f"{where}: expected a list of expressions, got {values!r}")
    for v in values:
        check_expr(v, where)
    return tuple(values)


def _parse_variant(data: Mapping[str, Any], where: str) -> VariantSpec:
    tensors = tuple(
        _build(TensorSpec, t, where, shape=_exprs(t.get("shape"), where), strides=_exprs(t.get("strides"), where),
               also_dtypes=tuple(map(str, _list(t.get("also_dtypes", []), where))))
        for t in data.get("tensors", [])
    )
    scalars = tuple(_build(ScalarSpec, s, where) for s in data.get("scalars", []))
    tma = tuple(
        _build(TmaSpec, m, where, dims=_exprs(m.get("dims"), where), strides=_exprs(m.get("strides"), where),
               box=tuple(m.get("box", ())), elem_strides=tuple(m.get("elem_strides", ())))
        for m in data.get("tma", [])
    )
    launches = []
    for ln in data.get("launches", []):
        args = tuple(_build(ArgSpec, a, where) for a in ln.get("args", []))
        launches.append(_build(LaunchSpec, ln, where, args=args, grid=_exprs(ln.get("grid"), where),
                               block=_exprs(ln.get("block"), where), cluster=tuple(ln.get("cluster", (1, 1, 1)))))
    conditions = tuple(_build(ConditionSpec, c, where) for c in _list(data.get("conditions", []), where))
    variant = _build(VariantSpec, data, where, key=MappingProxyType(dict(data.get("key", {}))), tensors=tensors,
                     scalars=scalars, tma=tma, launches=tuple(launches), conditions=conditions,
                     specialised=tuple(map(str, _list(data.get("specialised", []), where))))
    _check_variant(variant, where)
    return variant


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ArtifactError(f"{where}: expected a list, got {value!r}; rebuild the artifacts")
    return value


def _check_variant(v: VariantSpec, where: str) -> None:
    """Every symbol an expression reads must be bound by a tensor dim/stride or a scalar."""
    bound = {s.name for s in v.scalars}
    names = {t.name for t in v.tensors}
    for t in v.tensors:
        bound |= {e for e in (*t.shape, *t.strides) if isinstance(e, str)}
    used: set[str] = set()
    for t in v.tensors:
        used |= set().union(*(symbols_of(e) for e in (*t.shape, *t.strides))) if (t.shape or t.strides) else set()
    for m in v.tma:
        if m.param not in names:
            raise ArtifactError(f"{where}: TMA descriptor reads unknown tensor {m.param!r}")
        if not (len(m.dims) == len(m.box) == len(m.elem_strides) == m.rank and len(m.strides) == m.rank - 1):
            raise ArtifactError(f"{where}: TMA descriptor on {m.param!r} has inconsistent ranks")
        used |= set().union(*(symbols_of(e) for e in (*m.dims, *m.strides)))
    if not v.launches:
        raise ArtifactError(f"{where}: variant has no launches")
    if any(type(v.key.get(n)) is not int for n in v.specialised):
        raise ArtifactError(f"{where}: specialised sizes {v.specialised} lack int values in the key {dict(v.key)}; rebuild")
    for ln in v.launches:
        used |= set().union(*(symbols_of(e) for e in (*ln.grid, *ln.block)))
        for a in ln.args:
            if a.kind not in ARG_KINDS:
                raise ArtifactError(f"{where}: unknown argument kind {a.kind!r} in {ln.entry}")
            if a.kind == "ptr" and a.param not in names:
                raise ArtifactError(f"{where}: {ln.entry} passes the pointer of unknown tensor {a.param!r}")
            if a.kind == "tma" and not (isinstance(a.tma, int) and 0 <= a.tma < len(v.tma)):
                raise ArtifactError(f"{where}: {ln.entry} names TMA descriptor {a.tma!r}, which does not exist")
            if a.kind == "scalar":
                check_expr(a.value, where)
                used |= symbols_of(a.value)
    for c in v.conditions:
        check_expr(c.expr, f"{where} condition")
        if c.source not in CONDITION_SOURCES:
            raise ArtifactError(f"{where}: condition source {c.source!r} is not one of {CONDITION_SOURCES}")
        used |= symbols_of(c.expr)
    missing = used - bound
    if missing:
        raise ArtifactError(f"{where}: expressions read unbound symbols {sorted(missing)}")


def _check_optional(params: tuple[ParamSpec, ...], variants: tuple[VariantSpec, ...], where: str) -> None:
    """An optional tensor (passed as None: no shape) may bind no symbol that another parameter does
    not bind too, and may not be read through TMA (a descriptor needs a real address)."""
    optional = {p.name for p in params if p.optional}
    for p in params:
        if p.optional and p.kind != "tensor":
            raise ArtifactError(f"{where}: parameter {p.name!r} is marked optional but is not a tensor")
    for i, v in enumerate(variants):
        others = {s.name for s in v.scalars}
        for t in v.tensors:
            if t.name not in optional:
                others |= {e for e in (*t.shape, *t.strides) if isinstance(e, str)}
        for t in v.tensors:
            if t.name in optional:
                alone = {e for e in (*t.shape, *t.strides) if isinstance(e, str)} - others
                if alone:
                    raise ArtifactError(
                        f"{where} variant {i}: optional tensor {t.name!r} alone binds the sizes {sorted(alone)}; "
                        "give it shapes that other parameters also bind, or make it required")
        for m in v.tma:
            if m.param in optional:
                raise ArtifactError(f"{where} variant {i}: optional tensor {m.param!r} is read through TMA, "
                                    "which needs a real address; make it required")


def parse_kernel(name: str, k: Any, source: str) -> KernelSpec:
    """Check and freeze one kernel entry of a manifest (:class:`ArtifactError` naming it)."""
    where = f"{source}: kernel {name!r}"
    if not isinstance(k, Mapping):
        raise ArtifactError(f"{where}: expected an object, got {type(k).__name__}; rebuild the artifacts")
    params = tuple(_build(ParamSpec, p, where) for p in k.get("params", []))
    variants = tuple(_parse_variant(v, f"{where} variant {i}") for i, v in enumerate(k.get("variants", [])))
    meta = k.get("meta", {})
    if not isinstance(meta, Mapping):
        raise ArtifactError(f"{where}: meta must be an object, got {type(meta).__name__}; rebuild the artifacts")
    meta = MappingProxyType({key: tuple(v) if isinstance(v, list) else v for key, v in meta.items()})
    _check_optional(params, variants, where)
    return _build(KernelSpec, k, where, params=params, variants=variants, meta=meta)


_KERNELS_OPEN = ', "kernels": {\n'
_KERNELS_CLOSE = "\n}}\n"
_DECODER = json.JSONDecoder()


def split_kernel_lines(text: str | bytes) -> dict | None:
    """The manifest :meth:`Manifest.to_json` wrote, with each kernel left as its undecoded JSON
    text (:class:`LazyKernels` decodes it at first use); None for any other layout (the caller
    decodes it whole).  Raises ValueError for a malformed envelope or kernel name.

    Compact JSON never holds a raw newline (strings escape it), so the lines are the kernels.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    head, sep, body = text.partition(_KERNELS_OPEN)
    if not sep or not body.endswith(_KERNELS_CLOSE) or "\n" in head:
        return None
    data = json.loads(head + "}")
    kernels: dict[str, str] = {}
    body = body[:-len(_KERNELS_CLOSE)]
    for line in body.split("\n") if body else ():
        name, end = _DECODER.raw_decode(line)
        if not isinstance(name, str) or line[end:end + 2] != ": " or name in kernels:
            return None
        kernels[name] = line[end + 2:].removesuffix(",")
    data["kernels"] = kernels
    return data


class LazyKernels(Mapping):
    """The kernels of a manifest, each checked and frozen on first access (thread-safe).

    A wheel's manifest holds every variant of every family; checking all of them costs tens of
    milliseconds at the first launch, for kernels a process may never call.  The names are
    known at once; a malformed entry raises :class:`ArtifactError` naming the kernel when it is
    first used, before any GPU work (``tilebin.aot`` and ``wheels/verify_wheel.py`` check every
    entry eagerly when the artifacts are built).
    """

    def __init__(self, raw: Mapping[str, Any], source: str) -> None:
        self._raw, self._source = dict(raw), source
        self._parsed: dict[str, KernelSpec] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> KernelSpec:
        spec = self._parsed.get(name)
        if spec is None:
            raw = self._raw[name]  # KeyError for an unknown name, as a Mapping should
            with self._lock:
                spec = self._parsed.get(name)
                if spec is None:
                    if isinstance(raw, str):  # a line of split_kernel_lines: decoded now
                        try:
                            raw = json.loads(raw)
                        except ValueError as exc:
                            raise ArtifactError(f"{self._source}: kernel {name!r}: not valid JSON ({exc}); "
                                                "rebuild the artifacts") from None
                    spec = self._parsed[name] = parse_kernel(name, raw, self._source)
        return spec

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, name: object) -> bool:
        return name in self._raw


def parse_manifest(data: Mapping[str, Any] | str | bytes, source: str = "manifest", *,
                   lazy: bool = False) -> Manifest:
    """Check and freeze a manifest given as parsed JSON or as JSON text.

    ``lazy``: check the envelope now and each kernel on first access (:class:`LazyKernels`);
    the default checks everything now.
    """
    if isinstance(data, (str, bytes)):
        try:
            split = split_kernel_lines(data) if lazy else None
            data = json.loads(data) if split is None else split
        except ValueError as exc:
            raise ArtifactError(f"{source}: not valid JSON ({exc}); rebuild the artifacts") from None
    if not isinstance(data, Mapping):
        raise ArtifactError(f"{source}: expected a JSON object at the top level")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(
            f"{source}: schema_version {version!r}, this runtime reads {SCHEMA_VERSION}; "
            "install a tilebin whose runtime matches the artifacts (rebuild the wheel)"
        )
    build = _build(BuildInfo, data.get("build", {}), f"{source}: build")
    raw = data.get("kernels", {})
    if not isinstance(raw, Mapping):
        raise ArtifactError(f"{source}: 'kernels' must be an object; rebuild the artifacts")
    if lazy:
        kernels: Mapping[str, KernelSpec] = LazyKernels(raw, source)
    else:
        kernels = MappingProxyType({name: parse_kernel(name, k, source) for name, k in raw.items()})
    return Manifest(build=build, kernels=kernels, schema_version=version)
