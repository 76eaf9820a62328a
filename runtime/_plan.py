"""Validation: a call's arguments, checked against the chosen variant, become a :class:`Binding`.

Everything the launch needs that does not come from the driver is computed here, before
any GPU work: runtime symbols bound from shapes and strides, every shape/stride rule,
``max_elements``, scalar types and ranges, grids and scalar kernel arguments, TMA
descriptor geometry, and the per-call pointer rules (:class:`PointerGuard`: alignment
and output aliasing).  Every error is an :class:`ArgumentError` naming the kernel, the
parameter, what was received, what is required and the fix.  Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._record import record
from ._errors import ArgumentError
from ._expr import Expr, evaluate, symbols_of, to_text
from ._launcher import GRID_MAX
from ._manifest import KernelSpec, LaunchSpec, TensorSpec, VariantSpec
from ._scalars import SCALAR_DTYPES, convert_scalar
from ._tensors import TensorInfo, key_text
from ._tma import BoundTma

_BLOCK_MAX = (1024, 1024, 64)


def _eval(tree: Expr, env: Mapping[str, Any], kernel: str, what: str) -> Any:
    try:
        return evaluate(tree, env)
    except ZeroDivisionError:
        raise ArgumentError(f"{kernel}: {what} {tree!r} divides by zero with {dict(env)}; check the sizes") from None


def direct_scalars(spec: KernelSpec) -> frozenset[str]:
    """Scalar params only ever passed through unchanged as kernel arguments (patched per call, not keyed)."""
    names = {p.name for p in spec.params if p.kind == "scalar"}
    for v in spec.variants:
        for t in v.tensors:
            names -= set().union(set(), *(symbols_of(e) for e in (*t.shape, *t.strides)))
        for m in v.tma:
            names -= set().union(set(), *(symbols_of(e) for e in (*m.dims, *m.strides)))
        for c in v.conditions:  # checked when the plan is built: keyed by value, never passed through
            names -= symbols_of(c.expr)
        for ln in v.launches:
            names -= set().union(set(), *(symbols_of(e) for e in (*ln.grid, *ln.block)))
            for a in ln.args:
                if a.kind == "scalar" and not isinstance(a.value, str):
                    names -= symbols_of(a.value)
    return frozenset(names)


def check_devices(kernel: str, infos: Mapping[str, TensorInfo]) -> int:
    """All tensors on one CUDA device; returns its ordinal."""
    device = None
    for name, info in infos.items():
        if info.device < 0:
            raise ArgumentError(
                f"{kernel}: parameter {name!r} is a tensor {info.where}, but tilebin kernels run on a CUDA GPU; "
                f"move it there with {name}.cuda() (or create it with device='cuda')"
            )
        if device is None:
            device, first = info.device, name
        elif info.device != device:
            raise ArgumentError(
                f"{kernel}: parameter {name!r} is on cuda:{info.device} but {first!r} is on cuda:{device}; "
                "put every tensor on the same GPU"
            )
    return 0 if device is None else device


@record
class BoundLaunch:
    """One device-kernel launch with everything evaluated: grid, block, and its argument list.

    args entries: ``("ptr", tensor_index)``, ``("scalar", dtype, value, param_position | None)``
    (a position means the value is re-read from that parameter on every call), ``("tma", tma_index)``.
    """

    spec: LaunchSpec
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[tuple, ...]


class PointerGuard:
    """Per-call pointer rules of a plan: alignment of each tensor and no output overlapping another.

    ``names`` / ``masks`` / ``spans`` are per tensor parameter, in ``params`` order.
    """

    def __init__(self, kernel: str, names: list[str], aligns: list[int], spans: list[tuple[int, int]],
                 outputs: list[bool]) -> None:
        self.kernel, self.names, self.spans = kernel, names, spans
        self.masks = [a - 1 for a in aligns]
        self.pairs = [
            (o, x) for o in range(len(names)) for x in range(len(names))
            if outputs[o] and x != o and not (outputs[x] and x < o)
            and spans[o][0] < spans[o][1] and spans[x][0] < spans[x][1]
        ]

    def check(self, ptrs: tuple[int, ...]) -> None:
        """Raise :class:`ArgumentError` for a misaligned pointer or an overlapping output."""
        for name, mask, p in zip(self.names, self.masks, ptrs):
            if p & mask:
                raise ArgumentError(
                    f"{self.kernel}: parameter {name!r} has data pointer {p:#x}, not {mask + 1}-byte aligned "
                    "(the kernel uses vector/TMA loads); pass a tensor whose storage starts aligned, "
                    f"e.g. {name}.clone()"
                )
        for o, x in self.pairs:
            (lo_o, hi_o), (lo_x, hi_x) = self.spans[o], self.spans[x]
            a0, a1, b0, b1 = ptrs[o] + lo_o, ptrs[o] + hi_o, ptrs[x] + lo_x, ptrs[x] + hi_x
            if a0 < b1 and b0 < a1:
                raise ArgumentError(
                    f"{self.kernel}: output {self.names[o]!r} (bytes {a0:#x}..{a1:#x}) overlaps "
                    f"{self.names[x]!r} (bytes {b0:#x}..{b1:#x}); outputs must not alias other arguments: "
                    "pass a separate output tensor"
                )


@record
class Binding:
    """A validated call: the variant, the device, evaluated launches and TMA geometry, the pointer rules."""

    kernel: str
    variant_index: int
    variant: VariantSpec
    device: int
    tensor_positions: tuple[int, ...]
    launches: tuple[BoundLaunch, ...]
    tma: tuple[BoundTma, ...]
    guard: PointerGuard
    env: Mapping[str, Any]

    def where(self) -> str:
        return f"kernel {self.kernel!r} variant {key_text(self.variant.key)}"


def bind_call(spec: KernelSpec, index: int, variant: VariantSpec, values: list, infos: Mapping[str, TensorInfo],
              direct: frozenset[str]) -> Binding:
    """Validate a call against ``variant`` (chosen by dispatch) and evaluate its launches.

    ``values`` are the arguments in ``spec.params`` order, ``infos`` the tensors among them
    (by name, in that order), ``direct`` the scalars re-read on every call.  Raises
    :class:`ArgumentError`; touches no GPU.
    """
    kernel = spec.name
    positions = {p.name: i for i, p in enumerate(spec.params)}
    names = list(infos)
    tensor_index = {n: i for i, n in enumerate(names)}
    env, origin = _bind_symbols(kernel, variant.tensors, infos)
    for s in variant.scalars:
        env[s.name] = convert_scalar(values[positions[s.name]], s.dtype, f"{kernel}: scalar {s.name!r}")
        origin.setdefault(s.name, f"scalar {s.name}")
    unmet = unmet_conditions(variant, env, origin)
    if unmet:
        raise UnmetConditions(index, variant, unmet)
    _check_tensors(kernel, variant.tensors, infos, env, origin)
    launches = tuple(
        b for b in (_bind_launch(kernel, ln, env, origin, tensor_index, positions, direct) for ln in variant.launches)
        if 0 not in b.grid  # an empty problem: nothing to launch
    )
    used = {a[1] for b in launches for a in b.args if a[0] == "tma"}
    tma = tuple(_bind_tma(kernel, m, env, tensor_index, infos) if i in used else None
                for i, m in enumerate(variant.tma))
    guard = _guard(kernel, variant, names, infos, tma)
    guard.check(tuple(infos[n].ptr for n in names))
    return Binding(kernel, index, variant, check_devices(kernel, infos), tuple(positions[n] for n in names),
                   launches, tma, guard, env)


class UnmetConditions(Exception):
    """Internal: ``variant`` (index ``index``) does not serve the call; ``unmet`` says why, one
    text per failed condition.  The registry then tries the next matching variant."""

    def __init__(self, index: int, variant: VariantSpec, unmet: list[str]) -> None:
        super().__init__("; ".join(unmet))
        self.index, self.variant, self.unmet = index, variant, unmet


def unmet_conditions(variant: VariantSpec, env: Mapping, origin: Mapping) -> list[str]:
    """The variant's conditions the call fails, each as ``text (symbol = value from where, ...)``."""
    unmet = []
    for c in variant.conditions:
        try:
            ok = evaluate(c.expr, env)
        except ZeroDivisionError:
            ok = False
        if not ok:
            values = ", ".join(f"{s} = {env[s]} from {origin.get(s, s)}" for s in sorted(symbols_of(c.expr)))
            what = "the kernel's T.assume" if c.source == "assume" else "declared"
            unmet.append(f"{to_text(c.expr)} ({values}; {what})")
    return unmet


def _bind_symbols(kernel: str, tensors: tuple[TensorSpec, ...],
                  infos: Mapping[str, TensorInfo]) -> tuple[dict, dict]:
    """Bind runtime symbols from shapes, then strides (strides of size-1 dims bind only what is left)."""
    env: dict[str, Any] = {}
    origin: dict[str, str] = {}
    late = []
    for t in tensors:
        info = infos.get(t.name)
        if info is None:
            continue
        for i, want in enumerate(t.shape):
            _bind_one(kernel, env, origin, want, info.shape[i], f"{t.name}.shape[{i}]")
        for i, want in enumerate(t.strides[: len(info.shape)]):
            if info.shape[i] == 1 or info.numel == 0:
                late.append((want, info.strides[i], f"{t.name}.stride({i})"))
            elif isinstance(want, str) and want not in env:  # mismatches: _check_strides says "contiguous"
                env[want], origin[want] = info.strides[i], f"{t.name}.stride({i})"
    for want, got, what in late:
        if isinstance(want, str) and want not in env:
            env[want], origin[want] = got, what
    return env, origin


def _bind_one(kernel: str, env: dict, origin: dict, want: Expr, got: int, what: str) -> None:
    if not isinstance(want, str):
        return  # static and expression entries are checked once everything is bound
    if want not in env:
        env[want], origin[want] = got, what
    elif env[want] != got:
        raise ArgumentError(
            f"{kernel}: {what} is {got} but {origin[want]} is {env[want]}; both are the runtime size {want!r} "
            "and must agree: pass tensors whose sizes match"
        )


def _check_tensors(kernel: str, tensors: tuple[TensorSpec, ...], infos: Mapping[str, TensorInfo],
                   env: dict, origin: dict) -> None:
    """Static and expression dims, stride rules, ``max_elements``."""
    for t in tensors:
        info = infos.get(t.name)
        if info is None:
            continue
        for i, want in enumerate(t.shape):
            need = _eval(want, env, kernel, f"{t.name}.shape[{i}]")
            if need != info.shape[i]:
                used = ", ".join(f"{s}={env[s]} (from {origin[s]})" for s in sorted(symbols_of(want)))
                raise ArgumentError(
                    f"{kernel}: {t.name}.shape[{i}] is {info.shape[i]} but must be {need} "
                    f"(= {want!r}{' with ' + used if used else ''}); pass a tensor of shape that matches"
                )
        if info.numel and t.strides:
            _check_strides(kernel, t, info, env)
        if t.max_elements is not None and info.numel > t.max_elements:
            raise ArgumentError(
                f"{kernel}: {t.name} has {info.numel} elements but this kernel indexes with 32-bit integers "
                f"and takes at most {t.max_elements}; split the call into smaller pieces"
            )


def _check_strides(kernel: str, t: TensorSpec, info: TensorInfo, env: dict) -> None:
    need = tuple(_eval(s, env, kernel, f"{t.name}.stride") for s in t.strides)
    for i, (want, got) in enumerate(zip(need, info.strides)):
        if info.shape[i] != 1 and want != got:
            layout = "contiguous (row-major)" if _is_row_major(need, info.shape) else "this exact layout"
            raise ArgumentError(
                f"{kernel}: {t.name} has strides {info.strides} (in elements) but the kernel needs {need} "
                f"(stride({i}) differs); it reads {t.name} as {layout}: call {t.name}.contiguous() first"
            )


def _is_row_major(strides: tuple, shape: tuple) -> bool:
    acc = 1
    for s, d in zip(reversed(strides), reversed(shape)):
        if d != 1 and s != acc:
            return False
        acc *= d
    return True


def _dims(kernel: str, entry: str, what: str, exprs: tuple, env: Mapping) -> tuple[int, int, int]:
    dims = tuple(_eval(e, env, kernel, f"{entry} {what}") for e in exprs)
    limit = GRID_MAX if what == "grid" else _BLOCK_MAX
    for d, e, top in zip(dims, exprs, limit):
        if not isinstance(d, int) or not 0 <= d <= top:
            raise ArgumentError(
                f"{kernel}: {entry} {what} {dims} (from {list(exprs)!r} with {dict(env)}) is outside "
                f"[0, {list(limit)}]; the inputs are too large (or negative) for this variant: split the call"
            )
    if what == "block" and (0 in dims or math.prod(dims) > 1024):
        raise ArgumentError(f"{kernel}: {entry} block {dims} is not a valid thread block; rebuild the artifacts")
    return dims


def _bind_launch(kernel: str, ln: LaunchSpec, env: Mapping, origin: Mapping, tensor_index: Mapping[str, int],
                 positions: Mapping[str, int], direct: frozenset[str]) -> BoundLaunch:
    grid = _dims(kernel, ln.entry, "grid", ln.grid, env)
    block = _dims(kernel, ln.entry, "block", ln.block, env)
    args: list[tuple] = []
    for j, a in enumerate(ln.args):
        if a.kind == "ptr" and a.param not in tensor_index:  # an optional tensor passed as None
            args.append(("scalar", "uint64", 0, None))
        elif a.kind == "ptr":
            args.append(("ptr", tensor_index[a.param]))
        elif a.kind == "tma":
            args.append(("tma", a.tma))
        else:
            what = f"{kernel}: {ln.entry} argument {j} ({a.value!r})"
            kind, lo, hi = SCALAR_DTYPES.get(a.dtype, ("?", 0, 0))
            from_tensors = symbols_of(a.value) & origin.keys() if kind == "i" else set()
            for s in sorted(from_tensors):
                if not lo <= env[s] <= hi:
                    raise ArgumentError(
                        f"{kernel}: {origin[s]} = {env[s]} overflows the {a.dtype} index math of this kernel "
                        f"(limit {hi}); split the call into smaller pieces"
                    )
            value = convert_scalar(_eval(a.value, env, kernel, what), a.dtype, what)
            pos = positions[a.value] if isinstance(a.value, str) and a.value in direct else None
            args.append(("scalar", a.dtype, value, pos))
    return BoundLaunch(ln, grid, block, tuple(args))


def _bind_tma(kernel: str, m: Any, env: Mapping, tensor_index: Mapping[str, int],
              infos: Mapping[str, TensorInfo]) -> BoundTma:
    dims = tuple(_eval(e, env, kernel, f"TMA descriptor of {m.param} dims") for e in m.dims)
    strides = tuple(_eval(e, env, kernel, f"TMA descriptor of {m.param} strides") for e in m.strides)
    step = 32 if m.interleave else 16
    if any(not 1 <= d <= 1 << 32 for d in dims):
        raise ArgumentError(
            f"{kernel}: {m.param} gives TMA dims {dims}; every dim must be in [1, 2^32] (an empty or huge "
            f"tensor cannot be described): skip empty calls or split the input"
        )
    if any(s % step or not 0 < s < 1 << 40 for s in strides):
        raise ArgumentError(
            f"{kernel}: {m.param} has byte strides {strides} (outer dims); the kernel loads it with TMA, which needs "
            f"every outer stride to be a multiple of {step} bytes: pad the innermost dim (allocate a padded "
            f"buffer and slice it), or call .contiguous() on a tensor whose rows are {step}-byte multiples"
        )
    return BoundTma(tensor_index[m.param], m.dtype, m.rank, dims, strides, tuple(m.box), tuple(m.elem_strides),
                    m.interleave, m.swizzle, m.l2_promotion, m.oob_fill)


def _guard(kernel: str, variant: VariantSpec, names: list[str], infos: Mapping[str, TensorInfo],
           tma: tuple) -> PointerGuard:
    specs = {t.name: t for t in variant.tensors}
    aligns, spans, outputs = [], [], []
    for i, n in enumerate(names):
        t, info = specs.get(n), infos[n]
        align = t.align if t is not None else 1
        for m in tma:
            if m is not None and m.tensor_index == i:
                align = max(align, 32 if m.interleave else 16)
        aligns.append(align)
        spans.append(_span(info))
        outputs.append(bool(t is not None and t.output))
    return PointerGuard(kernel, names, aligns, spans, outputs)


def _span(info: TensorInfo) -> tuple[int, int]:
    """Byte offsets [lo, hi) the tensor touches relative to its data pointer (empty: (0, 0))."""
    if info.numel == 0:
        return (0, 0)
    lo = sum(s * (d - 1) for s, d in zip(info.strides, info.shape) if s < 0)
    hi = sum(s * (d - 1) for s, d in zip(info.strides, info.shape) if s > 0)
    return (lo * info.itemsize, (hi + 1) * info.itemsize)
