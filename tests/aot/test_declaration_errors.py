"""Every declaration or import mistake in a kernel module comes out of `python -m tilebin.aot build`
as one `tilebin.aot: error: <module>: ...` line and exit status 1, never a traceback; the build checks
the TileLang release up front (issue 14, items 6 and 7)."""

from __future__ import annotations

import itertools
import pathlib
import re
import sys
import textwrap

import pytest

pytest.importorskip("tilelang")

from tilebin.aot import AotError  # noqa: E402
from tilebin.aot import _build  # noqa: E402
from tilebin.aot.__main__ import main  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
_names = itertools.count()

HEAD = "from tilebin.kernels import KernelDecl\n\ndef f(n=1):\n    return n\n\n"
# (source after HEAD, what the error line must say); the error must also name the module
MISTAKES = {
    "bad name": ('KERNELS = (KernelDecl("Transpose", f, ({},)),)\n', "must look like 'family.op'"),
    "non-scalar variant value": ('KERNELS = (KernelDecl("a.b", f, ({"n": [1, 2]},)),)\n', "bool/int/float/str"),
    "empty grid": ('KERNELS = (KernelDecl("a.b", f, ()),)\n', "the variant grid is empty"),
    "grid is one dict": ('KERNELS = (KernelDecl("a.b", f, {"n": 1}),)\n', "grid must be a tuple of variant dicts"),
    "duplicate variant": ('KERNELS = (KernelDecl("a.b", f, ({"n": 1}, {"n": 1})),)\n', "same variant twice ({'n': 1})"),
    "factory not callable": ('KERNELS = (KernelDecl("a.b", 42, ({},)),)\n', "factory must be callable (got int)"),
    "jit as factory": ('import tilelang\njf = tilelang.jit(f)\nKERNELS = (KernelDecl("a.b", jf, ({},)),)\n',
                       "KernelDecl.from_jit('a.b', jit_fn, grid=...)"),
    "jit in KERNELS": ('import tilelang\nKERNELS = (tilelang.jit(f),)\n',
                       "KERNELS[0] is a @tilelang.jit kernel, not a KernelDecl; declare it with KernelDecl.from_jit"),
    "KERNELS missing": ("X = 1\n", "declares no kernels (KERNELS is missing or empty)"),
    "KERNELS is one decl": ('KERNELS = KernelDecl("a.b", f, ({},))\n', "KERNELS must be a list or tuple of KernelDecl"),
    "KERNELS holds a function": ("KERNELS = (f,)\n", "KERNELS[0] is a function, not a KernelDecl"),
    "duck-typed decl with a bad grid": ('import types\nKERNELS = (types.SimpleNamespace(name="a.b", factory=f, grid=()),)\n',
                                        "KERNELS[0]: a.b: the variant grid is empty"),
    "same name twice": ('KERNELS = (KernelDecl("a.b", f, ({},)), KernelDecl("a.b", f, ({"n": 2},)))\n',
                        "kernel 'a.b' is declared twice in its KERNELS"),
    "bad meta": ('KERNELS = (KernelDecl("a.b", f, ({},), meta={"m": {"x": 1}}),)\n', "meta values must be"),
    "bad outputs": ('KERNELS = (KernelDecl("a.b", f, ({},), outputs=(1.5,)),)\n', "outputs names tensor parameters"),
}


def _module(tmp_path, monkeypatch, source: str, name: str | None = None) -> tuple[str, pathlib.Path]:
    name = name or f"decl_error_kernels_{next(_names)}"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, path


def _cli(capsys, *args: str) -> tuple[int, list[str]]:
    """`python -m tilebin.aot ARGS` in this process: its status and its stderr lines.  An exception
    escaping main() (a traceback) fails the test."""
    status = main(list(args))
    err = capsys.readouterr().err.strip().splitlines()
    return status, err


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_declaration_mistake_is_one_error_line(tmp_path, monkeypatch, capsys, mistake):
    source, says = MISTAKES[mistake]
    name, path = _module(tmp_path, monkeypatch, HEAD + source)
    status, err = _cli(capsys, "build", "--out", str(tmp_path / "out"), name)
    assert status == 1
    assert len(err) == 1, err
    assert err[0].startswith(f"tilebin.aot: error: {name}: "), err[0]
    assert says in err[0], err[0]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_declaration_error_names_the_users_line_not_tilebins(tmp_path, monkeypatch, capsys):
    name, path = _module(tmp_path, monkeypatch, HEAD + 'KERNELS = (\n    KernelDecl("Bad", f, ({},)),\n)\n')
    status, err = _cli(capsys, "build", "--out", str(tmp_path / "out"), name)
    assert status == 1 and f"{name}: {path}:7: kernel name must look like" in err[0]


def test_a_name_declared_by_two_modules_names_both(tmp_path, monkeypatch, capsys):
    one, _ = _module(tmp_path, monkeypatch, HEAD + 'KERNELS = (KernelDecl("a.b", f, ({},)),)\n')
    two, _ = _module(tmp_path, monkeypatch, HEAD + 'KERNELS = (KernelDecl("a.b", f, ({},)),)\n')
    status, err = _cli(capsys, "build", "--out", str(tmp_path / "out"), one, two)
    assert status == 1 and len(err) == 1
    assert f"tilebin.aot: error: {two}: kernel 'a.b' is declared by both {one} and {two}" in err[0]


def test_a_module_not_found_asks_about_sys_path(tmp_path, capsys):
    status, err = _cli(capsys, "build", "--out", str(tmp_path / "out"), "no_such_pkg_h14.kernels")
    assert status == 1 and len(err) == 1
    assert "cannot import kernel module 'no_such_pkg_h14.kernels'" in err[0] and "is it on sys.path" in err[0]


def test_a_found_module_whose_import_fails_names_the_import_and_its_line(tmp_path, monkeypatch, capsys):
    helper = tmp_path / "decl_error_helper.py"
    helper.write_text('"""Imports something absent."""\nimport os\nimport not_installed_dep_h14.sub\n')
    name, path = _module(tmp_path, monkeypatch, "import decl_error_helper\nKERNELS = ()\n")
    status, err = _cli(capsys, "build", "--out", str(tmp_path / "out"), name)
    assert status == 1 and len(err) == 1
    assert err[0].startswith(f"tilebin.aot: error: {name}: {helper}:3: kernel module {name} was found"), err[0]
    assert "'not_installed_dep_h14'" in err[0]
    assert "is it on sys.path" not in err[0]


def test_a_kernel_module_without_tilelang_names_the_install(tmp_path, monkeypatch):
    name, path = _module(tmp_path, monkeypatch, "import os\nimport tilelang.language as T\nKERNELS = ()\n")
    monkeypatch.setitem(sys.modules, "tilelang", None)  # as in an install without the extra
    monkeypatch.delitem(sys.modules, "tilelang.language", raising=False)
    with pytest.raises(AotError) as info:
        _build.enumerate_jobs([name])
    assert str(info.value).startswith(f"{name}: {path}:2: ")
    assert 'pip install "tilebin[aot]"' in str(info.value)


def test_a_syntax_error_in_an_imported_helper_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    helper = tmp_path / "decl_error_broken_helper.py"
    helper.write_text("X = 1\nY = (\n")
    name, _ = _module(tmp_path, monkeypatch, "import decl_error_broken_helper\nKERNELS = ()\n")
    status, err = _cli(capsys, "build", "--out", str(tmp_path / "out"), name)
    assert status == 1 and len(err) == 1
    assert re.match(rf"tilebin\.aot: error: {re.escape(str(helper))}:\d: syntax error while importing kernel "
                    rf"module {name}", err[0]), err[0]


# --- the TileLang release check (item 7)

def test_pinned_tilelang_is_the_release_the_aot_extra_pins():
    pyproject = (ROOT / "pyproject.toml").read_text()
    (extra,) = re.findall(r'^aot = \["tilelang==([^"]+)"\]', pyproject, re.M)
    assert extra == _build.PINNED_TILELANG
    assert f'"tilelang=={_build.PINNED_TILELANG}"' in (ROOT / "wheels" / "build.sh").read_text()


def test_another_tilelang_is_refused_naming_both_versions_and_the_fix(tmp_path, monkeypatch, capsys):
    import tilelang

    monkeypatch.setattr(tilelang, "__version__", "0.1.99")
    status, err = _cli(capsys, "build", "--out", str(tmp_path / "out"), "no_such_module_h14")
    assert status == 1 and len(err) == 1
    line = err[0]
    assert "TileLang 0.1.99 is installed" in line and f"TileLang {_build.PINNED_TILELANG}" in line
    assert f'pip install "tilelang=={_build.PINNED_TILELANG}"' in line and "--allow-tilelang-mismatch" in line
    # overridden: the build goes on (to the next error, here the module that does not exist)
    status, err = _cli(capsys, "build", "--allow-tilelang-mismatch", "--out", str(tmp_path / "out"), "no_such_module_h14")
    assert status == 1 and "cannot import kernel module 'no_such_module_h14'" in err[0]
    monkeypatch.setattr(tilelang, "__version__", f"{_build.PINNED_TILELANG}+cu128.local")  # a local build of the pin
    _build._require_tilelang()


def test_the_tilelang_version_is_a_build_fact():
    from tilebin.runtime._manifest import BuildInfo
    from tilebin.runtime._record import record_fields

    assert "tilelang" in record_fields(BuildInfo)  # build() writes tilelang.__version__


def test_the_real_command_prints_one_line_and_exits_1(tmp_path):
    """The same through `python -m tilebin.aot build` in a fresh process (what CI runs)."""
    import os
    import subprocess

    (tmp_path / "bad_name_kernels.py").write_text(HEAD + 'KERNELS = (KernelDecl("Bad", f, ({},)),)\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    res = subprocess.run([sys.executable, "-m", "tilebin.aot", "build", "--out", str(tmp_path / "out"), "bad_name_kernels"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"tilebin.aot: error: bad_name_kernels: {tmp_path / 'bad_name_kernels.py'}:6: kernel name must look like "
        f"'family.op' in lower case (got 'Bad')"]
