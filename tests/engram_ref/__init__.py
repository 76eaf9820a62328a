"""Torch references for the Engram family (test-only; never shipped): ``engram_ref.hash`` and
``engram_ref.gate``."""

from . import gate, hash  # noqa: F401
