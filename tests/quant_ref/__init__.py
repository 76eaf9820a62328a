"""Torch references for the quantization family (test-only; never shipped)."""
