"""MoE gating and routing kernels (``tilebin.ops.moe``)."""
