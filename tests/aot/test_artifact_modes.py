"""Artifacts are written world-readable whatever the umask: files 0644, folders 0755 (mkstemp and
mkdtemp alone make them 0600 / 0700, which broke installs that copy them as they are)."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from tilebin.aot import _build, _cache
from tilebin.aot._lower import Job, JobResult


@pytest.fixture
def strict_umask():
    old = os.umask(0o077)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_manifest_and_cubins_are_0644_in_0755_folders(tmp_path, strict_umask):
    out = tmp_path / "new" / "artifacts"
    manifest = SimpleNamespace(to_json=lambda: "{}\n")
    _build._write_outputs(out, [SimpleNamespace(cubin=b"cubin bytes")], manifest)
    (cubin,) = (out / "cubins").iterdir()
    assert _mode(out / "manifest.json") == 0o644 and _mode(cubin) == 0o644
    assert _mode(out / "cubins") == 0o755 and _mode(out) == 0o755 and _mode(tmp_path / "new") == 0o755


def test_an_existing_out_folder_keeps_its_mode(tmp_path, strict_umask):
    out = tmp_path / "mine"
    out.mkdir()
    out.chmod(0o750)
    _build._write_outputs(out, [], SimpleNamespace(to_json=lambda: "{}\n"))
    assert _mode(out) == 0o750 and _mode(out / "manifest.json") == 0o644


def test_cache_entries_are_readable_folders(tmp_path):
    result = JobResult(Job("m", "k", 0, ()), {"sha256": "x"}, [], b"c", 0.0, 0.0)
    _cache.store(tmp_path, "ab" + "0" * 62, result)
    assert _mode(tmp_path / "ab" / ("ab" + "0" * 62)) == 0o755
