"""``tilebin.ops.moe``: the MoE gating and routing ops of ``tile_kernels.moe`` 1.0.0, same API."""
