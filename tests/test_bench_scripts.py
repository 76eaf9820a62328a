"""The benchmark scripts run only on a GPU, so a name they call but no longer define would show up
there first (bench_quant.py lost ``run_config`` and ``copy_gbps`` in 64f1eb0 and printed an error in
every row until 2026-12-03).  Here: every global name the functions of a bench script, or of a GPU
script in wheels/, read is defined in the script, imported by it, or a builtin."""

from __future__ import annotations

import builtins
import pathlib
import symtable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.glob("bench/*.py"), *ROOT.glob("wheels/*.py")])


def _undefined_globals(path: pathlib.Path) -> list[str]:
    source = path.read_text()
    top = symtable.symtable(source, str(path), "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()} | set(dir(builtins))
    defined |= {"__file__", "__name__", "__doc__", "__spec__", "__package__", "__loader__"}  # a module's own
    missing = []

    def visit(table: symtable.SymbolTable) -> None:
        for sym in table.get_symbols():
            if sym.is_referenced() and sym.is_global() and sym.get_name() not in defined:
                missing.append(f"{table.get_name()}: {sym.get_name()}")
        for child in table.get_children():
            visit(child)

    for child in top.get_children():
        visit(child)
    return missing


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_bench_script_names_resolve(path):
    missing = _undefined_globals(path)
    assert not missing, f"{path.name} reads names it never defines or imports: {missing}"


def test_the_check_finds_a_missing_name(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import math\n\ndef main():\n    return run_config(math.pi)\n")
    assert _undefined_globals(script) == ["main: run_config"]
