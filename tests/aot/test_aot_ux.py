"""The AOT CLI without TileLang, its one-line errors naming file:line, and its [n/N] progress lines.

None of these needs TileLang: they prove `tilebin.aot` imports it only when it builds.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

from tilebin.aot import AotError
from tilebin.aot.__main__ import error_line
from tilebin.aot._build import _Progress, enumerate_jobs
from tilebin.aot._lower import Job, JobResult, decl_site

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Runs `python -m tilebin.aot ARGS` (the checkout's) in a Python where `import tilelang` fails.
_NO_TILELANG = textwrap.dedent("""
    import runpy, sys
    sys.path.insert(0, {root!r})
    sys.modules["tilelang"] = None  # import tilelang -> ImportError, as in an install without the extra
    sys.argv = ["python -m tilebin.aot", *{args!r}]
    runpy.run_module("tilebin.aot", run_name="__main__")
""")


def _run_without_tilelang(*args: str) -> subprocess.CompletedProcess:
    code = _NO_TILELANG.format(root=str(ROOT), args=list(args))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")


def test_help_works_without_tilelang():
    res = _run_without_tilelang("--help")
    assert res.returncode == 0, res.stderr
    assert "build" in res.stdout and "Traceback" not in res.stderr
    assert 'pip install "tilebin[aot]"' in " ".join(res.stdout.split())  # says how to get TileLang
    res = _run_without_tilelang("build", "--help")
    assert res.returncode == 0 and "--allow-tilelang-mismatch" in res.stdout, res.stderr


def test_build_without_tilelang_says_how_to_install_it(tmp_path):
    res = _run_without_tilelang("build", "--out", str(tmp_path / "out"))
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("tilebin.aot: error: ")
    assert 'pip install "tilebin[aot]"' in lines[0]
    assert not (tmp_path / "out").exists()


def test_importing_tilebin_aot_imports_no_tilelang():
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import tilebin.aot, tilebin.aot.__main__; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tilelang', 'tvm')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def _module(tmp_path, monkeypatch, name: str, source: str) -> pathlib.Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def test_syntax_error_in_a_kernel_file_is_one_error_naming_file_and_line(tmp_path, monkeypatch):
    path = _module(tmp_path, monkeypatch, "broken_syntax_kernels", "KERNELS = ()\n\ndef f(:\n    pass\n")
    with pytest.raises(AotError) as info:
        enumerate_jobs(["broken_syntax_kernels"])
    line = error_line(info.value)
    assert f"{path}:3:" in line and "syntax error" in line
    assert "\n" not in line


def test_exception_while_importing_a_kernel_file_names_file_and_line(tmp_path, monkeypatch):
    path = _module(tmp_path, monkeypatch, "raising_kernels", "X = 1\nraise ValueError('bad grid')\n")
    with pytest.raises(AotError, match="ValueError: bad grid") as info:
        enumerate_jobs(["raising_kernels"])
    assert str(info.value).startswith(f"{path}:2:")


def test_error_line_is_one_line_even_for_a_long_cause():
    exc = AotError("kernel k: lowering failed: TVMError:\n" + "generated code\n" * 500 + "Check failed: x")
    line = error_line(exc)
    assert line.startswith("tilebin.aot: error: kernel k: lowering failed")
    assert "\n" not in line and line.endswith("Check failed: x (500 lines omitted)")


def test_decl_site_names_the_factory_file_and_line():
    def factory(n):
        return n

    decl = type("Decl", (), {"factory": staticmethod(factory)})()
    assert decl_site(decl, "m") == f"{__file__}:{factory.__code__.co_firstlineno}"
    assert decl_site(object(), __name__) == sys.modules[__name__].__file__


def test_progress_lines_count_and_estimate():
    now = [100.0]
    lines: list[str] = []
    progress = _Progress(4, lines.append, clock=lambda: now[0])
    job = Job("m", "k", 0, (("n", 1),))
    res = JobResult(job, {}, [], b"x" * 10, 1.0, 2.0)
    for t in (110.0, 120.0, 130.0, 140.0):
        now[0] = t
        assert progress.done(res) is res
    assert lines[0].startswith("  [1/4] built kernel k variant {'n': 1}")
    assert "elapsed 10s, ETA 30s" in lines[0]
    assert "[2/4]" in lines[1] and "elapsed 20s, ETA 20s" in lines[1]
    assert "[4/4]" in lines[3] and "ETA 0s" in lines[3]


def test_progress_clock_shows_minutes():
    lines: list[str] = []
    now = [0.0]
    progress = _Progress(2, lines.append, clock=lambda: now[0])
    now[0] = 65.0
    progress.done(JobResult(Job("m", "k", 0, ()), {}, [], b"", 0.0, 0.0))
    assert "elapsed 1m05s, ETA 1m05s" in lines[0]


def test_a_failing_kernel_names_its_declaration_file_and_line(tmp_path, monkeypatch):
    pytest.importorskip("tilelang")
    from tilebin.aot._lower import lower_job

    path = _module(tmp_path, monkeypatch, "failing_factory_kernels", """
        from types import SimpleNamespace

        def broken(n):
            raise ValueError("tile size must divide n")

        KERNELS = (SimpleNamespace(name="toy.broken", factory=broken, pass_configs={}),)
    """)
    with pytest.raises(AotError) as info:
        lower_job(Job("failing_factory_kernels", "toy.broken", 0, (("n", 3),)), None, False)
    line = error_line(info.value)
    assert line.startswith(f"tilebin.aot: error: {path}:4: kernel toy.broken variant {{'n': 3}}: lowering failed")
    assert line.endswith("ValueError: tile size must divide n")
