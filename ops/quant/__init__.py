"""``tilebin.ops.quant``: the quantization ops of ``tile_kernels.quant`` 1.0.0, same API."""
