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


@pytest.fixture(scope="session")
def _compiled_hot(tmp_path_factory):
    """The compiled hot path built from csrc/ (as tests/runtime builds it), for the compiled memo key."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
    import rt_fakes

    return rt_fakes.hot_or_skip(tmp_path_factory.mktemp("hot_ops"))


@pytest.fixture(params=["python key", "compiled key"])
def key_path(request, monkeypatch):
    """Runs a test with the ops' Python memo key, then with the compiled one (``ops/_compiled_key.py``:
    csrc/_hot_opkey.h through torch's C shim, told that CPU tensors are on the GPU); every OpSpec
    compiles its call afresh for the test, and gets its old one back after it."""
    import torch

    from ops_stub import _op_modules, _specs
    from tilebin.runtime import _launcher, _tensors

    hot = None
    if request.param == "compiled key":
        hot = request.getfixturevalue("_compiled_hot")
        why = _tensors.enable_shim(hot, torch, gpu_type=0)
        assert why is None, f"torch's C shim stays off with torch {torch.__version__}: {why}"
        request.addfinalizer(lambda: hot.tensor_abi(None))
        monkeypatch.setattr(_tensors, "_SHIM", {hot: None})
    monkeypatch.setattr(_launcher, "_HOT", [hot])
    for mod in _op_modules():
        for spec in _specs(mod):
            monkeypatch.setattr(spec, "call", spec._first_call)
    return request.param
