"""Does a recorded launch ``(kernel, key, args)`` satisfy the kernel's manifest contract?

The op layer launches through the runtime's unchecked path, so nothing checks its arguments
against the manifest at run time: this is that check, for tests.  It follows the contract of
``runtime/_manifest.py`` (the variant whose key equals the launch key; per tensor: dtype, rank,
static dims, dims bound to runtime symbols consistently across tensors, strides, alignment,
``max_elements``, outputs not overlapping other arguments; per scalar: its C type's range).
"""

from __future__ import annotations

import json
import math
import pathlib
import zipfile
from typing import Any

import torch

from tilebin.runtime._expr import evaluate
from tilebin.runtime._manifest import KernelSpec, Manifest, parse_manifest

_INT_RANGES = {f"int{b}": (-(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)}
_INT_RANGES.update({f"uint{b}": (0, (1 << b) - 1) for b in (8, 16, 32, 64)})


def manifest_from_wheel(wheel) -> Manifest:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith("_artifacts/manifest.json"))
        return parse_manifest(json.loads(zf.read(name)))


def built_manifest(request) -> Manifest:
    """The manifest of the AOT build in the checkout (build/<tag>/artifacts, newest), else of the
    newest wheel in wheels/dist (pytest's ``built_wheel`` fixture: skip, or fail under CI)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    found = sorted(root.glob("build/*/artifacts/manifest.json"), key=lambda p: p.stat().st_mtime)
    if found:
        return parse_manifest(json.loads(found[-1].read_text()))
    return manifest_from_wheel(request.getfixturevalue("built_wheel"))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def output_names(spec: KernelSpec, key: dict) -> set[str]:
    return {t.name for t in _variant(spec, key).tensors if t.output}


def _variant(spec: KernelSpec, key: dict):
    for v in spec.variants:
        if dict(v.key) == key:
            return v
    raise AssertionError(f"{spec.name}: the ops launched key {key}, which no variant has")


def check_launch(spec: KernelSpec, key: dict, args: tuple) -> None:
    """AssertionError naming the kernel and the argument unless the launch keeps the contract."""
    variant = _variant(spec, key)
    where = f"{spec.name} {key}"
    assert len(args) == len(spec.params), f"{where}: {len(args)} arguments for {len(spec.params)} parameters"
    tensors = {t.name: t for t in variant.tensors}
    scalars = {s.name: s for s in variant.scalars}
    env: dict[str, Any] = {}
    pending: list[tuple[Any, int, str]] = []
    for i, (p, a) in enumerate(zip(spec.params, args)):
        if p.kind == "scalar":
            env[p.name] = _check_scalar(where, p.name, scalars[p.name].dtype, a)
            continue
        t = tensors[p.name]
        if _stand_in(i, a, args) and not t.output and (_dtype_name(a.dtype) not in (t.dtype, *t.also_dtypes) or a.dim() != len(t.shape)):
            continue
        assert isinstance(a, torch.Tensor), f"{where}: {p.name} is {type(a).__name__}, not a tensor"
        assert _dtype_name(a.dtype) in (t.dtype, *t.also_dtypes), \
            f"{where}: {p.name} has dtype {a.dtype}, the variant takes {' / '.join((t.dtype, *t.also_dtypes))}"
        assert a.dim() == len(t.shape), f"{where}: {p.name} has rank {a.dim()}, the variant takes {len(t.shape)}"
        for d, (dim, stride) in enumerate(zip(t.shape, t.strides)):
            _bind(env, pending, where, f"{p.name}.shape[{d}]", dim, a.shape[d])
            if a.shape[d] > 1 and a.numel():  # strides of empty tensors mean nothing (torch: contiguous)
                _bind(env, pending, where, f"{p.name}.stride({d})", stride, a.stride(d))
        if a.numel():
            assert a.data_ptr() % t.align == 0, f"{where}: {p.name} is not {t.align}-byte aligned"
        if t.max_elements is not None:
            assert a.numel() <= t.max_elements, f"{where}: {p.name} has {a.numel()} > {t.max_elements} elements"
    for tree, got, what in pending:
        assert evaluate(tree, env) == got, f"{where}: {what} is {got}, the manifest says {tree!r} = " \
                                           f"{evaluate(tree, env)} with {env}"
    _check_overlap(where, spec, variant, args)


def _stand_in(i: int, a: Any, args: tuple) -> bool:
    """A tensor passed at another position too: where it does not fit the parameter (dtype or
    rank) it is the ops' stand-in for an absent optional input, which the kernel does not read
    (its presence flag is 0); it is checked where it fits."""
    return any(b is a for j, b in enumerate(args) if j != i)


def _bind(env: dict, pending: list, where: str, what: str, tree: Any, got: int) -> None:
    if isinstance(tree, int):
        assert got == tree, f"{where}: {what} is {got}, the variant needs {tree}"
    elif isinstance(tree, str) and tree not in env:
        assert -(2**31) <= got < 2**31, f"{where}: {what} = {got} does not fit the int32 symbol {tree}"
        env[tree] = got
    else:
        pending.append((tree, got, what))


def _check_scalar(where: str, name: str, dtype: str, value: Any) -> Any:
    if dtype in _INT_RANGES:
        lo, hi = _INT_RANGES[dtype]
        assert type(value) in (int, bool) and lo <= value <= hi, f"{where}: scalar {name}={value!r} is not {dtype}"
    elif dtype == "bool":
        assert type(value) in (bool, int) and value in (0, 1), f"{where}: scalar {name}={value!r} is not a bool"
    else:
        assert type(value) in (int, float) and not isinstance(value, bool), f"{where}: scalar {name}={value!r}"
        assert math.isnan(value) or abs(value) <= 3.5e38 or math.isinf(value), f"{where}: {name}={value!r}"
    return value


def _span(t: torch.Tensor) -> tuple[int, int]:
    if not t.numel():
        return (0, 0)
    size = t.element_size()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * size


def _check_overlap(where: str, spec: KernelSpec, variant, args: tuple) -> None:
    outs = {t.name for t in variant.tensors if t.output}
    named = [(p.name, a) for p, a in zip(spec.params, args) if p.kind == "tensor"]
    for name, a in named:
        if name not in outs or not a.numel():
            continue
        lo, hi = _span(a)
        for other, b in named:
            if other != name and b.numel():
                blo, bhi = _span(b)
                assert hi <= blo or bhi <= lo, f"{where}: output {name} overlaps {other}"
