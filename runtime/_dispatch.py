"""Binding call arguments to a kernel's parameters, and picking the variant that serves them.

A variant matches when every tensor's dtype and rank equal the variant's, every static
dim matches, and every compile-time key given as a keyword equals the variant's key.  The
first match in manifest order wins.  Pure Python: nothing here touches the GPU.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from ._errors import ArgumentError, NoVariantError, UnknownKernelError
from ._manifest import KernelSpec, VariantSpec
from ._tensors import TensorInfo, key_text, key_value

_MAX_LISTED = 8


INTERNAL_FAMILIES = frozenset({"testing"})


def is_internal(name: str) -> bool:
    """Whether kernel ``name`` is internal, not a production kernel: its family (the part before
    the first dot) is ``testing`` (runtime feature tests: cooperative launch, PDL, and
    ``testing.gemm_nt``, a GEMM that exercises TMA, clusters and PDL, not a tuned one), or the name
    (or its family or op) starts with ``_``.  Internal kernels are hidden from ``kernel_names()`` only."""
    family, _, op = name.partition(".")
    return family in INTERNAL_FAMILIES or family.startswith("_") or op.startswith("_")


def unknown_kernel(name: str, known: Iterable[str]) -> UnknownKernelError:
    """The error for a kernel name not in the artifacts: the name, the nearest names (internal ones
    included: they launch by name), else the first public names, and how to list the kernels."""
    known = sorted(known)
    close = tuple(difflib.get_close_matches(str(name), known, n=5, cutoff=0.5))
    if close:
        hint = f"did you mean {', '.join(map(repr, close))}?"
    else:
        public = [k for k in known if not is_internal(k)]
        more = f" (+{len(public) - _MAX_LISTED} more)" if len(public) > _MAX_LISTED else ""
        hint = f"known kernels: {', '.join(public[:_MAX_LISTED]) or 'none'}{more};"
    return UnknownKernelError(
        f"unknown kernel {name!r}; {hint} runtime.kernel_names() (or `python -m tilebin list`) lists the "
        "kernels this wheel ships",
        name=str(name), close=close,
    )


def find_variant(spec: KernelSpec, key: dict[str, Any]) -> VariantSpec:
    """The variant whose key is exactly ``key``; :class:`NoVariantError` listing the keys otherwise."""
    for v in spec.variants:
        if dict(v.key) == key:
            return v
    shown = "; ".join(key_text(v.key) for v in spec.variants[:12])
    more = f" (+{len(spec.variants) - 12} more)" if len(spec.variants) > 12 else ""
    raise NoVariantError(f"kernel {spec.name!r}: no prebuilt variant has key {key}; available: {shown}{more}")


def key_names(spec: KernelSpec) -> list[str]:
    """Every compile-time key name used by any variant, in first-seen order."""
    names: dict[str, None] = {}
    for v in spec.variants:
        names.update(dict.fromkeys(v.key))
    return list(names)


def bind(spec: KernelSpec, args: tuple, kwargs: Mapping[str, Any], keys: list[str]) -> tuple[list, tuple]:
    """Place positional and keyword arguments in ``spec.params`` order; split off key keywords.

    Returns ``(values, key_items)`` with ``key_items`` a sorted tuple of ``(name, value)``.
    Raises :class:`ArgumentError` for too many/missing arguments, duplicates and unknown keywords.
    A key value that is not bool/int/float/str (a config object) stands for its ``repr``, the
    spelling ``KernelDecl.from_jit`` gives such values in the manifest.
    """
    names = [p.name for p in spec.params]
    if len(args) > len(names):
        raise ArgumentError(
            f"{spec.name}: takes {len(names)} positional argument(s) ({', '.join(names)}), got {len(args)}"
        )
    values: list[Any] = list(args) + [_MISSING] * (len(names) - len(args))
    key_items = []
    for k, v in kwargs.items():
        if k in names:
            i = names.index(k)
            if values[i] is not _MISSING:
                raise ArgumentError(f"{spec.name}: got {k!r} both by position and by keyword")
            values[i] = v
        elif k in keys:
            key_items.append((k, key_value(v)))  # a config object: its repr, as the manifest keys it
        else:
            raise ArgumentError(_unknown_keyword(spec, k, keys))
    missing = [n for n, v in zip(names, values) if v is _MISSING]
    if missing:
        raise ArgumentError(f"{spec.name}: missing argument(s) {', '.join(missing)}; signature: ({', '.join(names)})")
    return values, tuple(sorted(key_items))


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _unknown_keyword(spec: KernelSpec, k: str, keys: list[str]) -> str:
    scalars = [p.name for p in spec.params if p.kind == "scalar"]
    close = difflib.get_close_matches(k, [p.name for p in spec.params] + keys, n=3, cutoff=0.6)
    return (
        f"{spec.name}: unexpected keyword {k!r}"
        + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")
        + f"; scalar parameters: {', '.join(scalars) or 'none'}; compile-time keys: {', '.join(keys) or 'none'}"
    )


def check_ranks(spec: KernelSpec, infos: Mapping[str, TensorInfo]) -> None:
    """Raise :class:`ArgumentError` when a tensor's rank is served by no variant at all.

    (A dtype no variant serves is a :class:`NoVariantError` from :func:`matching_variants`, which lists
    the dtypes that are served.)
    """
    for name, info in infos.items():
        ranks = sorted({len(t.shape) for v in spec.variants for t in v.tensors if t.name == name})
        if ranks and len(info.shape) not in ranks:
            raise ArgumentError(
                f"{spec.name}: parameter {name!r} is {len(info.shape)}-D with shape {info.shape}, but this "
                f"kernel takes a {' or '.join(map(str, ranks))}-D tensor there; reshape it first"
            )


def _served_dtypes(spec: KernelSpec, infos: Mapping[str, TensorInfo]) -> str:
    parts = []
    for name in infos:
        dtypes = list(dict.fromkeys(d for v in spec.variants for t in v.tensors if t.name == name
                                    for d in (t.dtype, *t.also_dtypes)))
        if dtypes:
            parts.append(f"{name}: {' / '.join(dtypes)}")
    return "; ".join(parts)


def _mismatches(variant: VariantSpec, infos: Mapping[str, TensorInfo], key_items: tuple) -> list[str]:
    """Why ``variant`` does not serve the call (empty when it matches)."""
    why = []
    for k, v in key_items:
        if k not in variant.key:
            why.append(f"has no key {k!r}")
        elif not _same(variant.key[k], v):
            why.append(f"{k}={variant.key[k]!r}")
    for t in variant.tensors:
        info = infos.get(t.name)
        if info is None:
            continue
        if info.dtype != t.dtype and info.dtype not in t.also_dtypes:
            why.append(f"{t.name}: {' / '.join((t.dtype, *t.also_dtypes))}")
        if len(info.shape) != len(t.shape):
            why.append(f"{t.name}: {len(t.shape)}-D")
            continue
        for i, (want, got) in enumerate(zip(t.shape, info.shape)):
            if isinstance(want, int) and not isinstance(want, bool) and want != got:
                why.append(f"{t.name}.shape[{i}] == {want}")
    return why


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def matching_variants(spec: KernelSpec, infos: Mapping[str, TensorInfo],
                      key_items: tuple) -> list[tuple[int, VariantSpec]]:
    """Every variant (index, spec) whose dtypes, ranks, static dims and keys serve the call, in
    manifest order (their conditions are checked once sizes are bound: :func:`unmet_error`);
    :class:`NoVariantError` listing the nearest when there is none."""
    scored, found = [], []
    for i, variant in enumerate(spec.variants):
        why = _mismatches(variant, infos, key_items)
        if not why:
            found.append((i, variant))
        elif not found:
            scored.append((len(why), i, variant, why))
    if found:
        return found
    scored.sort(key=lambda s: (s[0], s[1]))
    asked = ", ".join(f"{n}: {t.dtype}{list(t.shape)}" for n, t in infos.items())
    kw = ", ".join(f"{k}={v!r}" for k, v in key_items)
    lines = [f"  {key_text(v.key)} -- needs {'; '.join(why)}" for _, _, v, why in scored[:_MAX_LISTED]]
    if len(scored) > _MAX_LISTED:
        lines.append(f"  ... and {len(scored) - _MAX_LISTED} more (runtime.spec({spec.name!r}).variants)")
    raise NoVariantError(
        f"{spec.name}: no prebuilt variant for {asked or 'these arguments'}"
        + (f" with {kw}" if kw else "")
        + f".\nDtypes served: {_served_dtypes(spec, infos)}."
        + "\nAvailable variants, nearest first:\n" + "\n".join(lines)
        + "\nPass arguments matching one of them, or add the variant to the kernel's grid and rebuild."
    )


def unmet_error(spec: KernelSpec, unmet: list) -> NoVariantError:
    """The error for a call whose matching variants all fail a condition (``unmet``: the
    :class:`~._plan.UnmetConditions` of each, in order)."""
    lines = [f"  {key_text(u.variant.key)} -- needs {'; '.join(u.unmet)}" for u in unmet[:_MAX_LISTED]]
    return NoVariantError(
        f"{spec.name}: no prebuilt variant serves these sizes; each variant that matches the dtypes fails a "
        "condition:\n" + "\n".join(lines)
        + "\nPass sizes that meet a variant's conditions (pad or split the input), or declare a variant "
        "without the condition and rebuild."
    )
