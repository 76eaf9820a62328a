"""The layout compiler: one manifest variant becomes a :class:`Layout`, the data a Launcher runs.

Compiled once per Launcher: which runtime symbols a call reads (tensor sizes, strides, int scalar
parameters), every grid and scalar expression (as a Python closure for the pure-Python Launcher
and as a flat program for the compiled one), and the argument slots of every launch:

* ``ptr``    -- the data pointer of parameter ``pos``;
* ``prog``   -- an integer expression over the symbols, packed as ``dtype``;
* ``direct`` -- scalar parameter ``pos`` passed through unchanged, packed as ``dtype``;
* ``const``  -- 8 bytes fixed when the layout was compiled;
* ``tma``    -- the 128-byte descriptor ``tma`` of tensor parameter ``pos``.

:func:`unchecked_layout` reads every symbol per call (any shape, no validation: the op layer's
contract); :func:`bound_layout` starts from a validated :class:`~._plan.Binding`, so grids and
most scalars are constants and only pointers, pass-through scalars and TMA addresses change.
Pure Python; nothing here touches the GPU.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ._record import record
from ._errors import NoVariantError
from ._expr import OPS, Expr
from ._manifest import KernelSpec, LaunchSpec, VariantSpec
from ._scalars import slot_bytes
from ._tensors import key_text

_OPCODES = {"add": 2, "sub": 3, "mul": 4, "floordiv": 5, "floormod": 6, "truncdiv": 7, "truncmod": 8,
            "min": 9, "max": 10, "neg": 11}  # csrc/_hot.c: OP_ADD ...; 0 = const, 1 = symbol
SOURCE_KINDS = ("shape", "stride", "scalar")  # csrc/_hot.c: SRC_SHAPE ...


@record
class Slot:
    """One kernel argument: see the module docstring for the kinds."""

    kind: str
    dtype: str = ""
    pos: int = -1
    fn: Callable[[list], Any] | None = None  # prog: the Python closure over the symbol values
    prog: tuple[int, ...] = ()  # prog: the compiled program
    raw: bytes = b""  # const
    tma: int = -1


@record
class LaunchLayout:
    """One device-kernel launch: grid (closure and programs), static block and smem, slots, attributes."""

    spec: LaunchSpec
    where: str
    grid: Callable[[list], tuple]
    grid_progs: tuple[tuple[int, ...], ...]
    block: tuple[int, int, int]
    smem: int
    slots: tuple[Slot, ...]

    @property
    def special(self) -> bool:
        """Launched with ``cuLaunchKernelEx`` (cooperative, PDL or a cluster)."""
        s = self.spec
        return bool(s.cooperative or s.pdl or tuple(s.cluster) != (1, 1, 1))


@record
class Layout:
    """Everything a Launcher needs from the manifest, compiled once."""

    kernel: str
    where: str  # "kernel 'x' variant {k=v}"
    params: tuple[str, ...]
    first: int  # the tensor parameter that gives the device (unchecked launchers)
    tensors: tuple[int, ...]  # positions of the tensor parameters
    sources: tuple[tuple[int, int, int], ...]  # (SOURCE_KINDS index, param position, dim)
    getters: tuple[Callable[[tuple], Any], ...]  # Python twin of ``sources``
    launches: tuple[LaunchLayout, ...]
    ntma: int


def compile_expr(tree: Expr, slots: dict[str, int]) -> Callable[[list], Any]:
    """A closure ``f(symbols) -> value`` for a checked tree (``slots``: symbol -> index)."""
    if isinstance(tree, int):
        return lambda s, c=tree: c
    if isinstance(tree, str):
        i = slots[tree]
        return lambda s: s[i]
    fn = OPS[tree[0]][1]
    args = [compile_expr(a, slots) for a in tree[1:]]
    if len(args) == 1:
        (a,) = args
        return lambda s: fn(a(s))
    a, b = args
    if isinstance(tree[2], int):  # the common `sym op const` shape, one call fewer
        c = tree[2]
        return lambda s: fn(a(s), c)
    return lambda s: fn(a(s), b(s))


def program(tree: Expr, slots: dict[str, int]) -> tuple[int, ...]:
    """The same tree as a postfix program for the compiled path."""
    if isinstance(tree, int):
        return (0, tree)
    if isinstance(tree, str):
        return (1, slots[tree])
    return sum((program(a, slots) for a in tree[1:]), ()) + (_OPCODES[tree[0]],)


def symbol_sources(spec: KernelSpec, variant: VariantSpec) -> tuple[list[tuple[int, int, int]], dict[str, int]]:
    """What a call reads for the runtime symbols, each once, and each symbol's index.

    Shapes bind first, then strides, then scalars (the order ``runtime.launch`` binds them in).
    """
    position = {p.name: i for i, p in enumerate(spec.params)}
    sources: list[tuple[int, int, int]] = []
    slots: dict[str, int] = {}

    def bind(name: str, kind: int, p: int, d: int) -> None:
        if name not in slots:
            slots[name] = len(sources)
            sources.append((kind, p, d))

    late = []
    for t in variant.tensors:
        p = position[t.name]
        for d, e in enumerate(t.shape):
            if isinstance(e, str):
                bind(e, 0, p, d)
        late += [(e, p, d) for d, e in enumerate(t.strides) if isinstance(e, str)]
    for e, p, d in late:
        bind(e, 1, p, d)
    for sc in variant.scalars:
        bind(sc.name, 2, position[sc.name], 0)
    return sources, slots


def _getter(kind: int, p: int, d: int) -> Callable[[tuple], Any]:
    if kind == 2:
        return operator.itemgetter(p)
    if kind == 0:
        return lambda a: a[p].shape[d]
    return lambda a: a[p].stride()[d]


def _grid(fns: list[Callable[[list], int]]) -> Callable[[list], tuple]:
    x, y, z = fns
    return lambda s: (x(s), y(s), z(s))


def _base(spec: KernelSpec, variant: VariantSpec, sources: list, launches: list,
          tensors: tuple[int, ...] | None = None) -> Layout:
    if tensors is None:
        tensors = tuple(i for i, p in enumerate(spec.params) if p.kind == "tensor")
    where = f"kernel {spec.name!r} variant {key_text(variant.key)}"
    if not tensors:
        raise NoVariantError(f"{where}: has no tensor parameter to take the device from")
    return Layout(spec.name, where, tuple(p.name for p in spec.params), tensors[0], tensors, tuple(sources),
                  tuple(_getter(*s) for s in sources), tuple(launches), len(variant.tma))


def unchecked_layout(spec: KernelSpec, variant: VariantSpec) -> Layout:
    """The layout of an unchecked launcher: every symbol read per call.

    :class:`NoVariantError` when a launch needs TMA descriptors or a block that depends on
    runtime values (both need the validated path, ``runtime.launch``).
    """
    sources, slots = symbol_sources(spec, variant)
    position = {p.name: i for i, p in enumerate(spec.params)}
    scalar_params = {s: position[s] for s in slots if sources[slots[s]][0] == 2}
    where = f"kernel {spec.name!r} variant {key_text(variant.key)}"
    launches = []
    for ln in variant.launches:
        lwhere = f"{where}, entry {ln.entry}"
        if any(a.kind == "tma" for a in ln.args):
            raise NoVariantError(f"{where}: uses TMA descriptors, which the unchecked path does not encode; "
                                 "use tilebin.runtime.launch for it")
        if not all(isinstance(e, int) for e in ln.block):
            raise NoVariantError(f"{lwhere}: block {list(ln.block)!r} depends on runtime values; "
                                 "use tilebin.runtime.launch")
        args = []
        for a in ln.args:
            if a.kind == "ptr":
                args.append(Slot("ptr", pos=position[a.param]))
            elif isinstance(a.value, str) and a.value in scalar_params:
                args.append(Slot("direct", a.dtype, scalar_params[a.value]))
            elif isinstance(a.value, int):
                args.append(Slot("const", a.dtype, raw=slot_bytes(a.dtype, a.value, f"{lwhere} scalar")))
            else:
                args.append(Slot("prog", a.dtype, fn=compile_expr(a.value, slots), prog=program(a.value, slots)))
        grid = [compile_expr(e, slots) for e in ln.grid]
        launches.append(LaunchLayout(ln, lwhere, _grid(grid), tuple(program(e, slots) for e in ln.grid),
                                     tuple(ln.block), ln.smem, tuple(args)))
    return _base(spec, variant, sources, launches)


def bound_layout(spec: KernelSpec, binding: Any) -> Layout:
    """The layout of a validated call (a :class:`~._plan.Binding`): constant grids and scalars,
    pass-through scalars re-read per call, TMA descriptors by index."""
    where = binding.where()
    positions = binding.tensor_positions
    launches = []
    for bl in binding.launches:
        lwhere = f"{where}, entry {bl.spec.entry}"
        args = []
        for a in bl.args:
            if a[0] == "ptr":
                args.append(Slot("ptr", pos=positions[a[1]]))
            elif a[0] == "tma":
                args.append(Slot("tma", pos=positions[binding.tma[a[1]].tensor_index], tma=a[1]))
            elif a[3] is not None:
                args.append(Slot("direct", a[1], a[3]))
            else:
                args.append(Slot("const", a[1], raw=slot_bytes(a[1], a[2], f"{lwhere} scalar")))
        grid = tuple(bl.grid)
        launches.append(LaunchLayout(bl.spec, lwhere, lambda s, g=grid: g, tuple((0, g) for g in grid),
                                     tuple(bl.block), bl.spec.smem, tuple(args)))
    return _base(spec, binding.variant, [], launches, tuple(positions))  # optional tensors passed as None: not read
