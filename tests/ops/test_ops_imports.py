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
