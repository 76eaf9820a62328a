"""Tiny kernels the AOT tests build: a dynamic-shape transpose and a TMA copy with >48 KB smem."""

import tilelang.language as T
from tilebin.kernels import KernelDecl

def transpose(dtype, bm=64, bn=64, threads=256):
    B = T.dynamic("batch"); M = T.dynamic("rows"); N = T.dynamic("cols")
    @T.prim_func
    def main(X: T.Tensor((B, M, N), dtype), Y: T.Tensor((B, N, M), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), B, threads=threads) as (bx, by, bz):
            tile = T.alloc_shared((bm, bn), dtype)
            T.copy(X[bz, by*bm:(by+1)*bm, bx*bn:(bx+1)*bn], tile)
            for i, j in T.Parallel(bn, bm):
                Y[bz, bx*bn + i, by*bm + j] = tile[j, i]
    return main

def tma_copy(dtype, bm=128, bn=128):
    M = T.dynamic("m"); N = 4096
    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype), alpha: T.float32):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            s = T.alloc_shared((bm, bn), dtype)
            s2 = T.alloc_shared((bm, bn), dtype)
            T.copy(X[by*bm, bx*bn], s)
            for i, j in T.Parallel(bm, bn):
                s2[i, j] = s[i, j] * alpha
            T.copy(s2, Y[by*bm, bx*bn])
    return main

KERNELS = (
    KernelDecl("toy.transpose", transpose, ({"dtype": "bfloat16"}, {"dtype": "float32"}), outputs=("Y",)),
    KernelDecl("toy.tma_copy", tma_copy, ({"dtype": "float32"},), outputs=("Y",)),
)


def cluster_scale(block=128):
    N = T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block), threads=block, cluster_dims=(2, 1, 1)) as bx:
            for i in T.Parallel(block):
                if bx * block + i < N:
                    Y[bx * block + i] = X[bx * block + i] * 2.0
    return main


CLUSTER_KERNELS = (KernelDecl("toy.cluster_scale", cluster_scale, ({},), outputs=("Y",)),)
