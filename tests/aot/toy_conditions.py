"""A toy kernel with a T.assume, declared conditions and an optional tensor (tests/aot/test_conditions_build.py)."""

import tilelang.language as T
from tilebin.kernels import KernelDecl


def add_bias(block=64, limit=4096):
    N = T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), bias: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32"),
             use_bias: T.int32):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            T.assume(N % block == 0)
            for i in T.Parallel(block):
                if use_bias != 0:
                    Y[bx * block + i] = X[bx * block + i] + bias[bx * block + i]
                else:
                    Y[bx * block + i] = X[bx * block + i]
    return main


KERNELS = (
    KernelDecl("toy.add_bias", add_bias, ({"block": 64, "limit": 1024}, {"block": 32, "limit": 4096}),
               outputs=("Y",), optional=("bias",), conditions=("n <= limit", "use_bias == 0 or use_bias == 1"),
               doc="Y = X (+ bias when use_bias)"),
)
