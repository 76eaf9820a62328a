"""The TileLang kernels of this package and their prebuilt variants (``python -m tilebin.aot build``
reads ``KERNELS``).  TileLang is needed here, at build time only: the wheel ships the cubins."""

import tilelang
import tilelang.language as T

from tilebin.kernels import KernelDecl


def scale_rows(dtype, block_n=256, threads=128):
    """``y[m, :] = x[m, :] * alpha``, one block per (row, block of columns).  It reads 8 elements per
    thread with one vector access, so it assumes ``n % 8 == 0``: the build writes that condition into
    the manifest, and the runtime refuses (or routes elsewhere) a call that breaks it."""
    M, N = T.dynamic("m"), T.dynamic("n")

    @T.prim_func
    def main(x: T.Tensor((M, N), dtype), y: T.Tensor((M, N), dtype), alpha: T.float32):
        with T.Kernel(T.ceildiv(N, block_n), M, threads=threads) as (bx, by):
            T.assume(N % 8 == 0)
            for i in T.Parallel(block_n):
                col = bx * block_n + i
                if col < N:
                    y[by, col] = T.Cast(dtype, T.Cast("float32", x[by, col]) * alpha)
    return main


@tilelang.jit(out_idx=[-1])
def add_bias(block=128):
    """``y[m, :] = x[m, :] + bias`` when ``use_bias`` is 1, else ``y = x`` (``bias`` may be None then)."""
    M, N = T.dynamic("m"), T.dynamic("n")

    @T.prim_func
    def main(x: T.Tensor((M, N), "float32"), bias: T.Tensor((N,), "float32"), use_bias: T.int32,
             y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block), M, threads=block) as (bx, by):
            for i in T.Parallel(block):
                col = bx * block + i
                if col < N:
                    if use_bias != 0:
                        y[by, col] = x[by, col] + bias[col]
                    else:
                        y[by, col] = x[by, col]
    return main


KERNELS = [
    KernelDecl("my_kernels.scale_rows", scale_rows, ({"dtype": "float32"}, {"dtype": "bfloat16"}), outputs=("y",),
               doc="y = x * alpha, row-major 2-D, n % 8 == 0"),
    KernelDecl.from_jit("my_kernels.add_bias", add_bias, grid=({"block": 128},), optional=("bias",),
                        conditions=("use_bias == 0 or use_bias == 1",),
                        doc="y = x + bias (bias optional: None with use_bias=0)"),
]
