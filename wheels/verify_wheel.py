#!/usr/bin/env python3
"""Check a built tilebin wheel before it ships.  Standard library only.

    python wheels/verify_wheel.py [WHEEL ...] [--budget-mb 50]

With no WHEEL it checks every ``wheels/dist/tilebin-*.whl``.  Checks, all reported at once:

- layout: only ``tilebin/`` and the wheel's ``.dist-info/`` at the top (never a bare
  ``runtime``/``aot``/``kernels``); the package modules are there; no CUDA/C sources,
  host binaries other than the compiled hot path, tests or ``__pycache__``;
- the compiled hot path ``tilebin/runtime/_hot.abi3.so``: an x86-64 shared object that needs
  no library beyond glibc's (never libcuda or libpython), exports only ``PyInit__hot``,
  imports no CUDA symbol, and asks for glibc <= 2.28 (manylinux_2_28);
- ``tilebin/_artifacts/manifest.json`` parses with the runtime's own parser, taken from the
  wheel itself; every cubin it lists is present, is a CUDA ELF, and matches its sha256;
  no cubin is unlisted;
- metadata: ``cp310-abi3-<linux x86_64>`` tag, not purelib, ``cuda-bindings`` required,
  no hard dependency on tilelang/TVM/torch, the version equal to ``tilebin.__version__``;
- RECORD lists every file with the right hash; every ``.py`` compiles;
- size within the budget.

Exit status 0 when all pass, 1 otherwise.  :func:`verify` returns a :class:`Report`
(tests/test_wheel_contents.py uses it).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib
import json
import re
import struct
import sys
import tempfile
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = "tilebin/_artifacts/"
DEFAULT_BUDGET_MB = 50.0
REQUIRED = (
    "tilebin/__init__.py",
    "tilebin/runtime/__init__.py",
    "tilebin/runtime/_manifest.py",
    "tilebin/aot/__init__.py",
    "tilebin/aot/__main__.py",
    "tilebin/kernels/__init__.py",
    "tilebin/ops/__init__.py",
    "tilebin/ops/quant/__init__.py",
    "tilebin/ops/engram/__init__.py",
    "tilebin/ops/moe/__init__.py",
    "tilebin/ops/transpose/__init__.py",
    "tilebin/modeling/__init__.py",
    "tilebin/modeling/engram/__init__.py",
    "tilebin/modeling/mhc/__init__.py",
    "tilebin/modeling/mhc/ops/__init__.py",
    ARTIFACTS + "manifest.json",
)
FORBIDDEN_SUFFIXES = (".cu", ".cuh", ".c", ".cc", ".cpp", ".h", ".hpp", ".o", ".a", ".so", ".pyc", ".pyo")
FORBIDDEN_PARTS = ("__pycache__", "tests", ".pytest_cache", ".git")
HEAVY_DEPS = ("tilelang", "tvm", "apache-tvm", "apache-tvm-ffi", "torch", "triton")
ELF_MAGIC, EM_CUDA = b"\x7fELF", 190
_PY_TAG = re.compile(r"^cp310-abi3-(manylinux_\d+_\d+_x86_64|manylinux\d+_x86_64|linux_x86_64)$")
EXTENSION = "tilebin/runtime/_hot.abi3.so"
ALLOWED_NEEDED = ("libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1")
MAX_GLIBC = (2, 28)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Report:
    wheel: Path
    size: int = 0
    kernels: int = 0
    variants: int = 0
    cubins: int = 0
    cubin_bytes: int = 0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        mb = self.size / 2**20
        return (f"{self.wheel.name}: {mb:.2f} MiB; {self.kernels} kernels, {self.variants} variants, "
                f"{self.cubins} cubins ({self.cubin_bytes / 2**20:.2f} MiB uncompressed)")


def verify(wheel: Path | str, budget_mb: float = DEFAULT_BUDGET_MB) -> Report:
    """Run every check on one wheel; problems land in ``Report.errors`` (never raises for them)."""
    wheel = Path(wheel)
    report = Report(wheel=wheel, size=wheel.stat().st_size)
    if report.size > budget_mb * 2**20:
        report.errors.append(f"wheel is {report.size / 2**20:.1f} MiB, over the {budget_mb:g} MiB budget; "
                             "drop variants, or check that cubins were built without --lineinfo")
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        report.errors.append(f"not a zip file: {exc}")
        return report
    with zf:
        files = {i.filename: i for i in zf.infolist() if not i.is_dir()}
        dist_info = _check_layout(wheel, files, report.errors)
        if dist_info:
            _check_metadata(wheel, zf, dist_info, report.errors)
            _check_record(zf, files, dist_info, report.errors)
        _check_python(zf, files, report.errors)
        if EXTENSION in files:
            _check_extension(zf.read(EXTENSION), report.errors)
        if ARTIFACTS + "manifest.json" in files:
            _check_artifacts(zf, files, report)
    return report


def _check_layout(wheel: Path, files: dict, errors: list[str]) -> str | None:
    parts = wheel.name[:-4].split("-")
    dist_info = f"{parts[0]}-{parts[1]}.dist-info" if len(parts) >= 5 else None
    if dist_info is None:
        errors.append(f"wheel file name {wheel.name!r} is not name-version-py-abi-platform.whl")
    tops = sorted({n.split("/", 1)[0] for n in files})
    stray = [t for t in tops if t not in ("tilebin", dist_info)]
    if stray:
        errors.append(f"stray top-level entries {stray}: only tilebin/ and {dist_info}/ belong in the wheel "
                      "(check wheel.packages in pyproject.toml)")
    errors += [f"missing {name}" for name in (*REQUIRED, EXTENSION) if name not in files]
    for name in files:
        path = PurePosixPath(name)
        if name != EXTENSION and path.suffix in FORBIDDEN_SUFFIXES or any(p in FORBIDDEN_PARTS for p in path.parts[:-1]) \
                or re.match(r"^(test_.*|conftest)\.py$", path.name):
            errors.append(f"{name} must not ship (sources, binaries, tests and caches stay out: wheel.exclude)")
    return dist_info if dist_info and f"{dist_info}/METADATA" in files else None


def _check_metadata(wheel: Path, zf: zipfile.ZipFile, dist_info: str, errors: list[str]) -> None:
    wheel_meta = zf.read(f"{dist_info}/WHEEL").decode()
    tags = re.findall(r"^Tag: (\S+)$", wheel_meta, re.M)
    if not tags or any(not _PY_TAG.match(t) for t in tags):
        errors.append(f"wheel tags {tags}: want cp310-abi3-<manylinux x86_64> (one limited-API extension; "
                      "cubins need Linux + an NVIDIA driver): see wheel.py-api and the override in pyproject.toml")
    if "-".join(wheel.name[:-4].split("-")[-3:]) not in tags:
        errors.append(f"file name {wheel.name} does not carry the WHEEL tags {tags}")
    if not re.search(r"^Root-Is-Purelib: false$", wheel_meta, re.M):
        errors.append("Root-Is-Purelib must be false (a platform wheel)")
    meta = zf.read(f"{dist_info}/METADATA").decode()
    requires = re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
    if not any(re.match(r"cuda-bindings\s*[<>=!~]", r.replace("_", "-")) for r in requires):
        errors.append(f"METADATA does not require cuda-bindings (Requires-Dist: {requires})")
    for req in requires:
        name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
        if name in HEAVY_DEPS and "extra ==" not in req:
            errors.append(f"hard dependency {req!r}: the runtime must install with cuda-bindings only")
    version = re.search(r"^Version: (\S+)$", meta, re.M)
    init = zf.read("tilebin/__init__.py").decode() if "tilebin/__init__.py" in zf.namelist() else ""
    declared = re.search(r"^__version__ = [\"']([^\"']+)[\"']", init, re.M)
    if declared and (not version or version.group(1) != declared.group(1)):
        errors.append(f"METADATA version {version and version.group(1)} != tilebin.__version__ {declared.group(1)}")


def elf_dynamic(data: bytes) -> tuple[list[str], list[str], list[str], list[str]]:
    """(NEEDED, exported symbols, undefined symbols, GLIBC_x.y versions) of an x86-64 ELF shared
    object; ValueError when ``data`` is not one."""
    if data[:4] != ELF_MAGIC or data[4:6] != b"\x02\x01" or struct.unpack_from("<HH", data, 16) != (3, 62):
        raise ValueError("not a 64-bit little-endian x86-64 ELF shared object")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynsym = next((s for s in sections if s[1] == 11), None)  # SHT_DYNSYM
    dynamic = next((s for s in sections if s[1] == 6), None)  # SHT_DYNAMIC
    if dynsym is None or dynamic is None:
        raise ValueError("no dynamic symbol table or dynamic section")
    strtab = sections[dynsym[6]]
    strs = data[strtab[4]:strtab[4] + strtab[5]]

    def text(off: int) -> str:
        return strs[off:strs.index(b"\0", off)].decode()

    exported, undefined = [], []
    for off in range(dynsym[4] + 24, dynsym[4] + dynsym[5], 24):  # entry 0 is the null symbol
        st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, off)
        if st_shndx == 0:
            undefined.append(text(st_name))
        elif st_info >> 4 == 1:  # STB_GLOBAL
            exported.append(text(st_name))
    needed = []
    for off in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, value = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            needed.append(text(value))
    return needed, exported, undefined, sorted({v.decode() for v in re.findall(rb"GLIBC_[0-9.]+", strs)})


def _check_extension(data: bytes, errors: list[str]) -> None:
    try:
        needed, exported, undefined, glibc = elf_dynamic(data)
    except (ValueError, struct.error, IndexError) as exc:
        errors.append(f"{EXTENSION}: {exc}")
        return
    bad = [n for n in needed if n not in ALLOWED_NEEDED]
    if bad:
        errors.append(f"{EXTENSION} links {bad}: it may need glibc only (no libcuda: driver entry points come from "
                      "cuGetProcAddress; no libpython: manylinux policy); fix the link line in CMakeLists.txt")
    if exported != ["PyInit__hot"]:
        errors.append(f"{EXTENSION} exports {exported}, want only PyInit__hot (build with hidden visibility)")
    cuda = [s for s in undefined if re.match(r"^(cu[A-Z]|cuda|nv)", s)]
    if cuda:
        errors.append(f"{EXTENSION} imports CUDA symbols {cuda}: resolve them at run time instead")
    newer = [v for v in glibc if tuple(int(x) for x in v[6:].split(".")[:2]) > MAX_GLIBC]
    if newer:
        errors.append(f"{EXTENSION} needs {newer}, newer than manylinux_2_28 allows: build on an older glibc")


def _check_record(zf: zipfile.ZipFile, files: dict, dist_info: str, errors: list[str]) -> None:
    record_name = f"{dist_info}/RECORD"
    if record_name not in files:
        errors.append("RECORD is missing")
        return
    listed = {}
    for line in zf.read(record_name).decode().splitlines():
        if line.strip():
            name, digest, _size = line.rsplit(",", 2)
            listed[name] = digest
    for name in files:
        if name == record_name:
            continue
        digest = listed.get(name)
        if not digest:
            errors.append(f"RECORD does not list {name}")
            continue
        actual = base64.urlsafe_b64encode(hashlib.sha256(zf.read(name)).digest()).rstrip(b"=").decode()
        if digest != f"sha256={actual}":
            errors.append(f"RECORD hash mismatch for {name}")
    errors += [f"RECORD lists {n}, which is not in the wheel" for n in listed if n not in files]


def _check_python(zf: zipfile.ZipFile, files: dict, errors: list[str]) -> None:
    for name in files:
        if name.endswith(".py"):
            try:
                compile(zf.read(name), name, "exec", dont_inherit=True)
            except SyntaxError as exc:
                errors.append(f"{name} does not compile: {exc}")


def _load_parser(zf: zipfile.ZipFile, tmp: Path):
    """The wheel's own ``tilebin.runtime._manifest``, imported under a private name.

    The runtime package's ``__init__`` is not executed (it may need cuda.bindings), and the
    private name keeps it apart from any ``tilebin`` already imported in this process.
    """
    for name in zf.namelist():
        if name.startswith("tilebin/runtime/") and name.count("/") == 2 and name.endswith(".py"):
            (tmp / PurePosixPath(name).name).write_bytes(zf.read(name))
    pkg_name = f"_tilebin_wheel_runtime_{id(tmp):x}"
    pkg = types.ModuleType(pkg_name)
    pkg.__path__ = [str(tmp)]
    sys.modules[pkg_name] = pkg
    try:
        return importlib.import_module(f"{pkg_name}._manifest").parse_manifest
    finally:
        for mod in [m for m in sys.modules if m == pkg_name or m.startswith(pkg_name + ".")]:
            del sys.modules[mod]


def _check_artifacts(zf: zipfile.ZipFile, files: dict, report: Report) -> None:
    errors = report.errors
    text = zf.read(ARTIFACTS + "manifest.json")
    try:
        data = json.loads(text)
    except ValueError as exc:
        errors.append(f"manifest.json is not JSON: {exc}")
        return
    if "tilebin/runtime/_manifest.py" in files:
        with tempfile.TemporaryDirectory(prefix="tilebin-verify-") as tmp:
            try:
                _load_parser(zf, Path(tmp))(text, "wheel manifest.json")
            except Exception as exc:  # the parser's ArtifactError, or the parser failing to import
                errors.append(f"manifest.json fails the runtime's parser: {type(exc).__name__}: {exc}")
    kernels = data.get("kernels") if isinstance(data, dict) else None
    if not isinstance(kernels, dict) or not kernels:
        errors.append("manifest.json lists no kernels")
        return
    listed: dict[str, str] = {}
    for kname, kernel in kernels.items():
        report.kernels += 1
        for i, variant in enumerate(kernel.get("variants", [])):
            report.variants += 1
            cubin, sha = variant.get("cubin"), variant.get("sha256")
            if not isinstance(cubin, str) or not isinstance(sha, str):
                errors.append(f"{kname} variant {i}: no cubin/sha256")
                continue
            if listed.setdefault(cubin, sha) != sha:
                errors.append(f"{cubin} is listed with two different sha256 values")
            _check_cubin(zf, files, kname, i, cubin, sha, errors)
    report.cubins = len(listed)
    report.cubin_bytes = sum(files[ARTIFACTS + c].file_size for c in listed if ARTIFACTS + c in files)
    unlisted = [n for n in files if n.startswith(ARTIFACTS) and n != ARTIFACTS + "manifest.json"
                and n[len(ARTIFACTS):] not in listed]
    errors += [f"{n} is not listed in manifest.json (stale artifact?)" for n in unlisted]


def _check_cubin(zf, files, kname: str, i: int, cubin: str, sha: str, errors: list[str]) -> None:
    where = f"{kname} variant {i}: {cubin}"
    name = ARTIFACTS + cubin
    if ".." in PurePosixPath(cubin).parts or cubin.startswith("/"):
        errors.append(f"{where}: path escapes the artifacts folder")
        return
    if name not in files:
        errors.append(f"{where}: listed in manifest.json but missing from the wheel")
        return
    blob = zf.read(name)
    actual = hashlib.sha256(blob).hexdigest()
    if actual != sha:
        errors.append(f"{where}: sha256 {actual} != manifest {sha}")
    stem = PurePosixPath(cubin).stem
    if _HEX64.match(stem) and stem != sha:
        errors.append(f"{where}: content-addressed name does not match its sha256 {sha}")
    if blob[:4] != ELF_MAGIC or int.from_bytes(blob[18:20], "little") != EM_CUDA:
        errors.append(f"{where}: not a CUDA ELF cubin")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheels", nargs="*", type=Path, help="default: wheels/dist/tilebin-*.whl")
    p.add_argument("--budget-mb", type=float, default=DEFAULT_BUDGET_MB, help="size limit (MiB)")
    args = p.parse_args(argv)
    wheels = args.wheels or sorted((ROOT / "wheels" / "dist").glob("tilebin-*.whl"))
    if not wheels:
        print("verify_wheel: no wheel given and none in wheels/dist: run ./wheels/build.sh", file=sys.stderr)
        return 1
    failed = 0
    for wheel in wheels:
        report = verify(wheel, args.budget_mb)
        print(f"verify_wheel: {report.summary()}; budget {args.budget_mb:g} MiB")
        for err in report.errors:
            print(f"verify_wheel: ERROR: {err}", file=sys.stderr)
        failed += bool(report.errors)
    if failed:
        print(f"verify_wheel: {failed} wheel(s) failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
