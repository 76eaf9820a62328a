"""Quantization kernels: FP8 e4m3, FP4 e2m1 and E5M6 casts with per-token, per-block and
per-channel scale factors, their SwiGLU fusions and the casts back (``tilebin.ops.quant``)."""
