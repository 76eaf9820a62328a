"""Torch references for the MoE family (test-only; never shipped): ``moe_ref.<group>``."""

from . import gating, routing, stats  # noqa: F401
