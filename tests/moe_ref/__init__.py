"""Torch references for the MoE family (test-only; never shipped): ``moe_ref.<group>``."""

from . import routing, stats  # noqa: F401
