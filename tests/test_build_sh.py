"""wheels/build.sh keeps the last good wheel until a new one is built and verified.

Runs build.sh's own main() (sourced, so nothing builds) against a fake venv whose `python`
plays pip wheel and verify_wheel.py: no CMake, no TileLang, well under a second per case.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
WHEEL = "tilebin-0.1.0-cp310-abi3-manylinux_2_28_x86_64.whl"
# `python -m pip wheel ... --wheel-dir DIR` writes $FAKE_WHEELS wheels (content "new") into DIR,
# then exits $FAKE_BUILD_RC; `python .../verify_wheel.py WHEEL` exits $FAKE_VERIFY_RC.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$* [TILEBIN_NVCC=${TILEBIN_NVCC-unset}]" >>"$FAKE_LOG"
if [[ "$1 $2 $3" == "-m pip wheel" ]]; then
  while [[ $# -gt 0 && "$1" != --wheel-dir ]]; do shift; done
  for i in $(seq 1 "$FAKE_WHEELS"); do echo new >"$2/tilebin-0.1.$i-cp310-abi3-manylinux_2_28_x86_64.whl"; done
  [[ "$FAKE_WHEELS" == 1 ]] && mv "$2"/tilebin-*.whl "$2/%s"
  exit "$FAKE_BUILD_RC"
fi
[[ "$1" == */verify_wheel.py ]] && exit "$FAKE_VERIFY_RC"
exit 99
""" % WHEEL


@pytest.fixture
def run_build(tmp_path):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(FAKE_PYTHON)
    (venv / "python").chmod(0o755)
    dist = tmp_path / "dist"

    def run(build_rc=0, verify_rc=0, wheels=1, previous=True, args=""):
        if previous:
            dist.mkdir(exist_ok=True)
            (dist / WHEEL).write_text("old")
        script = (f'source {ROOT}/wheels/build.sh; ROOT={tmp_path}; DIST={dist}; VENV={tmp_path}/venv; '
                  f'ensure_venv() {{ :; }}; unset TILEBIN_NVCC; main {args}')
        env = {**os.environ, "FAKE_LOG": str(tmp_path / "log"), "FAKE_BUILD_RC": str(build_rc),
               "FAKE_VERIFY_RC": str(verify_rc), "FAKE_WHEELS": str(wheels)}
        res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
        staging = list((tmp_path / "build").glob("dist-staging.*"))
        assert not staging, f"staging folders left behind: {staging}"
        log = (tmp_path / "log").read_text() if (tmp_path / "log").exists() else ""
        return res, sorted(p.name for p in dist.glob("*.whl")), log

    run.dist = dist
    return run


def test_a_verified_wheel_replaces_the_previous_one(run_build):
    res, wheels, log = run_build()
    assert res.returncode == 0, res.stdout + res.stderr
    assert wheels == [WHEEL] and (run_build.dist / WHEEL).read_text() == "new\n"
    build_line, verify_line = log.splitlines()
    assert "--wheel-dir" in build_line and str(run_build.dist) not in build_line  # built elsewhere first
    assert "verify_wheel.py" in verify_line and "dist-staging" in verify_line  # verified before the move


def test_a_published_wheel_names_its_source(run_build):
    res, wheels, _ = run_build()
    assert res.returncode == 0, res.stdout + res.stderr
    line = (run_build.dist / "BUILD_SOURCE").read_text()
    assert line.startswith(f"{WHEEL} built ") and " from " in line and " sha256 " in line, line
    res, _, _ = run_build(build_rc=1, previous=False)  # a failed build leaves the wheel and its line
    assert res.returncode == 1 and (run_build.dist / "BUILD_SOURCE").read_text() == line


def test_a_failed_build_keeps_the_previous_wheel(run_build):
    res, wheels, log = run_build(build_rc=1)
    assert res.returncode == 1
    assert wheels == [WHEEL] and (run_build.dist / WHEEL).read_text() == "old"
    assert "keeps the previous wheel" in res.stdout
    assert "verify_wheel.py" not in log


def test_a_wheel_that_fails_verification_keeps_the_previous_one(run_build):
    res, wheels, _ = run_build(verify_rc=1)
    assert res.returncode == 1
    assert (run_build.dist / WHEEL).read_text() == "old"
    assert "failed verification" in res.stdout


@pytest.mark.parametrize("count", [0, 2])
def test_not_exactly_one_wheel_is_refused(run_build, count):
    res, wheels, log = run_build(wheels=count)
    assert res.returncode == 1
    assert wheels == [WHEEL] and (run_build.dist / WHEEL).read_text() == "old"
    assert f"left {count} wheel(s)" in res.stdout


def test_first_build_creates_dist(run_build):
    res, wheels, _ = run_build(previous=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert wheels == [WHEEL]


def test_nvcc_option_sets_tilebin_nvcc_for_the_aot_step(run_build):
    """--nvcc PATH (the system-nvcc option) reaches the build as $TILEBIN_NVCC, not as a pip argument;
    other arguments pass through to pip wheel."""
    res, _, log = run_build(args="-C cmake.define.X=1 --nvcc /opt/cuda/bin/nvcc")
    assert res.returncode == 0, res.stdout + res.stderr
    build_line = log.splitlines()[0]
    assert "-C cmake.define.X=1" in build_line and "--nvcc" not in build_line.split(" [")[0]
    assert build_line.endswith("[TILEBIN_NVCC=/opt/cuda/bin/nvcc]")
    _, _, log = run_build()
    last_build = [ln for ln in log.splitlines() if "pip wheel" in ln][-1]  # the log accumulates
    assert last_build.endswith("[TILEBIN_NVCC=unset]")  # default: the pip toolchain
