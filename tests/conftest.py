"""Tests import the checkout: put its root first on sys.path (``tilebin`` maps runtime/, aot/ and
kernels/ under its name itself when it finds itself in a checkout, see tilebin/__init__.py)."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# tests/ itself: shared test-only packages (``quant_ref``, the torch references) import by name
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(1, str(ROOT / "tests"))


# --- Packaging (tests/test_wheel_*.py): the wheel that ./wheels/build.sh left in wheels/dist/.
import os as _os

import pytest as _pytest


@_pytest.fixture(scope="session")
def built_wheel() -> pathlib.Path:
    """The newest wheels/dist/tilebin-*.whl.  Without one: skip locally, fail under CI (env CI set)."""
    wheels = sorted((ROOT / "wheels" / "dist").glob("tilebin-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        reason = "no wheel built: run ./wheels/build.sh"
        if _os.environ.get("CI"):
            _pytest.fail(f"{reason} (CI is set: .ci/run builds it before testing)")
        _pytest.skip(reason)
    return wheels[-1]
