"""The registry: a manifest, its kernels, their prepared plans, and the launch entry point.

``Registry(artifacts_dir).launch(name, *args, stream=None, **kwargs)``:

1. the call's signature (per tensor: dtype, shape, strides, device; pass-through scalars by
   type, other scalars by value; key keywords) is looked up in the kernel's plan cache (the
   compiled path, ``runtime.launch`` itself in C, first compares it with the kernel's recent
   signatures as C values: csrc/_hot_recent.h);
2. on a miss: bind arguments, describe tensors, check devices, dtypes and ranks, pick the
   variant, validate everything (:mod:`._plan`) -- all before any GPU work -- then check the
   device, load the cubin and prepare the launch (:mod:`._launch`), and cache the plan;
3. the plan -- a bound :class:`~._launcher.Launcher` -- runs: pointers read and checked when
   they changed, pass-through scalars packed, ``cuLaunchKernel``.

Thread-safe: plan caches are read without locks (dict reads are atomic) and written under a
per-kernel lock; the default registry is created once under a lock.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
try:  # Python 3.11+
    from importlib.resources.abc import Traversable
except ImportError:  # Python 3.10: the same protocol, under its older name
    from importlib.abc import Traversable
from importlib.resources import files
from pathlib import Path
from typing import Any

from . import _driver, _search, _settings
from ._dispatch import (bind, check_ranks, find_variant, is_internal, key_names, matching_variants, unknown_kernel,
                        unmet_error)
from ._errors import ArgumentError, ArtifactError
from ._launcher import Bound, Launcher, PreparedCall, hot_module, make_launcher
from ._layout import bound_layout, unchecked_layout
from ._loader import Loader
from ._manifest import KernelSpec, LaunchSpec, Manifest, VariantSpec, parse_manifest
from ._plan import Binding, UnmetConditions, bind_call, check_devices, direct_scalars
from ._signature import PLAIN_SCALARS, fast_signature
from ._tensors import TORCH_TENSOR, cai_signature, data_ptr, describe, is_tensor, key_value, torch_tensor_type


class _NoTensor:
    """Stands in for torch.Tensor in isinstance checks while torch is not imported."""


class _EmptyPlan:
    """A call whose every launch has an empty grid: pointers are still checked, nothing is launched."""

    def __init__(self, binding: Binding) -> None:
        self.binding = binding

    def run(self, values: Any, stream: Any = None) -> None:
        self.check_values(values)

    def check_values(self, values: Any) -> None:
        self.binding.guard.check(tuple(data_ptr(values[i]) for i in self.binding.tensor_positions))

    def twin(self) -> "_EmptyPlan":
        return self


class KernelEntry:
    """One kernel of a registry: what its call signature reads, and its plan cache."""

    def __init__(self, registry: "Registry", spec: KernelSpec) -> None:
        self.registry, self.spec = registry, spec
        params = spec.params
        self.nparams = len(params)
        self.keys = key_names(spec)
        self.direct = direct_scalars(spec)
        self.tensor_pos = tuple(i for i, p in enumerate(params) if p.kind == "tensor")
        self.optional_pos = frozenset(i for i in self.tensor_pos if params[i].optional)
        scalars = [i for i, p in enumerate(params) if p.kind != "tensor"]
        self.keyed_pos = tuple(i for i in scalars if params[i].name not in self.direct)
        self.direct_pos = tuple(i for i in scalars if params[i].name in self.direct)
        self.plans: dict[tuple, Any] = {}  # general keys (below)
        self.fast_plans: dict[tuple, Any] = {}  # keys of _signature.fast_signature
        self._fast_sig = fast_signature(self.nparams, self.tensor_pos, self.keyed_pos, self.direct_pos)
        self._lock = threading.Lock()
        hot = hot_module()
        if hot is not None:  # the plan-cache hit in C (csrc/_hot_dispatch.h); anything else comes back here
            self.launch = hot.Dispatch(self.fast_plans, self.nparams, self.tensor_pos, self.keyed_pos,  # type: ignore
                                       self.direct_pos, TORCH_TENSOR, functools.partial(KernelEntry.launch, self))

    def launch(self, args: tuple, kwargs: dict, stream: Any) -> None:
        """Validate (once per signature) and launch; see :meth:`Registry.launch`.

        Plain torch tensors and numbers, passed by position, hit the fast key
        (:func:`fast_signature`); every other call takes :meth:`_launch_general`.
        """
        if not kwargs:
            sig = self._fast_sig(args)
            if sig is not None:
                plan = self.fast_plans.get(sig)
                if plan is None:
                    plan = self._build(args, (), None)
                    self._remember(self.fast_plans, sig, plan)
                plan.run(args, stream)
                return
        self._launch_general(args, kwargs, stream)

    def _launch_general(self, args: tuple, kwargs: dict, stream: Any) -> None:
        plan, values = self.plan_for(args, kwargs)
        plan.run(values, stream)

    def plan_for(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        """The plan for this call (validated and built on a cache miss) and its positional values.

        The general plan-cache key: key keywords; per tensor (dtype, shape, strides, device) (a
        CUDA-array-interface object: its typestr, shape, strides, device); per keyed scalar
        (type, value); per pass-through scalar its type.  A call the key cannot describe (odd
        argument types) is validated every time, or told what is wrong.
        """
        if kwargs or len(args) != self.nparams:
            values, key_items = bind(self.spec, args, kwargs, self.keys)
        else:
            values, key_items = args, ()
        tensor = TORCH_TENSOR[0] or torch_tensor_type() or _NoTensor
        key, ok = [key_items], True
        for i in self.tensor_pos:
            a = values[i]
            if isinstance(a, tensor):
                key.append((a.dtype, a.size(), a.stride(), a.device))
            elif a is None and i in self.optional_pos:
                key.append(None)
            else:
                a = cai_signature(a)
                ok = ok and a is not None
                key.append(a)
        for i in self.keyed_pos:
            v = values[i]
            ok = ok and v.__class__ in PLAIN_SCALARS
            key.append((v.__class__, v))
        for i in self.direct_pos:
            key.append(values[i].__class__)
        sig = tuple(key) if ok else None
        plan = self.plans.get(sig) if ok else None
        if plan is None:
            plan = self._build(values, key_items, sig)
        return plan, values

    def _build(self, values: Any, key_items: tuple, key: tuple | None) -> Any:
        spec, params = self.spec, self.spec.params
        infos = {params[i].name: describe(values[i], f"{spec.name}: parameter {params[i].name!r}")
                 for i in self.tensor_pos if not (values[i] is None and params[i].optional)}
        for i in self.keyed_pos + self.direct_pos:
            if is_tensor(values[i]):
                raise ArgumentError(
                    f"{spec.name}: parameter {params[i].name!r} is a scalar; got a tensor (pass a Python number; "
                    "reading a GPU tensor's value would synchronise)"
                )
        check_devices(spec.name, infos)
        check_ranks(spec, infos)
        unmet = []
        for index, variant in matching_variants(spec, infos, key_items):
            try:
                binding = bind_call(spec, index, variant, values, infos, self.direct)
                break
            except UnmetConditions as exc:
                unmet.append(exc)
        else:
            raise unmet_error(spec, unmet)
        plan = self.registry._make_plan(binding, any(info.is_torch for info in infos.values()))
        if key is not None:
            self._remember(self.plans, key, plan)
        return plan

    def _remember(self, plans: dict, key: tuple, plan: Any) -> None:
        with self._lock:
            limit = self.registry.plan_cache_size
            if len(plans) >= limit:  # drop the older half (dicts keep insertion order)
                for old in list(itertools.islice(plans, max(len(plans) // 2, 1))):
                    plans.pop(old, None)
                forget = getattr(self.launch, "forget", None)  # the compiled Dispatch's recent signatures
                if forget is not None:
                    forget()
            plans[key] = plan


class Registry:
    """The kernels of one artifacts folder (``manifest.json`` + cubins).

    The manifest is read when the registry is created and its envelope checked then; each
    kernel's entry is checked at that kernel's first use, before any GPU work
    (:class:`ArtifactError` if missing or malformed, naming the kernel).  Cubins are loaded per
    device at first use.  Thread-safe.
    """

    def __init__(self, artifacts_dir: str | os.PathLike | Traversable, *, plan_cache_size: int | None = None,
                 search_path: bool = False) -> None:
        root = Path(artifacts_dir) if isinstance(artifacts_dir, (str, os.PathLike)) else artifacts_dir
        self.artifacts_dir = root
        self.search_path = search_path  # names it lacks are looked up on the kernel search path (_search.py)
        self.manifest: Manifest = load_manifest(root)
        self.plan_cache_size = plan_cache_size if plan_cache_size is not None else _settings.plan_cache_size()
        if self.plan_cache_size < 1:
            raise ArgumentError(f"plan_cache_size must be >= 1, got {self.plan_cache_size}")
        self._loader = Loader(root)
        self._entries: dict[str, KernelEntry] = {}  # created at a kernel's first use (its spec is parsed then)
        self._entries_lock = threading.Lock()
        self._unchecked: dict[tuple, Any] = {}
        self._unchecked_lock = threading.Lock()

    @classmethod
    def for_package(cls, package: str, folder: str = "_artifacts") -> "Registry":
        """The registry of the artifacts a package ships (``<package>/<folder>/manifest.json``, as
        ``python -m tilebin.aot build --out <package>/<folder>`` writes them), created once per
        process.  A library that ships its own kernels launches from it (``reg.launch(...)``), or
        puts it on ``runtime.launch``'s search path with ``runtime.add_artifacts(reg)``."""
        key = (package, folder)
        reg = _PACKAGES.get(key)
        if reg is None:
            try:
                root = files(package) / folder
            except (ModuleNotFoundError, TypeError) as exc:
                raise ArtifactError(f"Registry.for_package({package!r}): cannot import package {package!r} ({exc}); "
                                    "install it, or pass the artifacts folder to Registry(...)") from None
            with _DEFAULT_LOCK:
                reg = _PACKAGES.get(key)
                if reg is None:
                    reg = _PACKAGES[key] = cls(root)
        return reg

    def kernel_names(self, *, internal: bool = False) -> list[str]:
        """The public kernel names in the manifest, sorted; with ``internal=True`` every name.

        Internal kernels (:func:`is_internal`: the ``testing`` and ``gemm`` families) are left
        out by default; they stay launchable by name (``launch``, ``spec``, ``prepare``).
        """
        names = list(self.manifest.kernels) + (_search.names(self) if self.search_path else [])
        return sorted(n for n in names if internal or not is_internal(n))

    def spec(self, name: str) -> KernelSpec:
        """The :class:`KernelSpec` of ``name``; :class:`~._errors.UnknownKernelError` naming close names if unknown."""
        return self._entry(name).spec

    def _entry(self, name: str) -> KernelEntry:
        """The kernel ``name``; :class:`~._errors.UnknownKernelError` naming close names if unknown.

        Launch paths call it only on a miss (``_entries.get(name) or _entry(name)``), so a
        known kernel costs one dict lookup.
        """
        entry = self._entries.get(name)
        if entry is None:
            if name not in self.manifest.kernels:
                other = _search.find(self, name) if self.search_path else None
                if other is None:
                    known = list(self.manifest.kernels) + (_search.names(self) if self.search_path else [])
                    raise unknown_kernel(name, known)
                entry = other._entry(name)  # launched, prepared and loaded by its own registry
                with self._entries_lock:
                    return self._entries.setdefault(name, entry)
            spec = self.manifest.kernels[name]  # checked now (ArtifactError naming the kernel if malformed)
            with self._entries_lock:
                entry = self._entries.get(name)
                if entry is None:
                    entry = self._entries[name] = KernelEntry(self, spec)
        return entry

    def launch(self, name: str, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        """Launch kernel ``name`` on ``args`` (in ``spec(name).params`` order).

        ``kwargs``: scalar parameters by name, or compile-time key values that pin the variant
        (``dtype="bfloat16"``, ``block_m=64``).  ``stream``: an int handle, ``torch.cuda.Stream``,
        ``CUstream`` or ``__cuda_stream__`` object; default: torch's current stream of the
        tensors' device when any tensor is a torch tensor, else the legacy default stream 0.
        Raises :class:`NoVariantError`, :class:`ArgumentError` (all checked before GPU work),
        :class:`ArtifactError`, :class:`DeviceError`.  Asynchronous (no synchronisation, no
        allocation); thread-safe; capturable in CUDA graphs, also as a process's first launch
        (the cubin is then loaded with this thread in relaxed capture mode).
        """
        (self._entries.get(name) or self._entry(name)).launch(args, kwargs, stream)

    def prepare(self, name: str, *args: Any, **kwargs: Any) -> PreparedCall:
        """Validate a call once and return a :class:`PreparedCall` that re-launches exactly it.

        Same arguments and errors as :meth:`launch`, but nothing is launched here (the cubin is
        loaded).  The result keeps references to the tensors; see :class:`PreparedCall`.
        """
        plan, values = self._entry(name).plan_for(args, kwargs)
        return PreparedCall(plan, tuple(values))

    def unchecked_launcher(self, name: str, **key: Any) -> Launcher:
        """The unchecked :class:`~._launcher.Launcher` of the variant of ``name`` whose key is exactly
        ``key`` (cached; the compiled one when available).

        For op layers that validate their own arguments: ``launcher(*args)`` skips every shape,
        dtype, stride and pointer check (see :class:`~._launcher.Launcher` for the contract).
        :class:`NoVariantError` when no variant has that key, or it needs TMA descriptors.
        """
        cache_key = (name, tuple(sorted(key.items())))
        launcher = self._unchecked.get(cache_key)
        if launcher is None:
            owner = self._entry(name).registry
            if owner is not self:  # a kernel of the search path: its registry loads its cubins
                return owner.unchecked_launcher(name, **key)
            spec = self._entry(name).spec
            variant = find_variant(spec, {k: key_value(v) for k, v in key.items()})
            layout = unchecked_layout(spec, variant)
            load = functools.partial(self._functions, spec.name, variant, variant.launches)
            launcher = make_launcher(layout, load)
            with self._unchecked_lock:
                launcher = self._unchecked.setdefault(cache_key, launcher)
        return launcher

    def _functions(self, kernel: str, variant: VariantSpec, launches: tuple[LaunchSpec, ...],
                   ordinal: int) -> tuple[_driver.DeviceInfo, list]:
        """Check device ``ordinal`` and load ``launches``' functions on it (the first GPU work of a Launcher).

        Loads with this thread in relaxed capture mode: a first launch may happen inside a CUDA-graph capture.
        """
        build = self.manifest.build
        dev = _driver.device(ordinal, build.arch, build.min_driver_cuda)
        restore = _driver.enter(dev)
        try:
            with _driver.relaxed_capture():
                handles = [self._loader.function(kernel, variant, ln.entry, ln.smem, dev).handle for ln in launches]
        finally:
            if restore is not None:
                _driver.leave(restore)
        return dev, handles

    def _make_plan(self, binding: Binding, any_torch: bool) -> Any:
        """Check the device, load functions, and build the bound Launcher (first GPU work of a signature)."""
        if not binding.launches:
            return _EmptyPlan(binding)
        spec = self.manifest.kernels[binding.kernel]
        launches = tuple(bl.spec for bl in binding.launches)
        load = functools.partial(self._functions, binding.kernel, binding.variant, launches)
        dev, handles = load(binding.device)
        hot = hot_module()
        if hot is not None:  # one visible device: the compiled front's recent signatures skip get_device()
            hot.single_device(_driver._STATE.get("count") == 1)
        bound = Bound(dev, handles, binding.guard, binding.tma, any_torch)
        return make_launcher(bound_layout(spec, binding), load, bound)


def load_manifest(root: Traversable) -> Manifest:
    """Read and check ``root/manifest.json``; :class:`ArtifactError` if missing or malformed."""
    path = root / "manifest.json"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArtifactError(
            f"no readable manifest.json in {root} ({exc.__class__.__name__}); the installed wheel carries no "
            f"artifacts, or {_settings.ARTIFACTS_DIR.name} points at the wrong folder: reinstall the wheel or "
            "fix the variable"
        ) from None
    return parse_manifest(data, source=str(path), lazy=True)


_DEFAULT: list[Registry | None] = [None]
_DEFAULT_LOCK = threading.Lock()
_PACKAGES: dict[tuple[str, str], Registry] = {}


def default_registry() -> Registry:
    """The registry of :func:`tilebin.runtime.launch`, created on first use from the settings."""
    reg = _DEFAULT[0]
    if reg is None:
        with _DEFAULT_LOCK:
            if _DEFAULT[0] is None:
                _DEFAULT[0] = Registry(_settings.artifacts_dir(), search_path=True)
            reg = _DEFAULT[0]
    return reg
