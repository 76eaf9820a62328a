"""Toy ``@tilelang.jit`` kernels declared with KernelDecl.from_jit: a lazy-style one (returns its
PrimFunc) with a config-object argument, the jit's pass configs and compile flags, and its out_idx
as the output; an eager-style one (tensor annotations, no return)."""

from dataclasses import dataclass

import tilelang
import tilelang.language as T
from tilebin.kernels import KernelDecl


@dataclass(frozen=True)
class ScaleConfig:
    block: int = 128
    factor: float = 2.0


@tilelang.jit(out_idx=[-1], pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True},
              compile_flags=["-DTILEBIN_TOY_FLAG=1"])
def jit_scale(dtype: str, cfg: ScaleConfig):
    N = T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((N,), dtype), Y: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, cfg.block), threads=cfg.block) as bx:
            for i in T.Parallel(cfg.block):
                if bx * cfg.block + i < N:
                    Y[bx * cfg.block + i] = X[bx * cfg.block + i] * cfg.factor
    return main


@tilelang.jit
def jit_add_one(X, Y, block: int = 128):
    N = T.dynamic("n")
    X: T.Tensor[[N], T.float32]
    Y: T.Tensor[[N], T.float32]
    with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
        for i in T.Parallel(block):
            if bx * block + i < N:
                Y[bx * block + i] = X[bx * block + i] + 1.0


KERNELS = (
    KernelDecl.from_jit("toy.jit_scale", jit_scale, grid=(
        {"dtype": "float32", "cfg": ScaleConfig()},
        {"dtype": "float16", "cfg": ScaleConfig(block=64, factor=0.5)},
    ), doc="Y = X * cfg.factor", meta={"blocks": (128, 64)}),
    KernelDecl.from_jit("toy.jit_add_one", jit_add_one, grid=({"block": 256},), outputs=("Y",)),
)
