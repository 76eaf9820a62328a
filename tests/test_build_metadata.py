"""The wheel's metadata as scikit-build-core writes it from pyproject.toml (no CMake, no AOT build):
license, supported Pythons, the `tilebin` console script and the `aot` extra's TileLang pin."""

from __future__ import annotations

import pathlib
import re
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
build = pytest.importorskip("scikit_build_core.build")


@pytest.fixture(scope="module")
def dist_info(tmp_path_factory) -> pathlib.Path:
    """prepare_metadata_for_build_wheel on a copy of the project's metadata inputs."""
    src = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md", "tilebin/__init__.py"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    # license-files requires LICENSE (a build without it fails); use the checkout's, or a stub until it lands
    (src / "LICENSE").write_text((ROOT / "LICENSE").read_text() if (ROOT / "LICENSE").is_file() else "MIT License\n")
    out = src / "out"
    out.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(src)
        name = build.prepare_metadata_for_build_wheel(str(out))
    return out / name


def test_license_is_an_spdx_expression_with_its_file(dist_info):
    meta = (dist_info / "METADATA").read_text()
    assert re.search(r"^License-Expression: MIT$", meta, re.M)
    assert re.search(r"^License-File: LICENSE$", meta, re.M)
    assert (dist_info / "licenses" / "LICENSE").is_file()
    assert "License :: " not in meta  # PEP 639: no license classifiers next to an expression


def test_classifiers_name_every_supported_python(dist_info):
    meta = (dist_info / "METADATA").read_text()
    pythons = re.findall(r"^Classifier: Programming Language :: Python :: (3\.\d+)$", meta, re.M)
    assert pythons == ["3.10", "3.11", "3.12", "3.13"]
    assert re.search(r"^Requires-Python: >=3\.10$", meta, re.M)


def test_console_script_points_at_the_cli(dist_info):
    entry = (dist_info / "entry_points.txt").read_text()
    assert re.search(r"^\[console_scripts\]\ntilebin = tilebin\.runtime\._cli:main$", entry, re.M)


def test_aot_extra_pins_the_tilelang_the_build_uses(dist_info):
    meta = (dist_info / "METADATA").read_text()
    extra = re.findall(r'^Requires-Dist: tilelang==(\S+); extra == "aot"$', meta, re.M)
    pinned = re.findall(r'"tilelang==([^"]+)"', (ROOT / "wheels" / "build.sh").read_text())
    assert extra and pinned and extra == pinned[:1], (extra, pinned)
    # the runtime itself still installs with cuda-bindings only
    hard = [r for r in re.findall(r"^Requires-Dist: (.+)$", meta, re.M) if "extra ==" not in r]
    assert hard == ["cuda-bindings<14,>=13.0"]
