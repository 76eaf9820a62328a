"""The op layer keeps the import rule: ``tilebin.ops`` imports torch and the runtime, never
tilelang, TVM, ``tilebin.aot`` or ``tilebin.kernels`` (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ops_import_pulls_no_build_tools():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import tilebin.ops.quant, tilebin.ops.moe, tilebin.ops.config, tilebin.ops._common, tilebin.ops.quant._sf
        banned = ("tilelang", "tvm", "tvm_ffi", "tilebin.aot", "tilebin.kernels")
        bad = sorted(m for m in sys.modules if m.split(".")[0] in banned or m.startswith(banned[3:]))
        assert not bad, bad
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_ops_without_torch_says_how_to_install_it():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        sys.modules["torch"] = None  # torch not installed
        try:
            import tilebin.ops
        except ImportError as exc:
            print(exc)
    """)
    run = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert 'pip install "tilebin[torch]"' in run.stdout, run.stdout + run.stderr[-2000:]


def test_importing_ops_registers_nothing_with_torch():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import torch
        import tilebin.ops.quant, tilebin.ops.moe, tilebin.ops.engram
        assert not hasattr(torch.ops.tilebin, "per_token_cast"), "registered at import"
        import tilebin.ops
        tilebin.ops.register_torch_ops()
        print(torch.ops.tilebin.per_token_cast.default._schema)
    """)
    run = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "tilebin::per_token_cast(Tensor x, Tensor? x_sf" in run.stdout, run.stderr[-2000:]


def test_importing_ops_does_not_import_dynamo():
    """torch._dynamo costs seconds to import (and eager calls nothing): only compiling pulls it in."""
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import torch
        import tilebin.ops, tilebin.ops.quant, tilebin.ops.moe, tilebin.ops.engram, tilebin.modeling.mhc
        print("torch._dynamo" in sys.modules)
    """)
    run = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stdout + run.stderr[-2000:]
