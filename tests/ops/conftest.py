"""CPU op tests: kernel constants (``KernelDecl.meta``) come from the declarations in
``tilebin.kernels``, as a built manifest would carry them; no artifacts are needed here."""

from __future__ import annotations

import importlib

import pytest

from ops_stub import declared_meta

_READERS = ("tilebin.ops.quant._per_token", "tilebin.ops.moe._routing",  # op modules that read kernel_meta
            "tilebin.ops.moe._stats", "tilebin.ops.quant._e5m6",
            "tilebin.modeling.mhc.ops.head_compute_mix")


@pytest.fixture(autouse=True)
def _meta_from_declarations(monkeypatch):
    for name in _READERS:
        monkeypatch.setattr(importlib.import_module(name), "kernel_meta", declared_meta)
