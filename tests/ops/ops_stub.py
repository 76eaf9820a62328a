"""Every ``tilebin.ops`` op on CPU tensors with the launch stubbed (no GPU, no driver).

:class:`StubbedOps` patches each op module's ``launcher`` with a recorder, its device checks
with no-ops and the SM count with 132, and empties every memo table, so that a test sees the
ops as in a fresh process.  ``launches`` lists ``(kernel, key, args)`` of every launch.
"""

from __future__ import annotations

import importlib
from typing import Any

OP_MODULES = (
    "tilebin.ops.quant._per_token", "tilebin.ops.quant._per_block", "tilebin.ops.quant._per_channel",
    "tilebin.ops.quant._swiglu", "tilebin.ops.quant._cast_back", "tilebin.ops.quant._e5m6",
    "tilebin.ops.moe._gating", "tilebin.ops.moe._routing", "tilebin.ops.moe._stats",
    "tilebin.ops.engram._gate", "tilebin.ops.engram._hash", "tilebin.ops.transpose._transpose",
    "tilebin.ops._spec",
    *(f"tilebin.modeling.mhc.ops.{m}" for m in ("expand", "head_compute_mix", "multilayer_recompute", "norm_fn", "post",
                                                "pre_apply_mix", "pre_big_fuse", "pre_split_mixes", "sinkhorn")),
)
# module-level dicts that memoize validated configurations or launchers
MEMO_NAMES = ("_DUMMIES", "_LAUNCHERS", "_PLACEHOLDERS")


class StubbedOps:
    """Patches the op modules through pytest's ``monkeypatch``; :meth:`fresh` empties the memos."""

    def __init__(self, monkeypatch: Any) -> None:
        self.launches: list[tuple[str, dict, tuple]] = []
        self.modules = _op_modules()
        for mod in self.modules:
            if hasattr(mod, "launcher"):
                monkeypatch.setattr(mod, "launcher", self._launcher)
            if hasattr(mod, "specialised_launcher"):
                monkeypatch.setattr(mod, "specialised_launcher", self._specialised_launcher)
            for name in ("check_cuda", "_on_cuda"):
                if hasattr(mod, name):
                    monkeypatch.setattr(mod, name, lambda *a, **k: None)
            if hasattr(mod, "kernel_meta"):
                monkeypatch.setattr(mod, "kernel_meta", declared_meta)
            if hasattr(mod, "get_num_sms"):
                monkeypatch.setattr(mod, "get_num_sms", lambda device=None: 132)
            for name in MEMO_NAMES:
                if isinstance(getattr(mod, name, None), dict):
                    monkeypatch.setattr(mod, name, {})
            for spec in _specs(mod):  # OpSpec memos: a fresh one each, the original back at undo
                monkeypatch.setattr(spec, "memo", {})

    def _launcher(self, name: str, **key: Any):
        from tilebin.ops._common import TRACING, _no_launch

        if TRACING.on:  # as the real launcher: fake tensors launch nothing
            return _no_launch

        def launch(*args: Any) -> None:
            self.launches.append((name, dict(key), args))

        return launch

    def _specialised_launcher(self, name: str, sizes: Any, **key: Any):
        """As ``ops._common.specialised_launcher``, the variants from the declaration (no artifacts needed)."""
        from tilebin.ops._common import specialised_key

        return self._launcher(name, **specialised_key(declared_variants(name), sizes, key))

    def fresh(self) -> None:
        """Empty every memo table: the next call runs as the first call of a fresh process."""
        for mod in self.modules:
            for name in MEMO_NAMES:
                table = getattr(mod, name, None)
                if isinstance(table, dict):
                    table.clear()
            for spec in _specs(mod):
                spec.memo.clear()


def _op_modules() -> list:
    """OP_MODULES, then every other module of ``tilebin.ops`` loaded by then (an op's checks or
    spec may live in a helper module: ``_<op>_checks.py``), except the shared ``_common``."""
    import sys

    mods = [importlib.import_module(m) for m in OP_MODULES]
    seen = {m.__name__ for m in mods} | {"tilebin.ops._common"}
    for name in sorted(sys.modules):
        if name.startswith("tilebin.ops.") and name not in seen and sys.modules[name] is not None:
            mods.append(sys.modules[name])
    return mods


def _specs(mod: Any) -> list:
    """The :class:`tilebin.ops._spec.OpSpec` objects a module declares."""
    from tilebin.ops._spec import OpSpec

    return [v for v in vars(mod).values() if isinstance(v, OpSpec)]


def declared_meta(kernel: str, key: str) -> Any:
    """``kernel``'s ``meta[key]`` as its declaration in ``tilebin.kernels`` states it (what the
    manifest carries; no built artifacts needed)."""
    return _declaration(kernel).meta[key]


def _declaring_module(kernel: str) -> str:
    """The module of ``tilebin.kernels`` that declares ``kernel``."""
    from tilebin.kernels.modules import ALL_MODULES

    family = kernel.split(".")[0]
    for module in ALL_MODULES:
        if f".{family}." in module and any(d.name == kernel for d in importlib.import_module(module).KERNELS):
            return module
    raise KeyError(kernel)


def _declaration(kernel: str) -> Any:
    """``kernel``'s ``KernelDecl`` in ``tilebin.kernels``."""
    return next(d for d in importlib.import_module(_declaring_module(kernel)).KERNELS if d.name == kernel)


def declared_variants(kernel: str) -> list:
    """``kernel``'s variants in the build's order (``tilebin.aot``'s job list: each grid variant's
    specialisations just ahead of it), as objects with the manifest's ``key`` and ``specialised``."""
    from types import SimpleNamespace

    from tilebin.aot._build import enumerate_jobs

    return [SimpleNamespace(key=job.key, specialised=tuple(n for n, _ in job.specialised))
            for job in enumerate_jobs([_declaring_module(kernel)]) if job.kernel == kernel]


def describe(value: Any) -> Any:
    """A comparable description of a launch argument or op result: tensors by dtype, shape and
    strides (their values are whatever torch.empty gave), containers element-wise, scalars with
    their type (``1`` and ``True`` differ)."""
    import torch

    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), tuple(value.stride()))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(describe(v) for v in value))
    return (type(value).__name__, value)


def describe_launches(launches: list) -> list:
    return [(name, sorted(key.items()), describe(args)) for name, key, args in launches]
