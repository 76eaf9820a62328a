"""wheels/verify_wheel.py on the built wheel, and on synthetic wheels for every error it reports."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import pathlib
import struct
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_tilebin_verify_wheel", ROOT / "wheels" / "verify_wheel.py")
verify_wheel = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = verify_wheel  # dataclasses look their module up there
_spec.loader.exec_module(verify_wheel)

TAG = "cp310-abi3-manylinux_2_28_x86_64"


def test_built_wheel_passes_every_check(built_wheel):
    report = verify_wheel.verify(built_wheel)
    print(report.summary())
    assert report.errors == []
    assert report.kernels >= 1 and report.variants >= report.kernels and report.cubins >= 1


def test_built_wheel_ships_what_the_build_declares(built_wheel):
    """The packaged manifest holds every (kernel, variant) tilebin.kernels declares: a full,
    current build (not a TILEBIN_AOT_MODULES subset, not a stale wheel), without -lineinfo."""
    with zipfile.ZipFile(built_wheel) as zf:
        manifest = json.loads(zf.read("tilebin/_artifacts/manifest.json"))
    if manifest["build"].get("nvcc") == "fake":
        pytest.skip("the wheel packages hand-made artifacts (TILEBIN_PREBUILT_ARTIFACTS)")
    assert manifest["build"]["arch"] == "sm_90a"
    assert manifest["build"]["lineinfo"] is False, "release wheels are built without --lineinfo"
    pytest.importorskip("tilelang", reason="comparing with the declared kernels imports them (needs tilelang)")
    from tilebin.aot import enumerate_jobs
    from tilebin.kernels.modules import ALL_MODULES

    declared: dict[str, list] = {}
    for job in enumerate_jobs(ALL_MODULES):
        declared.setdefault(job.kernel, []).append(job)
    packaged = {name: len(k["variants"]) for name, k in manifest["kernels"].items()}
    assert packaged == {name: len(jobs) for name, jobs in declared.items()}, (
        "the wheel is stale or partial: rebuild with ./wheels/build.sh")
    from tilebin.aot._build import declared_facts

    facts = declared_facts(ALL_MODULES)  # what each declaration says about itself reaches the manifest
    for name, k in manifest["kernels"].items():
        assert k.get("doc", "") == facts[name]["doc"], name
        assert k.get("meta", {}) == {key: list(v) if isinstance(v, tuple) else v
                                     for key, v in facts[name]["meta"].items()}, name
    assert manifest["kernels"]["moe.get_fused_mapping"]["meta"]["max_experts"] == 1024


# --- synthetic wheels --------------------------------------------------------------------

def _cubin(payload: bytes) -> bytes:
    return b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HH", 2, verify_wheel.EM_CUDA) + b"\0" * 44 + payload


def _shared_object(needed=(), exports=("PyInit__hot",), undefined=("PyTuple_New", "memcpy"),
                   versions=("GLIBC_2.2.5",)) -> bytes:
    """A minimal x86-64 ELF shared object: .dynstr, .dynsym and .dynamic only (what verify_wheel reads)."""
    strtab, offsets = b"\0", {}
    for s in (*needed, *exports, *undefined, *versions):
        offsets[s] = len(strtab)
        strtab += s.encode() + b"\0"
    syms = bytes(24) + b"".join(struct.pack("<IBBHQQ", offsets[s], 0x12, 0, 1, 0, 0) for s in exports)
    syms += b"".join(struct.pack("<IBBHQQ", offsets[s], 0x10, 0, 0, 0, 0) for s in undefined)
    dyn = b"".join(struct.pack("<qQ", 1, offsets[n]) for n in needed) + struct.pack("<qQ", 0, 0)
    body, at = b"", 64
    placed = []
    for blob in (strtab, syms, dyn):
        placed.append((at + len(body), len(blob)))
        body += blob
    shoff = 64 + len(body)
    head = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0,
                                                             64, 4, 0)
    sections = bytes(64)
    for kind, (off, size), link in zip((3, 11, 6), placed, (0, 1, 1)):
        sections += struct.pack("<IIQQQQIIQQ", 0, kind, 0, 0, off, size, link, 0, 8, 0)
    return head + body + sections


def _manifest(cubins: dict[str, bytes]) -> dict:
    variants = []
    for name, blob in cubins.items():
        variants.append({
            "key": {"dtype": "float32"}, "cubin": name, "sha256": hashlib.sha256(blob).hexdigest(),
            "tensors": [{"name": "x", "dtype": "float32", "shape": ["n"], "strides": [1]}], "scalars": [],
            "launches": [{"entry": "k", "grid": [["floordiv", ["add", "n", 255], 256], 1, 1], "block": [256, 1, 1],
                          "smem": 0, "args": [{"kind": "ptr", "param": "x"},
                                              {"kind": "scalar", "dtype": "int32", "value": "n"}]}],
        })
    return {"schema_version": 1, "build": {"arch": "sm_90a", "min_driver_cuda": 13000, "nvcc": "fake"},
            "kernels": {"toy.copy": {"name": "toy.copy", "params": [{"name": "x", "kind": "tensor", "rank": 1}],
                                     "variants": variants}}}


def _good_files() -> dict[str, bytes]:
    blob = _cubin(b"toy")
    cubin = f"cubins/{hashlib.sha256(blob).hexdigest()}.cubin"
    files = {f"tilebin/runtime/{p.name}": p.read_bytes() for p in (ROOT / "runtime").glob("*.py")}
    files.setdefault("tilebin/runtime/__init__.py", b"")
    files.update({
        "tilebin/__init__.py": b'__version__ = "0.1.0"\n',
        "tilebin/aot/__init__.py": b"", "tilebin/aot/__main__.py": b"",
        "tilebin/kernels/__init__.py": b"",
        "tilebin/ops/__init__.py": b"", "tilebin/ops/quant/__init__.py": b"",
        "tilebin/ops/engram/__init__.py": b"", "tilebin/ops/moe/__init__.py": b"",
        "tilebin/ops/transpose/__init__.py": b"",
        "tilebin/modeling/__init__.py": b"", "tilebin/modeling/engram/__init__.py": b"",
        "tilebin/modeling/mhc/__init__.py": b"", "tilebin/modeling/mhc/ops/__init__.py": b"",
        "tilebin/_artifacts/manifest.json": json.dumps(_manifest({cubin: blob})).encode(),
        f"tilebin/_artifacts/{cubin}": blob,
        verify_wheel.EXTENSION: _shared_object(),
    })
    return files


def _write_wheel(tmp_path: pathlib.Path, files: dict[str, bytes], tag: str = TAG, purelib: bool = False,
                 requires: tuple[str, ...] = ("cuda-bindings<14,>=13.0", "torch>=2.4; extra == \"torch\"")) -> pathlib.Path:
    info = "tilebin-0.1.0.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = ("Metadata-Version: 2.4\nName: tilebin\nVersion: 0.1.0\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nRoot-Is-Purelib: {str(purelib).lower()}\nTag: {tag}\n").encode()
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    path = tmp_path / f"tilebin-0.1.0-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _errors(tmp_path, files=None, **kw) -> list[str]:
    return verify_wheel.verify(_write_wheel(tmp_path, _good_files() if files is None else files, **kw)).errors


def _one(errors: list[str], needle: str) -> None:
    assert any(needle in e for e in errors), f"expected an error containing {needle!r}, got {errors}"


def test_synthetic_good_wheel_passes(tmp_path):
    report = verify_wheel.verify(_write_wheel(tmp_path, _good_files()))
    assert report.errors == []
    assert (report.kernels, report.variants, report.cubins) == (1, 1, 1)


def test_stray_top_level_package(tmp_path):
    files = _good_files() | {"runtime/__init__.py": b""}
    _one(_errors(tmp_path, files), "stray top-level")


def test_sources_tests_and_caches_are_refused(tmp_path):
    files = _good_files() | {"tilebin/kernels/x/k.cu": b"", "tilebin/runtime/__pycache__/a.cpython-311.pyc": b"",
                             "tilebin/kernels/test_x.py": b""}
    errors = _errors(tmp_path, files)
    for name in ("k.cu", "__pycache__", "test_x.py"):
        _one(errors, name)


def test_missing_package_module(tmp_path):
    files = _good_files()
    del files["tilebin/runtime/__init__.py"]
    _one(_errors(tmp_path, files), "missing tilebin/runtime/__init__.py")


def test_cubin_checksum_mismatch(tmp_path):
    files = _good_files()
    name = next(n for n in files if n.endswith(".cubin"))
    files[name] = _cubin(b"tampered")
    errors = _errors(tmp_path, files)
    _one(errors, "sha256")


def test_missing_and_unlisted_cubins(tmp_path):
    files = _good_files()
    name = next(n for n in files if n.endswith(".cubin"))
    blob = files.pop(name)
    files["tilebin/_artifacts/cubins/stale.cubin"] = blob
    errors = _errors(tmp_path, files)
    _one(errors, "missing from the wheel")
    _one(errors, "not listed in manifest.json")


def test_not_a_cuda_elf(tmp_path):
    blob = b"not an elf"
    cubin = f"cubins/{hashlib.sha256(blob).hexdigest()}.cubin"
    files = _good_files()
    files = {n: d for n, d in files.items() if not n.endswith(".cubin")}
    files["tilebin/_artifacts/manifest.json"] = json.dumps(_manifest({cubin: blob})).encode()
    files[f"tilebin/_artifacts/{cubin}"] = blob
    _one(_errors(tmp_path, files), "not a CUDA ELF")


def test_manifest_rejected_by_the_runtime_parser(tmp_path):
    files = _good_files()
    data = json.loads(files["tilebin/_artifacts/manifest.json"])
    data["schema_version"] = 99
    files["tilebin/_artifacts/manifest.json"] = json.dumps(data).encode()
    _one(_errors(tmp_path, files), "runtime's parser")


def test_pure_python_tag_is_refused(tmp_path):
    errors = _errors(tmp_path, tag="py3-none-any", purelib=True)
    _one(errors, "wheel tags")
    _one(errors, "Root-Is-Purelib")
    _one(_errors(tmp_path, tag="py3-none-manylinux_2_28_x86_64"), "want cp310-abi3")


def test_hard_dependency_on_build_tools_is_refused(tmp_path):
    errors = _errors(tmp_path, requires=("cuda-bindings>=13.0,<14", "tilelang==0.1.15", "torch"))
    _one(errors, "'tilelang==0.1.15'")
    _one(errors, "'torch'")


def test_size_budget(tmp_path):
    report = verify_wheel.verify(_write_wheel(tmp_path, _good_files()), budget_mb=0.001)
    _one(report.errors, "budget")


def test_record_must_match(tmp_path):
    path = _write_wheel(tmp_path, _good_files())
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr("tilebin/extra.py", b"")
    _one(verify_wheel.verify(path).errors, "RECORD does not list tilebin/extra.py")


def test_cli_exit_status(tmp_path, capsys):
    good = _write_wheel(tmp_path, _good_files())
    assert verify_wheel.main([str(good)]) == 0
    assert "1 kernels, 1 variants, 1 cubins" in capsys.readouterr().out
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = _write_wheel(bad_dir, _good_files() | {"aot/__init__.py": b""})
    assert verify_wheel.main([str(bad)]) == 1


def test_built_wheel_extension_links_nothing(built_wheel):
    """The real extension: no NEEDED entry at all beyond glibc's, only PyInit__hot exported."""
    with zipfile.ZipFile(built_wheel) as zf:
        needed, exported, undefined, _glibc = verify_wheel.elf_dynamic(zf.read(verify_wheel.EXTENSION))
    assert not any("cuda" in n or "python" in n for n in needed), needed
    assert exported == ["PyInit__hot"] and "PyLong_FromLong" in undefined


@pytest.mark.parametrize("change, needle", [
    ({"needed": ("libcuda.so.1",)}, "links ['libcuda.so.1']"),
    ({"needed": ("libpython3.11.so.1.0",)}, "links ['libpython3.11.so.1.0']"),
    ({"exports": ("PyInit__hot", "helper")}, "exports ['PyInit__hot', 'helper']"),
    ({"undefined": ("cuLaunchKernel",)}, "imports CUDA symbols ['cuLaunchKernel']"),
    ({"versions": ("GLIBC_2.34",)}, "needs ['GLIBC_2.34']"),
])
def test_extension_policy(tmp_path, change, needle):
    files = _good_files() | {verify_wheel.EXTENSION: _shared_object(**change)}
    _one(_errors(tmp_path, files), needle)


def test_extension_missing_or_not_elf_or_extra_binaries(tmp_path):
    files = _good_files()
    del files[verify_wheel.EXTENSION]
    _one(_errors(tmp_path, files), f"missing {verify_wheel.EXTENSION}")
    _one(_errors(tmp_path, _good_files() | {verify_wheel.EXTENSION: b"\x7fELF junk"}), "not a 64-bit")
    _one(_errors(tmp_path, _good_files() | {"tilebin/runtime/other.so": b""}), "other.so must not ship")
