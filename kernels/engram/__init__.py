"""Engram kernels (``tilebin.ops.engram``): n-gram hash, fused weight, gate forward/backward, grad-w reduce."""
