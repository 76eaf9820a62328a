"""The Engram op and autograd layers keep the import rule: torch and the runtime only, never
tilelang, TVM, ``tilebin.aot`` or ``tilebin.kernels`` (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_engram_layers_import_no_build_tools():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, sys.argv[1])
        import tilebin.ops.engram, tilebin.modeling.engram
        from tilebin.modeling.engram import EngramGateFn, engram_gate
        from tilebin.ops.engram import engram_hash, fused_weight, engram_gate_fwd, engram_gate_bwd, grad_w_reduce
        banned = ("tilelang", "tvm", "tvm_ffi")
        bad = sorted(m for m in sys.modules if m.split(".")[0] in banned
                     or m.startswith(("tilebin.aot", "tilebin.kernels")))
        assert not bad, bad
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_public_names_match_tile_kernels():
    from tilebin.modeling import engram as modeling
    from tilebin.ops import engram

    assert sorted(engram.__all__) == ["engram_gate_bwd", "engram_gate_fwd", "engram_hash", "fused_weight",
                                      "grad_w_reduce"]
    assert sorted(modeling.__all__) == ["EngramGateFn", "engram_gate"]
    import inspect

    sig = {name: list(inspect.signature(getattr(engram, name)).parameters) for name in engram.__all__}
    assert sig["engram_gate_fwd"] == ["hidden_states", "k", "v", "weight_fused", "eps", "clamp_value",
                                      "save_for_backward"]
    assert inspect.signature(engram.engram_gate_fwd).parameters["save_for_backward"].default is True
    assert sig["engram_gate_bwd"] == ["grad_out", "hidden_states", "k", "v", "weight_fused", "dot", "gate_score",
                                      "rstd_x", "rstd_k", "clamp_value"]
    assert sig["grad_w_reduce"] == ["grad_w_partial", "weight_hidden", "weight_embed", "grad_weight_hidden",
                                    "grad_weight_embed"]
    assert sig["engram_hash"] == ["ngram_token_ids", "multipliers", "vocab_sizes", "offsets"]
    assert sig["fused_weight"] == ["weight_hidden", "weight_embed"]
    assert list(inspect.signature(modeling.engram_gate).parameters) == [
        "hidden_states", "k", "v", "weight_hidden", "weight_embed", "clamp_value", "eps"]
