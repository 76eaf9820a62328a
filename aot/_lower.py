"""Lower one (kernel, variant) job with TileLang and compile its cubin.  Runs in a worker process."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass
from typing import Any

from ._errors import AotError
from ._nvcc import ARCH, Nvcc, compile_cubin, nvcc_flags
from ._specialise import specialise


@dataclass(frozen=True)
class Job:
    module: str
    kernel: str
    index: int  # position of the variant in the kernel's grid
    variant: tuple[tuple[str, Any], ...]  # the grid variant: the factory's arguments
    specialised: tuple[tuple[str, int], ...] = ()  # size symbols bound at compile time (KernelDecl.specialise)

    @property
    def key(self) -> dict[str, Any]:
        """The manifest key: the grid variant plus the specialised sizes."""
        return {**dict(self.variant), **dict(self.specialised)}

    @property
    def where(self) -> str:
        return f"kernel {self.kernel} variant {self.key}"


@dataclass(frozen=True)
class JobResult:
    job: Job
    variant: dict[str, Any]  # manifest variant fields, minus the cubin path
    params: list[dict[str, Any]]
    cubin: bytes
    seconds_lower: float
    seconds_nvcc: float


def find_decl(module: str, kernel: str) -> Any:
    for decl in getattr(importlib.import_module(module), "KERNELS", ()):
        if decl.name == kernel:
            return decl
    raise AotError(f"{module} does not declare kernel {kernel!r} in KERNELS")


def decl_site(decl: Any, module: str) -> str:
    """``file:line`` of a declaration's factory (where to look when its lowering fails), else the module's file."""
    code = getattr(inspect.unwrap(getattr(decl, "factory", None)), "__code__", None)
    if code is not None:
        return f"{code.co_filename}:{code.co_firstlineno}"
    return getattr(sys.modules.get(module), "__file__", None) or module


def pass_configs(func: Any, declared: Any) -> dict[str, Any]:
    """The PassContext config of a variant: the PrimFunc's own (``T.annotate_pass_configs``, its
    ``T.compile_flags`` as ``tl.device_compile_flags``), overridden by the declaration's, as
    ``tilelang.compile`` merges them."""
    attrs = getattr(func, "attrs", None) or {}
    configs = {str(k): v for k, v in dict(attrs.get("tilelang_pass_configs", None) or {}).items()}
    flags = [str(f) for f in attrs.get("tilelang_compile_flags", None) or ()]
    if flags:
        given = configs.get("tl.device_compile_flags") or []
        configs["tl.device_compile_flags"] = ([given] if isinstance(given, str) else [str(f) for f in given]) + flags
    return {**configs, **dict(declared)}


def output_names(func: Any, outputs: Any, where: str) -> tuple[str, ...]:
    """Output parameters by name: positions (TileLang's ``out_idx``, negative from the end) become
    the PrimFunc parameter's name."""
    buffers = getattr(func, "buffer_map", {})
    params = [buffers[p].name if p in buffers else p.name for p in getattr(func, "params", ())]
    names = []
    for item in outputs:
        if isinstance(item, str):
            names.append(item)
        elif -len(params) <= item < len(params):
            names.append(params[item])
        else:
            raise AotError(f"{where}: output position {item} is out of range: the kernel has {len(params)} "
                           f"parameters ({', '.join(params)}); fix outputs= / the jit's out_idx")
    return tuple(names)


def _extra_flags(pass_configs: Any) -> list[str]:
    flags = []
    if pass_configs.get("tl.enable_fast_math"):
        flags.append("--use_fast_math")
    extra = pass_configs.get("tl.device_compile_flags")
    if extra:
        flags += [extra] if isinstance(extra, str) else [str(f) for f in extra]
    return flags


def lower_job(job: Job, nvcc: Nvcc, lineinfo: bool, error_log: str | None = None) -> JobResult:
    """Trace, lower and compile one variant; every failure is an AotError naming the declaration's
    file:line and the job.  What TileLang/TVM print meanwhile (Python logging and C++ alike, via fds
    1 and 2) is captured; on failure it goes, with the traceback, to ``error_log`` (the error's
    ``log_path``), so the console keeps one line per error."""
    decl = find_decl(job.module, job.kernel)
    with tempfile.TemporaryFile() as sink:
        try:
            with _redirected_output(sink if error_log else None):
                return _lower_job(job, decl, nvcc, lineinfo)
        except AotError as exc:
            err = AotError(f"{decl_site(decl, job.module)}: {exc}")
            if error_log:
                _append_error_log(error_log, str(err).splitlines()[0], sink, exc)
                err.log_path = error_log  # pickled with the error back to the parent
            raise err from exc


@contextlib.contextmanager
def _redirected_output(sink):
    """Point fds 1 and 2 at ``sink`` (None: leave them) for the block, flushing Python's streams."""
    if sink is None:
        yield
        return
    saved = []
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    try:
        for fd in (1, 2):
            saved.append((fd, os.dup(fd)))
            os.dup2(sink.fileno(), fd)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)


def _append_error_log(path: str, headline: str, sink, exc: BaseException) -> None:
    """Append one failed job's record (headline, captured output, traceback) in one write."""
    sink.seek(0)
    captured = sink.read().decode(errors="replace")
    trace = "".join(traceback.format_exception(exc))
    text = f"===== {headline}\n--- TileLang/TVM output ---\n{captured}\n--- traceback ---\n{trace}\n"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def _lower_job(job: Job, decl: Any, nvcc: Nvcc, lineinfo: bool) -> JobResult:
    import time

    import tilelang
    from tilelang import env as tl_env
    from tilelang import tvm
    from tvm.target import Target

    from ._facts import launch_facts  # imports TileLang: only where a job runs

    target = Target({"kind": "cuda", "arch": ARCH})
    t0 = time.perf_counter()
    try:
        with target:  # some helpers query the target while tracing
            func = decl.factory(**dict(job.variant))
        if job.specialised:
            func = specialise(func, dict(job.specialised), job.where)
        configs = pass_configs(func, decl.pass_configs)
        with tvm.transform.PassContext(opt_level=3, config=configs), target:
            art = tilelang.lower(func, target=target)
        outputs = output_names(func, decl.outputs, job.where)
        facts = launch_facts(func, art.host_mod, art.device_mod, job.where, outputs, decl.align,
                             optional=tuple(getattr(decl, "optional", ())),
                             conditions=tuple(getattr(decl, "conditions", ())), key=job.key,
                             also_dtypes=getattr(decl, "also_dtypes", None))
    except AotError:
        raise
    except Exception as exc:  # TileLang raises many types; name the job and keep the cause
        raise AotError(f"{job.where}: lowering failed: {type(exc).__name__}: {exc}") from exc
    t1 = time.perf_counter()
    flags = nvcc_flags([tl_env.TILELANG_TEMPLATE_PATH, tl_env.CUTLASS_INCLUDE_DIR], lineinfo, _extra_flags(configs))
    cubin = compile_cubin(nvcc, art.kernel_source, flags, job.where)
    t2 = time.perf_counter()
    from tilebin.runtime._manifest import to_plain

    variant = {
        "key": job.key,
        **({"specialised": [name for name, _ in job.specialised]} if job.specialised else {}),
        "sha256": hashlib.sha256(cubin).hexdigest(),
        "tensors": to_plain(facts.tensors), "scalars": to_plain(facts.scalars),
        "tma": to_plain(facts.tma), "launches": to_plain(facts.launches),
        "conditions": to_plain(facts.conditions),
    }
    return JobResult(job, variant, to_plain(facts.params), cubin, t1 - t0, t2 - t1)
