""".ci/run's Python matrix: which interpreter it picks for each CPython, and that a missing one
fails before the build with a message saying how to install it.  (.ci/run is sourced: nothing builds.)"""

from __future__ import annotations

import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _ci(script: str, pyenv_root: pathlib.Path, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYENV_ROOT": str(pyenv_root), "PATH": path}
    return subprocess.run(["bash", "-c", f"source {ROOT}/.ci/run; {script}"], capture_output=True, text=True,
                          env=env, timeout=60)


def _fake_pyenv(root: pathlib.Path, *versions: str) -> None:
    for v in versions:
        exe = root / "versions" / v / "bin" / "python"
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\necho fake\n")
        exe.chmod(0o755)


def test_newest_final_patch_release_is_picked(tmp_path):
    _fake_pyenv(tmp_path, "3.10.9", "3.10.13", "3.10.2", "3.13.0", "3.13-dev", "3.13.1t", "3.1.5")
    res = _ci("find_python 3.10; find_python 3.13; find_python 3.1", tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [str(tmp_path / "versions" / v / "bin" / "python")
                                  for v in ("3.10.13", "3.13.0", "3.1.5")]


def test_missing_python_fails_naming_it_and_the_fix(tmp_path):
    _fake_pyenv(tmp_path, "3.11.7")
    res = _ci("find_python 3.12", tmp_path)
    assert res.returncode == 1 and not res.stdout
    assert "no CPython 3.12" in res.stderr and "pyenv install 3.12" in res.stderr


def test_python_on_path_is_the_fallback(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3.12").write_text("#!/bin/sh\n")
    (bindir / "python3.12").chmod(0o755)
    res = _ci("find_python 3.12", tmp_path / "no-pyenv", path=f"{bindir}:/usr/bin:/bin")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(bindir / "python3.12")


def test_default_matrix_is_every_supported_python():
    res = subprocess.run(["bash", "-c", f"unset CI_PYTHONS; source {ROOT}/.ci/run; echo $CI_PYTHONS"],
                         capture_output=True, text=True, timeout=60)
    assert res.stdout.split() == ["3.10", "3.11", "3.12", "3.13"]


def test_ci_checks_every_python_before_building():
    """main() looks every interpreter up before ./wheels/build.sh: a missing one costs seconds, not a build."""
    text = (ROOT / ".ci" / "run").read_text()
    main = text[text.index("main() {"):]
    assert main.index("find_python") < main.index("./wheels/build.sh") < main.index("wheel_matrix")
