"""Enumerate jobs -> lower/compile in parallel (cached) -> write cubins -> write the manifest last."""

from __future__ import annotations

import hashlib
import importlib
import multiprocessing
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from tilebin.runtime._manifest import BuildInfo, Manifest, parse_manifest, to_plain
from tilebin.runtime._errors import ArtifactError

from . import _cache
from ._errors import AotError, kernel_declarations
from ._lower import Job, JobResult, find_decl, lower_job
from ._nvcc import ARCH, Nvcc, find_nvcc, nvcc_flags


@dataclass(frozen=True)
class BuildOptions:
    out_dir: pathlib.Path
    cache_dir: pathlib.Path | None = None
    jobs: int = 0  # 0: one per core
    lineinfo: bool = False
    nvcc: str | None = None
    allow_nvcc_mismatch: bool = False
    allow_tilelang_mismatch: bool = False

    @property
    def error_log(self) -> pathlib.Path:
        """Where a failed job's TileLang/TVM output and traceback go (removed when a build starts)."""
        return self.out_dir / ERROR_LOG


ERROR_LOG = "aot-errors.log"
# The TileLang release `tilebin[aot]` pins (pyproject.toml [project.optional-dependencies] aot;
# tests/aot/test_declaration_errors.py checks they agree): the one the AOT tool is tested with.
PINNED_TILELANG = "0.1.15"


def enumerate_jobs(modules: Iterable[str]) -> list[Job]:
    """Every (kernel, variant) job the modules declare, in declaration order.  Every declaration
    mistake (an unimportable module, a bad KERNELS, a name declared twice) is an AotError."""
    jobs, seen = [], {}
    for module in modules:
        for decl in kernel_declarations(module):
            if decl.name in seen:
                where = "twice in its KERNELS" if seen[decl.name] == module else f"by both {seen[decl.name]} and {module}"
                raise AotError(f"{module}: kernel {decl.name!r} is declared {where}; every kernel needs its own name")
            seen[decl.name] = module
            for i, v in enumerate(decl.grid):  # a variant's specialisations just ahead of it: the runtime takes the first that serves
                grid_key = tuple(sorted(v.items()))
                jobs += [Job(module, decl.name, i, grid_key, tuple(sorted(s.items()))) for s in getattr(decl, "specialise", ())]
                jobs.append(Job(module, decl.name, i, grid_key))
    return jobs


def _execute(todo: list[Job], nvcc: Nvcc, opts: BuildOptions, log) -> list[JobResult]:
    if not todo:
        return []
    workers = min(len(todo), opts.jobs or os.cpu_count() or 1)
    progress = _Progress(len(todo), log)
    args = (nvcc, opts.lineinfo, str(opts.error_log))
    if workers == 1:
        return [progress.done(lower_job(j, *args)) for j in todo]
    ctx = multiprocessing.get_context("spawn")  # TileLang/TVM state is not fork-safe
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:  # children inherit sys.path
        futures = [pool.submit(lower_job, j, *args) for j in todo]
        try:
            return [progress.done(f.result()) for f in as_completed(futures)]
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # a failed job stops the build now
            raise


class _Progress:
    """Logs ``[n/N]`` per finished job with the elapsed time and an ETA from the mean so far."""

    def __init__(self, total: int, log, clock=time.perf_counter):
        self.total, self.log, self.clock = total, log, clock
        self.count, self.t0 = 0, clock()

    def done(self, res: JobResult) -> JobResult:
        self.count += 1
        elapsed = self.clock() - self.t0
        eta = elapsed / self.count * (self.total - self.count)
        self.log(f"  [{self.count}/{self.total}] built {res.job.where}: lower {res.seconds_lower:.1f}s, "
                 f"nvcc {res.seconds_nvcc:.1f}s, {len(res.cubin)} B; elapsed {_clock(elapsed)}, ETA {_clock(eta)}")
        return res


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _require_tilelang(allow_mismatch: bool = False) -> None:
    """TileLang imports, and is the release tilebin[aot] pins (unless ``allow_mismatch``)."""
    try:
        import tilelang
    except Exception as exc:  # noqa: BLE001 -- ImportError, or a broken install's own error
        raise AotError(f"the AOT build needs TileLang, which {sys.executable} cannot import "
                       f"({type(exc).__name__}: {exc}); install it with: pip install \"tilebin[aot]\"") from None
    version = str(getattr(tilelang, "__version__", "unknown"))
    if version.split("+")[0] != PINNED_TILELANG and not allow_mismatch:
        raise AotError(f"TileLang {version} is installed ({os.path.dirname(tilelang.__file__ or '')}), but tilebin.aot "
                       f"is tested with TileLang {PINNED_TILELANG}, the release tilebin[aot] pins; fix: "
                       f"pip install \"tilelang=={PINNED_TILELANG}\" (or pip install \"tilebin[aot]\"), "
                       f"or pass --allow-tilelang-mismatch to build anyway")


def _tool_facts(nvcc: Nvcc, opts: BuildOptions) -> dict:
    """What of the toolchain goes into every cache key: versions and the flags (include folders
    left out: they are TileLang's, covered by its version, and differ between machines)."""
    import tilelang

    return {"tilelang": tilelang.__version__, "nvcc": nvcc.version, "arch": ARCH, "lineinfo": opts.lineinfo,
            "nvcc_flags": nvcc_flags([], opts.lineinfo, [])}


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Write ``path`` as a new 0644 file renamed into place (mkstemp alone makes it 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _make_dirs(folder: pathlib.Path) -> None:
    """Create ``folder`` and its missing parents as 0755 whatever the umask (artifacts are shared)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for path in reversed(missing):
        path.mkdir(exist_ok=True)
        path.chmod(0o755)


def declared_facts(modules: Iterable[str]) -> dict[str, dict]:
    """``{kernel: {"doc": ..., "meta": ...}}`` as the modules declare them (imported already by
    :func:`enumerate_jobs`); a declaration object without them gives empty ones."""
    facts = {}
    for module in modules:
        for decl in importlib.import_module(module).KERNELS:
            facts[decl.name] = {"doc": getattr(decl, "doc", "") or "", "meta": dict(getattr(decl, "meta", {}) or {})}
    return facts


def _assemble(results: Sequence[JobResult], build: BuildInfo, facts: dict[str, dict] | None = None) -> Manifest:
    kernels: dict[str, dict] = {}
    for res in results:
        k = kernels.setdefault(res.job.kernel, {"name": res.job.kernel, "params": res.params, "variants": [],
                                                **(facts or {}).get(res.job.kernel, {})})
        if k["params"] != res.params:
            raise AotError(f"kernel {res.job.kernel}: variants disagree on the parameter list "
                           f"({k['params']} vs {res.params}); every variant must take the same arguments")
        k["variants"].append({**res.variant, "cubin": f"cubins/{res.variant['sha256']}.cubin"})
    data = {"schema_version": 1, "build": to_plain(build), "kernels": kernels}
    try:
        return parse_manifest(data, "new manifest")
    except ArtifactError as exc:
        raise AotError(f"the launch facts cannot be expressed in the manifest: {exc}") from None


def build(modules: Sequence[str], opts: BuildOptions, log=print) -> Manifest:
    """Build every variant the modules declare into ``opts.out_dir``; returns the manifest written."""
    t0 = time.perf_counter()
    _require_tilelang(opts.allow_tilelang_mismatch)
    opts.error_log.unlink(missing_ok=True)  # a log left there describes an older build
    jobs = enumerate_jobs(modules)  # declaration mistakes first: they need no toolchain
    nvcc = find_nvcc(opts.nvcc, opts.allow_nvcc_mismatch)
    facts = _tool_facts(nvcc, opts)
    sources = {m: _cache.source_digest(m) for m in dict.fromkeys(j.module for j in jobs)}
    configs = {j: getattr(find_decl(j.module, j.kernel), "pass_configs", {}) for j in jobs}
    keys = {j: _cache.job_key(j, sources[j.module], facts, configs[j]) for j in jobs}
    cached = {j: _cache.load(opts.cache_dir, keys[j], j) if opts.cache_dir else None for j in jobs}
    todo = [j for j in jobs if cached[j] is None]
    log(f"tilebin.aot: {len(jobs)} variants of {len({j.kernel for j in jobs})} kernels, "
        f"{len(jobs) - len(todo)} cached, {len(todo)} to build (nvcc {nvcc.version}, {ARCH})")
    fresh = {r.job: r for r in _execute(todo, nvcc, opts, log)}
    if opts.cache_dir:
        for job, res in fresh.items():
            _cache.store(opts.cache_dir, keys[job], res)
    results = [cached[j] or fresh[j] for j in jobs]
    import tilebin

    info = BuildInfo(arch=ARCH, min_driver_cuda=nvcc.min_driver_cuda, tilelang=facts["tilelang"],
                     nvcc=nvcc.version, lineinfo=opts.lineinfo, tilebin=tilebin.__version__)
    manifest = _assemble(results, info, declared_facts(dict.fromkeys(j.module for j in jobs)))
    _write_outputs(opts.out_dir, results, manifest)
    log(f"tilebin.aot: wrote {opts.out_dir}/manifest.json in {time.perf_counter() - t0:.1f}s")
    return manifest


def _write_outputs(out_dir: pathlib.Path, results: Sequence[JobResult], manifest: Manifest) -> None:
    cubins = out_dir / "cubins"
    _make_dirs(cubins)
    wanted = set()
    for res in results:
        name = f"{hashlib.sha256(res.cubin).hexdigest()}.cubin"
        wanted.add(name)
        if not (cubins / name).exists():
            _write_atomic(cubins / name, res.cubin)
    _write_atomic(out_dir / "manifest.json", manifest.to_json().encode())  # last: readers see old or new
    for stale in cubins.glob("*.cubin"):
        if stale.name not in wanted:
            stale.unlink()
