"""The command line, ``python -m tilebin`` (runtime/_cli.py): list, info, verify, doctor, bench, --json, errors.

Most tests run the CLI in a subprocess against an artifacts folder named by TILEBIN_ARTIFACTS_DIR:
a small fake one (rt_fakes' toy kernels with real files and checksums) that always exists, and the
artifacts of the built wheel (wheels/dist; skipped locally without one, failed under CI).
``CUDA_VISIBLE_DEVICES`` is emptied, so "no GPU" holds on GPU machines too.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import rt_fakes

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "tilelang", "tvm", "tilebin.aot", "tilebin.kernels", "cuda.bindings")


def write_fake(folder: Path) -> Path:
    """rt_fakes' standard manifest with a real file and a matching sha256 for every cubin."""
    data = rt_fakes.standard_manifest()
    for kernel in data["kernels"].values():
        kernel["doc"] = f"doc of {kernel['name']}"
        for v in kernel["variants"]:
            blob = b"\x7fELF fake cubin " + v["cubin"].encode()
            (folder / v["cubin"]).parent.mkdir(parents=True, exist_ok=True)
            (folder / v["cubin"]).write_bytes(blob)
            v["sha256"] = hashlib.sha256(blob).hexdigest()
    data["kernels"]["toy.quant"]["meta"] = {"block": 128, "sizes": [1, 2]}
    return rt_fakes.write_artifacts(folder, data)


@pytest.fixture
def fake(tmp_path):
    return write_fake(tmp_path / "artifacts")


@pytest.fixture(scope="session")
def wheel_artifacts(built_wheel, tmp_path_factory):
    """The built wheel's tilebin/_artifacts, extracted."""
    out = tmp_path_factory.mktemp("wheel")
    with zipfile.ZipFile(built_wheel) as zf:
        zf.extractall(out, [n for n in zf.namelist() if n.startswith("tilebin/_artifacts/")])
    return out / "tilebin" / "_artifacts"


def cli(*args: str, artifacts: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TILEBIN_")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
    if artifacts is not None:
        env["TILEBIN_ARTIFACTS_DIR"] = str(artifacts)
    return subprocess.run([sys.executable, "-m", "tilebin", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def one_error_line(run: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in run.stderr + run.stdout, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilebin: error: "), run.stderr
    return lines[0]


# ------------------------------------------------------------------ help, usage errors
def test_help_lists_every_command():
    run = cli("--help")
    assert run.returncode == 0, run.stderr
    for command in ("list", "info", "verify", "doctor", "bench"):
        assert f"\n    {command} " in run.stdout, run.stdout


def test_unknown_command_is_one_line(fake):
    run = cli("frobnicate", artifacts=fake)
    assert run.returncode == 2
    assert "'frobnicate'" in one_error_line(run)


def test_missing_artifacts_is_one_line(tmp_path):
    run = cli("list", artifacts=tmp_path / "nowhere")
    assert run.returncode == 1
    line = one_error_line(run)
    assert "manifest.json" in line and "TILEBIN_ARTIFACTS_DIR" in line


# ------------------------------------------------------------------ list, info
def test_list_fake(fake):
    run = cli("list", artifacts=fake)
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line.split(None, 2) for line in run.stdout.splitlines()[1:] if line.startswith("toy.")}
    assert sorted(rows) == ["toy.gemm", "toy.quant", "toy.scale"]
    assert rows["toy.scale"][1] == "3" and "{dtype='float16', block=128}" in rows["toy.scale"][2]
    assert rows["toy.gemm"][2] == "{n=1024, k=1024}; {n=4096, k=7168}"
    header = run.stdout.splitlines()[0]
    assert header.index("VARIANTS") == run.stdout.splitlines()[1].index(rows["toy.gemm"][1])  # aligned columns
    assert "3 kernels, 6 variants" in run.stdout


def test_list_json_matches_the_wheel_manifest(wheel_artifacts):
    run = cli("list", "--json", artifacts=wheel_artifacts)
    assert run.returncode == 0, run.stderr
    listed = json.loads(run.stdout)
    manifest = json.loads((wheel_artifacts / "manifest.json").read_text())
    from tilebin.runtime import is_internal

    public = sorted(n for n in manifest["kernels"] if not is_internal(n))
    assert [k["name"] for k in listed] == public  # the internal (test, demo) kernels only with --all
    every = json.loads(cli("list", "--json", "--all", artifacts=wheel_artifacts).stdout)
    assert [k["name"] for k in every] == sorted(manifest["kernels"])
    for k in every:
        assert k["variants"] == [v["key"] for v in manifest["kernels"][k["name"]]["variants"]]
        assert k["doc"] == manifest["kernels"][k["name"]].get("doc", "")


def test_info_shows_params_variants_launch_facts_doc_meta(fake):
    run = cli("info", "toy.gemm", artifacts=fake)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "doc of toy.gemm" in out and "variants (2): in the order the runtime tries them" in out and "{n=4096, k=7168}" in out
    assert "pdl, tma, cluster" in out and "up to 98304 bytes dynamic smem" in out
    assert "static dims: a[1]=1024|7168, b[0]=1024|4096, b[1]=1024|7168, c[1]=1024|4096\n" in out
    quant = cli("info", "toy.quant", artifacts=fake).stdout
    assert "2 kernel launch(es) per call; cooperative;" in quant
    assert "group" in quant and "int32" in quant and "block = 128" in quant


def test_info_json(fake):
    run = cli("info", "toy.scale", "--json", artifacts=fake)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["name"] == "toy.scale" and data["doc"] == "doc of toy.scale"
    assert data["params"] == [
        {"name": "x", "kind": "tensor", "rank": 2, "dtype": "bfloat16|float16", "optional": False},
        {"name": "out", "kind": "tensor", "rank": 2, "dtype": "bfloat16|float16", "optional": False},
        {"name": "alpha", "kind": "scalar", "rank": 0, "dtype": "float32", "optional": False},
    ]
    assert data["variants"][1] == {"dtype": "float16", "block": 128}
    assert data["conditions"] == [[], [], []]
    assert data["launch"]["cooperative"] is False and data["launch"]["tma"] is False


def test_info_wheel_kernel(wheel_artifacts):
    manifest = json.loads((wheel_artifacts / "manifest.json").read_text())
    name = "transpose.batched_transpose" if "transpose.batched_transpose" in manifest["kernels"] \
        else sorted(manifest["kernels"])[0]
    data = json.loads(cli("info", name, "--json", artifacts=wheel_artifacts).stdout)
    assert data["name"] == name and data["doc"] == manifest["kernels"][name].get("doc", "")
    assert [p["name"] for p in data["params"]] == [p["name"] for p in manifest["kernels"][name]["params"]]


def test_info_unknown_kernel_names_close_ones(fake):
    run = cli("info", "toy.gem", artifacts=fake)
    assert run.returncode == 1
    line = one_error_line(run)
    assert "unknown kernel 'toy.gem'" in line and "'toy.gemm'" in line
    run = cli("info", "toy.gem", "--json", artifacts=fake)
    assert run.returncode == 1 and json.loads(run.stdout)["ok"] is False


# ------------------------------------------------------------------ verify
def test_verify_ok(fake):
    run = cli("verify", artifacts=fake)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 kernels, 6 variants, 6 cubins" in run.stdout and run.stdout.rstrip().endswith("OK")


def test_verify_wheel_artifacts(wheel_artifacts):
    run = cli("verify", "--json", artifacts=wheel_artifacts)
    data = json.loads(run.stdout)
    assert run.returncode == 0 and data["ok"] and data["failures"] == [], data["failures"][:5]
    manifest = json.loads((wheel_artifacts / "manifest.json").read_text())
    assert data["kernels"] == len(manifest["kernels"]) > 0
    cubins = {v["cubin"] for k in manifest["kernels"].values() for v in k["variants"]}
    assert data["cubins"] == len(cubins)
    assert data["bytes"] == sum((wheel_artifacts / c).stat().st_size for c in cubins)


def test_verify_names_a_tampered_cubin(fake):
    cubin = fake / "cubins" / "gemm_4096_7168.cubin"
    cubin.write_bytes(cubin.read_bytes() + b"!")
    run = cli("verify", artifacts=fake)
    assert run.returncode == 1
    fails = [line for line in run.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 1 and "cubins/gemm_4096_7168.cubin" in fails[0] and "checksum" in fails[0], run.stdout
    assert "toy.gemm" in fails[0] and "verify found 1 problem" in one_error_line(run)


def test_verify_tampered_wheel_artifacts(wheel_artifacts, tmp_path):
    import shutil

    copy = Path(shutil.copytree(wheel_artifacts, tmp_path / "artifacts"))
    manifest = json.loads((copy / "manifest.json").read_text())
    victim = sorted(manifest["kernels"])[0]
    cubin = manifest["kernels"][victim]["variants"][0]["cubin"]
    data = bytearray((copy / cubin).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / cubin).write_bytes(bytes(data))
    run = cli("verify", "--json", artifacts=copy)
    report = json.loads(run.stdout)
    assert run.returncode == 1 and not report["ok"]
    assert any(cubin in f and "checksum" in f for f in report["failures"]), report["failures"]


def test_verify_missing_empty_and_malformed(fake):
    (fake / "cubins" / "quant.cubin").unlink()
    (fake / "cubins" / "scale_float16_128.cubin").write_bytes(b"")
    data = json.loads((fake / "manifest.json").read_text())
    data["kernels"]["toy.gemm"]["variants"][0]["launches"] = []
    (fake / "manifest.json").write_text(json.dumps(data))
    report = json.loads(cli("verify", "--json", artifacts=fake).stdout)
    fails = report["failures"]
    assert not report["ok"] and len(fails) == 3, fails
    assert any("cubins/quant.cubin" in f and "missing" in f for f in fails)
    assert any("scale_float16_128.cubin" in f and "empty" in f for f in fails)
    assert any("toy.gemm" in f and "no launches" in f for f in fails)


def test_verify_other_schema_is_one_line(fake):
    data = json.loads((fake / "manifest.json").read_text())
    data["schema_version"] = 99
    (fake / "manifest.json").write_text(json.dumps(data))
    run = cli("verify", artifacts=fake)
    assert run.returncode == 1 and "schema_version 99" in one_error_line(run)


# ------------------------------------------------------------------ doctor, bench (no GPU)
def test_doctor_without_gpu_names_what_is_missing(fake):
    run = cli("doctor", artifacts=fake)
    assert run.returncode == 1 and "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    status = {line.split()[1] if not line.startswith("FAIL (optional)") else line.split()[2]: line.split()[0]
              for line in lines if line.split() and line.split()[0] in ("OK", "FAIL", "SKIP")}
    assert status["artifacts"] == "OK" and status["driver"] == "FAIL" and status["GPU"] == "FAIL", run.stdout
    assert "no NVIDIA driver found" in run.stdout and "fix: install an NVIDIA GPU driver >= 580" in run.stdout
    assert "required check(s) failed: driver, GPU" in run.stdout


def test_doctor_json(fake):
    run = cli("doctor", "--json", artifacts=fake)
    data = json.loads(run.stdout)
    assert run.returncode == 1 and data["ok"] is False
    checks = {c["name"]: c for c in data["checks"]}
    assert list(checks) == ["artifacts", "cuda-bindings", "driver", "GPU", "torch", "hot path", "smoke launch"]
    assert checks["GPU"]["status"] == "FAIL" and checks["GPU"]["required"] and checks["GPU"]["fix"]
    assert checks["smoke launch"]["status"] == "SKIP"
    assert all(c["status"] in ("OK", "FAIL", "SKIP") for c in checks.values())


def test_doctor_keeps_going_without_artifacts(tmp_path):
    data = json.loads(cli("doctor", "--json", artifacts=tmp_path / "nowhere").stdout)
    checks = {c["name"]: c for c in data["checks"]}
    assert checks["artifacts"]["status"] == "FAIL" and "manifest.json" in checks["artifacts"]["detail"]
    assert checks["GPU"]["status"] == "FAIL" and checks["cuda-bindings"]["status"] == "OK"


def test_bench_without_gpu_is_one_line(fake):
    run = cli("bench", artifacts=fake)
    assert run.returncode == 1
    assert "bench needs a CUDA GPU" in one_error_line(run)


# ------------------------------------------------------------------ imports
def test_cli_imports_nothing_heavy(fake):
    code = ("import sys, io, contextlib\nfrom tilebin.runtime._cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    codes = [main(['list']), main(['info', 'toy.gemm']), main(['verify'])]\n"
            f"heavy = sorted(m for m in sys.modules if any(m == b or m.startswith(b + '.') for b in {HEAVY!r}))\n"
            "print(codes, heavy)\n")
    env = {**os.environ, "TILEBIN_ARTIFACTS_DIR": str(fake)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.stdout.strip() == "[0, 0, 0] []", run.stdout + run.stderr


# ------------------------------------------------------------------ doctor on a fake GPU (in-process)
class _FakeCuda:
    """The few cuda.bindings.driver calls doctor makes, for one GPU of compute capability ``cc``."""

    class CUdevice_attribute:
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"

    def __init__(self, cc):
        self.cc = cc

    def cuDeviceGetCount(self):
        return (0, 1)

    def cuDeviceGet(self, ordinal):
        return (0, ordinal)

    def cuDeviceGetName(self, size, dev):
        return (0, b"NVIDIA H200 (fake)\0\0\0")

    def cuDeviceGetAttribute(self, attr, dev):
        return (0, self.cc[0] if attr == "major" else self.cc[1])


@pytest.mark.parametrize("cc, version, failed", [((9, 0), 13000, []), ((8, 0), 13000, ["GPU"]),
                                                 ((9, 0), 12080, ["driver"])])
def test_doctor_on_a_fake_gpu(fake, monkeypatch, capsys, cc, version, failed):
    from tilebin.runtime import _cli, _driver

    monkeypatch.setenv("TILEBIN_ARTIFACTS_DIR", str(fake))
    monkeypatch.setattr(_driver, "_STATE", {"version": version})
    monkeypatch.setattr(_driver, "driver", lambda need=13000: _FakeCuda(cc))
    monkeypatch.setitem(_cli.DOCTOR, "torch", lambda ctx: _cli.Check("torch", "SKIP", "faked", required=False))
    code = _cli.main(["doctor", "--json"])
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert code == (1 if failed else 0)
    assert [n for n, c in checks.items() if c["status"] == "FAIL" and c["required"]] == failed, checks
    assert "cuda:0 NVIDIA H200 (fake), compute capability" in checks["GPU"]["detail"]
    assert checks["driver"]["detail"].startswith(f"CUDA {version // 1000}.")
    if failed == ["GPU"]:
        assert "sm_90a" in checks["GPU"]["fix"] and "8.0" in checks["GPU"]["detail"]
    if failed == ["driver"]:
        assert ">= 580" in checks["driver"]["fix"]
    assert checks["smoke launch"]["status"] == "SKIP"  # no torch with CUDA


def test_bench_table_and_json_on_a_fake_gpu(fake, monkeypatch, capsys):
    """The timing loop and the table, with a stand-in for torch.cuda (the real numbers come from a GPU run)."""
    import types

    from tilebin.runtime import _cli

    class Event:
        def __init__(self, enable_timing):
            self.t = 0.0

        def record(self):
            self.t = len(calls) * 0.002  # 2 µs of "device time" per call, in ms

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.t - self.t

    calls: list[int] = []
    cuda = types.SimpleNamespace(is_available=lambda: True, synchronize=lambda: None, Event=Event,
                                 get_device_name=lambda: "NVIDIA H200 (fake)")
    monkeypatch.setattr(_cli, "_outside", lambda name: types.SimpleNamespace(cuda=cuda, __version__="0"))
    from tilebin.runtime import _cli_bench

    monkeypatch.setattr(_cli_bench, "_bench_cases", lambda torch, names: [("noop", "[1]", lambda: calls.append(1))])
    monkeypatch.setenv("TILEBIN_ARTIFACTS_DIR", str(fake))
    assert _cli.main(["bench", "--iters", "10"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "NVIDIA H200 (fake), 10 calls each" and out[1].split() == ["OP", "SHAPE", "HOST", "us/call",
                                                                              "DEVICE", "us/call"]
    assert out[2].split()[:2] == ["noop", "[1]"] and out[2].split()[3] == "2.0" and len(calls) == 13
    assert _cli.main(["bench", "--iters", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["iters"] == 4 and data["ops"][0]["op"] == "noop" and abs(data["ops"][0]["device_us"] - 2.0) < 1e-9
    assert _cli.main(["bench", "--iters", "0"]) == 1
    assert capsys.readouterr().err.startswith("tilebin: error: --iters 0")


def test_info_shows_optional_tensors_and_conditions(tmp_path):
    import rt_fakes as F
    from test_runtime_conditions import MOD_128, _bias_kernel, _scale

    data = _scale({128: [MOD_128]})
    data["kernels"].update(_bias_kernel()["kernels"])
    run = cli("info", "toy.scale", artifacts=F.write_artifacts(tmp_path / "a", data))
    assert run.returncode == 0, run.stderr
    assert "{dtype='bfloat16', block=128}  if n % 128 == 0 (assume)" in run.stdout
    assert "{dtype='bfloat16', block=256}\n" in run.stdout
    run = cli("info", "toy.bias", artifacts=tmp_path / "a")
    assert "bias  tensor (optional: None allowed)" in run.stdout
