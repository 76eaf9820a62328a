"""The installed wheel: where it is imported from, what its manifest promises, cubin integrity,
and the one rule (a launch imports neither tilelang, tvm, tilebin.aot nor tilebin.kernels)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from _cases import COOP_SUM, GEMM, GEMM_VARIANTS, PDL_CHAIN, TRANSPOSE  # noqa: E402
from _gpu_util import REPO, is_inside  # noqa: E402

pytestmark = pytest.mark.gpu
SHIPPED = (TRANSPOSE, GEMM, COOP_SUM, PDL_CHAIN)


def test_runtime_is_the_installed_wheel(rt, artifacts_dir):
    import tilebin

    where = {"tilebin": tilebin.__file__, "tilebin.runtime": rt.__file__, "artifacts": str(artifacts_dir)}
    if os.environ.get("TILEBIN_EXPECT_INSTALLED") != "1":
        pytest.skip(f"TILEBIN_EXPECT_INSTALLED is not 1 (running against {where})")
    assert not os.environ.get("TILEBIN_ARTIFACTS_DIR"), (
        f"TILEBIN_ARTIFACTS_DIR={os.environ['TILEBIN_ARTIFACTS_DIR']!r} redirects the runtime away from the wheel")
    inside = {k: v for k, v in where.items() if is_inside(v, REPO)}
    assert not inside, f"imported from the source checkout {REPO}, not the installed wheel: {inside}; sys.path={sys.path}"


def test_shipped_kernels_present(kernel_names):
    missing = [k for k in SHIPPED if k not in kernel_names]
    assert not missing, f"the wheel lacks {missing}; it has {kernel_names}"


def _keys(spec) -> list[dict]:
    return [dict(v.key) for v in spec.variants]


def test_manifest_transpose_dtypes(rt, require):
    require(TRANSPOSE)
    dtypes = sorted(str(k.get("dtype")) for k in _keys(rt.spec(TRANSPOSE)))
    for want in ("bfloat16", "float32", "float8_e4m3fn"):
        assert want in dtypes, f"{TRANSPOSE} variants {_keys(rt.spec(TRANSPOSE))} lack dtype {want}"


def test_manifest_gemm_tma_and_large_smem(rt, require):
    require(GEMM)
    spec = rt.spec(GEMM)
    keys = _keys(spec)
    for n, k in GEMM_VARIANTS:
        assert any(d.get("n") == n and d.get("k") == k for d in keys), f"no variant n={n} k={k} in {keys}"
    for v in spec.variants:
        smem = [ln.smem for ln in v.launches]
        assert len(v.tma) >= 1, f"{GEMM} variant {dict(v.key)} has no TMA descriptor (tma={v.tma})"
        assert any(a.kind == "tma" for ln in v.launches for a in ln.args), f"{dict(v.key)}: no launch takes a TMA arg"
        assert max(smem) > 48 * 1024, f"{GEMM} variant {dict(v.key)}: dynamic smem {smem}, want > 48 KiB"


def test_manifest_coop_sum_is_cooperative(rt, require):
    require(COOP_SUM)
    for v in rt.spec(COOP_SUM).variants:
        flags = [(ln.entry, ln.cooperative) for ln in v.launches]
        assert any(c for _, c in flags), f"{COOP_SUM} variant {dict(v.key)}: no cooperative launch in {flags}"


def test_manifest_pdl_chain_second_launch_pdl(rt, require):
    require(PDL_CHAIN)
    for v in rt.spec(PDL_CHAIN).variants:
        flags = [(ln.entry, ln.pdl) for ln in v.launches]
        assert len(flags) >= 2 and flags[1][1], f"{PDL_CHAIN} variant {dict(v.key)}: launches {flags}, want pdl on #2"


def test_manifest_cubins_match_sha256(artifacts_dir):
    data = json.loads((artifacts_dir / "manifest.json").read_text())
    assert data.get("build", {}).get("arch") == "sm_90a", f"build facts: {data.get('build')}"
    bad, seen = [], 0
    for name, k in data["kernels"].items():
        for v in k["variants"]:
            path = artifacts_dir / v["cubin"]
            got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
            seen += 1
            if got != v["sha256"]:
                bad.append(f"{name} {v['key']}: {path.name} sha256 {got}, manifest {v['sha256']}")
    assert seen and not bad, f"{seen} variants checked; bad: {bad}"


_IMPORT_RULE = textwrap.dedent("""
    import sys, torch
    from tilebin import runtime
    x = torch.randn(2, 33, 65, device="cuda").to(torch.bfloat16)
    out = torch.empty(2, 65, 33, device="cuda", dtype=torch.bfloat16)
    runtime.launch("transpose.batched_transpose", x, out)
    torch.cuda.synchronize()
    assert torch.equal(out, x.transpose(1, 2)), "wrong transpose in the subprocess"
    banned = sorted(m for m in sys.modules if m.split(".")[0] in ("tilelang", "tvm", "tvm_ffi")
                    or m.startswith(("tilebin.aot", "tilebin.kernels")))
    print("RUNTIME", runtime.__file__)
    print("BANNED", banned)
    sys.exit(1 if banned else 0)
""")


def test_launch_imports_no_build_stack(rt, require, tmp_path):
    """In a fresh process (cwd outside the checkout): a launch pulls in no build-time module."""
    require(TRANSPOSE)
    proc = subprocess.run([sys.executable, "-c", _IMPORT_RULE], cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
