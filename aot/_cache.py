"""The incremental build cache: one entry per job, keyed by everything that changes its bytes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile
from functools import lru_cache
from typing import Any

from ._lower import Job, JobResult

_AOT_DIR = pathlib.Path(__file__).resolve().parent
_MANIFEST_PY = _AOT_DIR.parent / "runtime" / "_manifest.py"


def _tree_digest(root: pathlib.Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def source_digest(module: str) -> str:
    """Digest of the module's whole top-level package source (helpers it imports included)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module)
    root = pathlib.Path(spec.origin).resolve().parent
    while (root.parent / "__init__.py").exists():
        root = root.parent
    return _tree_digest(root)


@lru_cache(maxsize=None)
def _builder_digest() -> str:
    """This build tool's own code and the manifest schema it writes (read once per process)."""
    schema = _MANIFEST_PY.read_bytes() if _MANIFEST_PY.exists() else b""
    return hashlib.sha256(_tree_digest(_AOT_DIR).encode() + schema).hexdigest()


def job_key(job: Job, source: str, tool_facts: dict[str, Any]) -> str:
    payload = {
        "job": [job.module, job.kernel, sorted(job.variant)],
        "source": source,
        "tools": tool_facts,
        "builder": _builder_digest(),
        "python": sys.version_info[:2],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def load(cache_dir: pathlib.Path, key: str, job: Job) -> JobResult | None:
    entry = cache_dir / key[:2] / key
    try:
        meta = json.loads((entry / "result.json").read_text())
        cubin = (entry / "kernel.cubin").read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(cubin).hexdigest() != meta["variant"]["sha256"]:
        return None  # a damaged entry is rebuilt, never trusted
    return JobResult(job, meta["variant"], meta["params"], cubin, 0.0, 0.0)


def store(cache_dir: pathlib.Path, key: str, result: JobResult) -> None:
    """Write the entry into a temp dir and rename it into place (atomic for readers)."""
    entry = cache_dir / key[:2] / key
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
    (tmp / "kernel.cubin").write_bytes(result.cubin)
    (tmp / "result.json").write_text(json.dumps({"variant": result.variant, "params": result.params}, sort_keys=True))
    try:
        os.replace(tmp, entry)
    except OSError:  # another build stored the same entry first
        shutil.rmtree(tmp, ignore_errors=True)
