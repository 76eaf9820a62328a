"""Torch references for the MoE family (test-only; never shipped)."""
