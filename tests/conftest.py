"""Tests import the checkout: put its root first on sys.path (``tilebin`` maps runtime/, aot/ and
kernels/ under its name itself when it finds itself in a checkout, see tilebin/__init__.py)."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
