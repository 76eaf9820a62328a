"""A toy kernel with specialised sizes (tests/aot/test_specialise.py): each row of X [rows, k] scaled
by the sum of its first quarter; the quarter is an expression of k in S's shape."""

import tilelang.language as T
from tilebin.kernels import KernelDecl


def row_scale(dtype="float32"):
    R, K = T.dynamic("rows"), T.dynamic("k")

    @T.prim_func
    def main(X: T.Tensor((R, K), dtype), S: T.Tensor((R, K // 4), dtype), Y: T.Tensor((R, K), dtype)):
        with T.Kernel(T.ceildiv(R, 64), threads=64) as bx:
            row = bx * 64 + T.get_thread_binding()
            total = T.alloc_var(dtype)
            if row < R:
                total = T.cast(0, dtype)
                for j in T.serial(K // 4):
                    total = total + S[row, j]
                for j in T.serial(K):
                    Y[row, j] = X[row, j] * total
    return main


KERNELS = (
    KernelDecl("toy.row_scale", row_scale, ({"dtype": "float32"}, {"dtype": "float16"}), outputs=("Y",),
               specialise=({"k": 8}, {"k": 32})),
)
