"""GPU tests of ``tilebin.ops.transpose`` at the shapes where ``transpose.batched_transpose``'s
tiling matters, bit for bit against torch on random bit patterns, with poisoned outputs.

The shapes aim at partial tiles of aligned shapes (decode token counts against 7168 columns,
tile edges: vector loads and bulk stores of the valid bytes), grids small enough for the op to
pick the 2-warp ``small`` variants, the unaligned paths (odd sizes), and large ones.
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import poison_cache
from test_gpu_transpose_ops import KERNEL, _name, check, random_bits

DTYPES = (torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int16)
SHAPES_2D = [(1, 7168), (4, 7168), (16, 7168), (64, 7168), (128, 7168), (200, 7168), (7168, 64), (1, 1), (3, 17),
             (8, 24), (64, 64), (72, 136), (192, 256), (264, 520), (129, 257), (4001, 7168), (8192, 7168)]
SHAPES_3D = [(1, 64, 7168), (3, 40, 136), (2, 4096, 7168), (5, 17, 33), (8, 128, 128)]


@pytest.fixture()
def T(require):
    require(KERNEL)
    from tilebin.ops import transpose

    return transpose


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("shape", SHAPES_2D, ids=lambda s: "x".join(map(str, s)))
def test_transpose(T, rng, dtype, shape):
    x = random_bits(shape, dtype, rng.gen)
    poison_cache(2 * x.numel() * x.element_size())
    check(T.transpose(x), x, f"transpose {shape} {_name(dtype)} seed={rng.seed}")


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("shape", SHAPES_3D, ids=lambda s: "x".join(map(str, s)))
def test_batched_transpose(T, rng, dtype, shape):
    x = random_bits(shape, dtype, rng.gen)
    poison_cache(2 * x.numel() * x.element_size())
    check(T.batched_transpose(x), x, f"batched_transpose {shape} {_name(dtype)} seed={rng.seed}")


def test_under_a_cuda_graph(T, rng):
    x = random_bits((64, 7168), torch.bfloat16, rng.gen)
    T.transpose(x)  # warm: the module is loaded before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = T.transpose(x)
    x.copy_(random_bits(x.shape, x.dtype, rng.gen))
    captured.view(torch.uint8).fill_(0xFF)
    graph.replay()
    check(captured, x, "CUDA graph replay with new input values")
