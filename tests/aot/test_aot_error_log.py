"""A lowering error through `python -m tilebin.aot build`: TileLang's generated-code dump goes to
<out>/aot-errors.log, and the console shows one error line naming file:line and that log."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tilebin.aot.__main__ import error_line
from tilebin.aot._build import ERROR_LOG, BuildOptions

ROOT = pathlib.Path(__file__).resolve().parents[2]

# A fragment (128, 3) copied from shared (128, 7): TileLang refuses it while building the prim_func
# and logs the whole generated builder source (tens of lines, one per statement below) first.
BROKEN = '''
import tilelang.language as T
from tilebin.kernels import KernelDecl


def bad_copy(block=128, pad=0):
    N = T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            s = T.alloc_shared((block, 7), "float32")
            f = T.alloc_fragment((block, 3), "float32")
{filler}
            T.copy(s, f)
            for i in T.Parallel(block):
                Y[bx * block + i] = f[i, 0]
    return main


KERNELS = (KernelDecl("toy.bad_copy", bad_copy, ({{"pad": 0}}, {{"pad": 1}}), outputs=("Y",)),)
'''
FILLER = "\n".join(f"            T.fill(f, {k}.0)" for k in range(40))


@pytest.fixture(scope="module")
def failed_build(tmp_path_factory):
    pytest.importorskip("tilelang")
    tmp = tmp_path_factory.mktemp("broken")
    (tmp / "broken_toy_kernels.py").write_text(BROKEN.format(filler=FILLER))
    out = tmp / "out"
    out.mkdir()
    (out / ERROR_LOG).write_text("stale log of an older build\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "tilebin.aot", "build", "--out", str(out), "--jobs", "2",
                          "broken_toy_kernels"], capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
    return tmp, out, res


def test_console_is_short_and_names_file_line_and_log(failed_build):
    tmp, out, res = failed_build
    assert res.returncode == 1, res.stdout + res.stderr
    console = (res.stdout + res.stderr).strip().splitlines()
    assert len(console) < 40, "\n".join(console)
    assert "make_closure" not in res.stdout + res.stderr  # the generated-code dump stayed off the console
    errors = [ln for ln in console if ln.startswith("tilebin.aot: error: ")]
    assert len(errors) == 1, console
    assert f"{tmp / 'broken_toy_kernels.py'}:6: kernel toy.bad_copy variant" in errors[0]
    assert "lowering failed" in errors[0]
    assert str(out / ERROR_LOG) in errors[0]


def test_log_holds_the_generated_code_and_the_traceback(failed_build):
    tmp, out, res = failed_build
    log = (out / ERROR_LOG).read_text()
    assert "stale log" not in log  # a build starts a fresh log
    assert "===== " + str(tmp / "broken_toy_kernels.py") + ":6: kernel toy.bad_copy" in log
    assert "make_closure" in log and "T).fill" in log  # TileLang's dump of the generated builder code
    assert "--- traceback ---" in log and "Traceback (most recent call last)" in log
    assert len(log.splitlines()) > 60


def test_error_line_without_log_path_names_no_log():
    from tilebin.aot import AotError

    exc = AotError("k: lowering failed")
    assert error_line(exc) == "tilebin.aot: error: k: lowering failed"
    exc.log_path = "/x/aot-errors.log"
    assert error_line(exc).endswith("k: lowering failed [TileLang output and traceback: /x/aot-errors.log]")


def test_the_log_lives_in_the_out_dir(tmp_path):
    assert BuildOptions(out_dir=tmp_path).error_log == tmp_path / "aot-errors.log"
