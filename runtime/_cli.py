"""``python -m tilebin``, ``tilebin``: ``list``, ``info NAME``, ``verify``, ``doctor``, ``bench``, each with ``--json``.

Aligned plain text on stdout (JSON with ``--json``); an error is one ``tilebin: error: ...`` line on stderr."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from . import _driver, _settings
from ._dispatch import is_internal, unknown_kernel
from ._errors import ArgumentError, ArtifactError, DeviceError, TilebinError
from ._expr import to_text
from ._loader import cubin_path, verify_cubin
from ._manifest import KernelSpec
from ._registry import load_manifest
from ._tensors import key_text

PROG = "tilebin"
SMOKE_KERNEL = "transpose.batched_transpose"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        self.exit(2, f"{PROG}: error: {message} (see {PROG} --help)\n")


def _outside(module: str) -> Any:
    """Import ``module`` now: torch (doctor's optional checks, bench) and tilebin.ops (bench) only.  The
    runtime never imports them; list, info and verify never get here (tests/runtime/test_cli.py checks)."""
    return importlib.import_module(module)


def _table(rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns, two spaces apart; the first row is the header."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=1, sort_keys=True) if args.json else text)


def cmd_list(args: argparse.Namespace) -> int:
    man = load_manifest(_settings.artifacts_dir())
    kernels = [(n, man.kernels[n]) for n in sorted(man.kernels) if args.all or not is_internal(n)]
    data = [{"name": n, "doc": k.doc, "variants": [dict(v.key) for v in k.variants]} for n, k in kernels]
    rows = [("KERNEL", "VARIANTS", "KEYS")]
    rows += [(n, len(k.variants), "; ".join(key_text(v.key) for v in k.variants)) for n, k in kernels]
    total = sum(len(k.variants) for _, k in kernels)
    _emit(args, data, _table(rows) + f"\n\n{len(kernels)} kernels, {total} variants")
    return 0


def _launch_facts(spec: KernelSpec) -> dict[str, Any]:
    launches = [ln for v in spec.variants for ln in v.launches]
    dims: dict[tuple[str, int], set] = {}
    for t in (t for v in spec.variants for t in v.tensors):
        for i, d in enumerate(t.shape):
            dims.setdefault((t.name, i), set()).add(d if isinstance(d, int) else None)
    static = [f"{n}[{i}]=" + "|".join(map(str, sorted(vals))) for (n, i), vals in dims.items() if None not in vals]
    return {"launches_per_call": sorted({len(v.launches) for v in spec.variants}),
            "cooperative": any(ln.cooperative for ln in launches), "pdl": any(ln.pdl for ln in launches),
            "tma": any(v.tma for v in spec.variants), "cluster": any(ln.cluster != (1, 1, 1) for ln in launches),
            "max_smem": max((ln.smem for ln in launches), default=0), "static_dims": static}


def _info_data(spec: KernelSpec) -> dict[str, Any]:
    params = []
    for p in spec.params:
        dtypes = sorted({d for v in spec.variants for t in (*v.tensors, *v.scalars) if t.name == p.name
                         for d in (t.dtype, *getattr(t, "also_dtypes", ()))})
        params.append({"name": p.name, "kind": p.kind, "rank": p.rank, "dtype": "|".join(dtypes) or "-",
                       "optional": p.optional})
    conditions = [[f"{to_text(c.expr)} ({c.source})" for c in v.conditions] for v in spec.variants]
    return {"name": spec.name, "doc": spec.doc, "meta": dict(spec.meta), "params": params,
            "variants": [dict(v.key) for v in spec.variants], "conditions": conditions,
            "launch": _launch_facts(spec)}


def cmd_info(args: argparse.Namespace) -> int:
    man = load_manifest(_settings.artifacts_dir())
    if args.name not in man.kernels:
        raise unknown_kernel(args.name, man.kernels)
    data = _info_data(man.kernels[args.name])
    lines = [data["name"], "", data["doc"] or "(no doc)", "", "parameters:"]
    rows = [("NAME", "KIND", "DTYPE", "RANK")]
    rows += [(p["name"], p["kind"] + (" (optional: None allowed)" if p["optional"] else ""), p["dtype"],
              p["rank"] if p["kind"] == "tensor" else "-") for p in data["params"]]
    lines += ["  " + r for r in _table(rows).splitlines()]
    lines += ["", f"variants ({len(data['variants'])}): in the order the runtime tries them"]
    for key, conds in zip(data["variants"], data["conditions"]):
        lines.append("  " + key_text(key) + (f"  if {' and '.join(conds)}" if conds else ""))
    facts = data["launch"]
    flags = [k for k in ("cooperative", "pdl", "tma", "cluster") if facts[k]]
    smem = f"up to {facts['max_smem']} bytes dynamic smem" if facts["max_smem"] else "no dynamic smem"
    lines += ["", f"launch: {'/'.join(map(str, facts['launches_per_call']))} kernel launch(es) per call; "
              f"{', '.join(flags) or 'plain launches'}; {smem}"]
    lines += ["static dims: " + ", ".join(facts["static_dims"])] if facts["static_dims"] else []
    lines += ["", "meta:", *(f"  {k} = {v}" for k, v in sorted(data["meta"].items()))] if data["meta"] else []
    _emit(args, data, "\n".join(lines))
    return 0


@dataclass
class VerifyReport:
    artifacts: str
    kernels: int = 0
    variants: int = 0
    cubins: int = 0
    bytes: int = 0
    failures: list[str] = field(default_factory=list)


def _verify_cubins(root: Any, name: str, spec: KernelSpec, seen: dict[str, str], rep: VerifyReport) -> None:
    for v in spec.variants:
        rep.variants += 1
        where = f"{name} variant {key_text(v.key)}: {v.cubin}"
        if v.cubin in seen:
            if seen[v.cubin] != v.sha256:
                rep.failures.append(f"{where}: listed with two sha256 values ({seen[v.cubin]} and {v.sha256})")
            continue
        seen[v.cubin] = v.sha256
        try:
            data = cubin_path(root, v.cubin, name).read_bytes()
            rep.cubins, rep.bytes = rep.cubins + 1, rep.bytes + len(data)
            if not data:
                raise ArtifactError(f"{where}: empty file (0 bytes); reinstall the wheel")
            verify_cubin(data, v.sha256, kernel=name, key=key_text(v.key), path=v.cubin)
        except ArtifactError as exc:
            rep.failures.append(str(exc))
        except OSError as exc:
            rep.failures.append(f"{where}: missing or unreadable ({exc.__class__.__name__}); reinstall the wheel")


def verify_artifacts(root: Any) -> VerifyReport:
    """Check every kernel entry against the manifest schema and every cubin's sha256 and size.

    :class:`ArtifactError` only when manifest.json is unreadable or of another schema; all else goes in ``failures``.
    """
    man = load_manifest(root)
    rep = VerifyReport(str(root))
    seen: dict[str, str] = {}
    for name in sorted(man.kernels):
        rep.kernels += 1
        try:
            spec = man.kernels[name]  # parses and checks the entry (ArtifactError naming it)
        except ArtifactError as exc:
            rep.failures.append(str(exc))
            continue
        _verify_cubins(root, name, spec, seen, rep)
    if not rep.kernels:
        rep.failures.append(f"{root}/manifest.json lists no kernels; rebuild the artifacts")
    return rep


def cmd_verify(args: argparse.Namespace) -> int:
    rep = verify_artifacts(_settings.artifacts_dir())
    data = {"ok": not rep.failures, **asdict(rep)}
    head = (f"artifacts: {rep.artifacts}\n{rep.kernels} kernels, {rep.variants} variants, {rep.cubins} cubins "
            f"({rep.bytes / 2**20:.2f} MiB), schema and sha256 checked")
    body = [f"FAIL {f}" for f in rep.failures] or ["OK"]
    _emit(args, data, "\n".join([head, *body]))
    if rep.failures and not args.json:
        print(f"{PROG}: error: verify found {len(rep.failures)} problem(s)", file=sys.stderr)
    return 1 if rep.failures else 0


@dataclass
class Check:
    name: str
    status: str  # "OK" | "FAIL" | "SKIP"
    detail: str
    fix: str = ""
    required: bool = True


def _check_artifacts(ctx: dict[str, Any]) -> Check:
    root = _settings.artifacts_dir()
    man = load_manifest(root)
    b = man.build
    ctx.update(manifest=man, arch=b.arch, need=b.min_driver_cuda)
    return Check("artifacts", "OK", f"{len(man.kernels)} kernels for {b.arch}, CUDA >= "
                 f"{_driver._ver(b.min_driver_cuda)} (nvcc {b.nvcc or '?'}, TileLang {b.tilelang or '?'}) in {root}")


def _check_bindings(ctx: dict[str, Any]) -> Check:
    from importlib import metadata
    try:
        version = metadata.version("cuda-bindings")
    except metadata.PackageNotFoundError:
        return Check("cuda-bindings", "FAIL", "not installed", 'pip install "cuda-bindings>=13,<14"')
    ok = version.split(".")[0] == "13"
    return Check("cuda-bindings", "OK" if ok else "FAIL", version,
                 "" if ok else f'cuda-bindings {version} is not 13.x: pip install "cuda-bindings>=13,<14"')


def _check_driver(ctx: dict[str, Any]) -> Check:
    need = ctx["need"]
    try:
        ctx["mod"] = mod = _driver.driver(need)
    except DeviceError as exc:
        return Check("driver", "FAIL", str(exc), "install an NVIDIA GPU driver >= 580 (CUDA 13) and check "
                     "that the GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)")
    try:  # the kernel module's version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  ..."
        with open("/proc/driver/nvidia/version") as f:
            module = next((w for w in f.readline().split() if w[:1].isdigit() and "." in w), "")
    except OSError:
        module = ""
    version = _driver._STATE["version"]
    detail = f"CUDA {_driver._ver(version)}" + (f", kernel module {module}" if module else "")
    ok = version >= need
    return Check("driver", "OK" if ok else "FAIL", detail,
                 "" if ok else f"the cubins need CUDA {_driver._ver(need)}: upgrade the NVIDIA driver to >= 580")


def _check_gpu(ctx: dict[str, Any]) -> Check:
    mod, arch = ctx.get("mod"), ctx["arch"]
    count = 0 if mod is None else _driver.check(mod.cuDeviceGetCount(), "cuDeviceGetCount")
    if not count:
        why = "no GPU visible (no usable driver)" if mod is None else "the driver sees no device"
        return Check("GPU", "FAIL", why, "run on a machine with an H100/H200/H20/H800; check CUDA_VISIBLE_DEVICES")
    dev = _driver.check(mod.cuDeviceGet(0), "cuDeviceGet")
    name = _driver.check(mod.cuDeviceGetName(256, dev), "cuDeviceGetName").split(b"\0", 1)[0].decode().strip()
    attr = mod.CUdevice_attribute
    cc = tuple(_driver.check(mod.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute") for a in (
        attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
    (want, exact) = _driver.required_cc(arch)
    ok = cc == want if exact else cc >= want
    ctx["gpu_ok"] = ok
    return Check("GPU", "OK" if ok else "FAIL", f"{count} device(s); cuda:0 {name}, compute capability {cc[0]}.{cc[1]}",
                 "" if ok else f"the cubins are {arch} (compute capability {want[0]}.{want[1]}: H100/H200/H20/H800) "
                 "and run on no other GPU")


def _check_torch(ctx: dict[str, Any]) -> Check:
    try:
        torch = _outside("torch")
    except ImportError:
        return Check("torch", "SKIP", "not installed (optional: the runtime takes any __cuda_array_interface__ "
                     "object)", 'pip install "tilebin[torch]" for the op layer', required=False)
    if not ctx.get("gpu_ok"):
        return Check("torch", "SKIP", f"{torch.__version__}; CUDA not checked (no usable GPU)", required=False)
    ok = torch.cuda.is_available()
    ctx["torch"] = torch if ok else None
    return Check("torch", "OK" if ok else "FAIL", f"{torch.__version__}, CUDA {'available' if ok else 'unavailable'}",
                 "" if ok else "install a CUDA build of torch (pip install torch --index-url "
                 "https://download.pytorch.org/whl/cu130)", required=False)


def _check_hot(ctx: dict[str, Any]) -> Check:
    from . import hot_path
    try:
        path = hot_path()
    except TilebinError as exc:
        return Check("hot path", "FAIL", str(exc), f"unset {_settings.HOT_PATH.name} or reinstall the wheel")
    ok = path == "c"
    if ok:
        from ._launcher import hot_module
        from ._tensors import tensor_shim

        why = tensor_shim(hot_module())
        shim = "torch tensors read through torch's stable C shim" if why is None else f"torch's accessors: {why}"
    return Check("hot path", "OK" if ok else "FAIL", f"compiled (tilebin.runtime._hot); {shim}" if ok else
                 "pure-Python launcher (works, slower)", "" if ok else "reinstall the wheel (tilebin/runtime/"
                 f"_hot.abi3.so did not load), or unset {_settings.HOT_PATH.name}=python", required=False)


def _check_smoke(ctx: dict[str, Any]) -> Check:
    torch, man = ctx.get("torch"), ctx.get("manifest")
    why = ("not in these artifacts" if man is None or SMOKE_KERNEL not in man.kernels else
           "no usable GPU" if not ctx.get("gpu_ok") else "needs torch with CUDA" if torch is None else "")
    if why:
        return Check("smoke launch", "SKIP", f"{SMOKE_KERNEL}: {why}", required=False)
    from . import launch
    x = torch.randn(2, 64, 96, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(2, 96, 64, dtype=torch.bfloat16, device="cuda")
    launch(SMOKE_KERNEL, x, out)
    torch.cuda.synchronize()
    ok = torch.equal(out, x.transpose(1, 2))
    return Check("smoke launch", "OK" if ok else "FAIL", f"{SMOKE_KERNEL} on [2, 64, 96] bfloat16: "
                 + ("result checked" if ok else "wrong result"), "" if ok else "report a bug with this output")


DOCTOR: dict[str, Callable[[dict[str, Any]], Check]] = {
    "artifacts": _check_artifacts, "cuda-bindings": _check_bindings, "driver": _check_driver, "GPU": _check_gpu,
    "torch": _check_torch, "hot path": _check_hot, "smoke launch": _check_smoke}


def run_doctor() -> list[Check]:
    """Every check, in order; a check that raises is reported as FAIL with the error's one line."""
    ctx: dict[str, Any] = {"arch": "sm_90a", "need": 13000}  # what the wheels are built for, until the manifest says
    checks = []
    for name, fn in DOCTOR.items():
        try:
            checks.append(fn(ctx))
        except Exception as exc:  # a failing check must not hide the others; TilebinErrors carry their fix
            fix = "" if isinstance(exc, TilebinError) else "report a bug with this output"
            checks.append(Check(name, "FAIL", f"{type(exc).__name__}: {exc}", fix))
    return checks


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = run_doctor()
    bad = [c for c in checks if c.status == "FAIL" and c.required]
    data = {"ok": not bad, "checks": [asdict(c) for c in checks]}
    lines = []
    for c in checks:
        tag = c.status + ("" if c.required or c.status != "FAIL" else " (optional)")
        lines.append(f"{tag:<15} {c.name:<13} {c.detail}")
        if c.fix and c.status == "FAIL":
            lines.append(f"{'':<29} fix: {c.fix}")
    lines.append("" if not bad else f"\n{len(bad)} required check(s) failed: {', '.join(c.name for c in bad)}")
    _emit(args, data, "\n".join(lines).rstrip())
    return 1 if bad else 0


def parser() -> argparse.ArgumentParser:
    from ._cli_bench import cmd_bench  # imports torch and tilebin.ops when it runs, never at import

    p = _Parser(prog=PROG, description="Inspect, verify and check the prebuilt tilebin kernels of this install "
                f"(artifacts: ${_settings.ARTIFACTS_DIR.name}, default: the wheel's).")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands = {"list": (cmd_list, "kernels and their variants"),
                "info": (cmd_info, "one kernel: parameters, variants and their conditions, launch facts, doc"),
                "verify": (cmd_verify, "check the manifest schema and every cubin's sha256 and size"),
                "doctor": (cmd_doctor, "will it run here: GPU, driver, cuda-bindings, torch, a smoke launch"),
                "bench": (cmd_bench, "host and device time of a few ops (needs a GPU and torch)")}
    for name, (fn, help_text) in commands.items():
        s = sub.add_parser(name, help=help_text, description=help_text)
        s.add_argument("--json", action="store_true", help="machine-readable output")
        s.set_defaults(func=fn)
    sub.choices["info"].add_argument("name", help="kernel name, as `list` shows it")
    sub.choices["list"].add_argument("--all", action="store_true", help="include the internal (test, demo) kernels")
    sub.choices["bench"].add_argument("--iters", type=int, default=100, help="timed calls per op (default 100)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a failed check or error, 2 bad usage)."""
    p = parser()
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 2
    try:
        return args.func(args)
    except TilebinError as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc), "type": type(exc).__name__}))
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
