"""GPU tests of the transpose speed candidate (issue 12): ``tilebin.ops.transpose`` launching the
shipped kernel and ``transpose._batched_transpose_candidate`` (what ``TILEBIN_CANDIDATE_TRANSPOSE=1``
picks at import), bit for bit against torch on random bit patterns, with poisoned outputs.

The shapes aim at what the candidate changes: partial tiles of aligned shapes (decode token
counts against 7168 columns, tile edges), grids small enough for the 2-warp tiles, and the
unaligned paths it keeps (odd sizes), plus large ones.
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import poison_cache
from test_gpu_transpose_ops import _name, check, random_bits

KERNELS = ("transpose.batched_transpose", "transpose._batched_transpose_candidate")
DTYPES = (torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int16)
SHAPES_2D = [(1, 7168), (4, 7168), (16, 7168), (64, 7168), (128, 7168), (200, 7168), (7168, 64), (1, 1), (3, 17),
             (8, 24), (64, 64), (72, 136), (192, 256), (264, 520), (129, 257), (4001, 7168), (8192, 7168)]
SHAPES_3D = [(1, 64, 7168), (3, 40, 136), (2, 4096, 7168), (5, 17, 33), (8, 128, 128)]


@pytest.fixture(params=KERNELS, ids=("current", "candidate"))
def T(request, require, monkeypatch):
    from tilebin.ops import transpose
    from tilebin.ops.transpose import _transpose

    require(request.param)
    monkeypatch.setattr(_transpose, "_KERNEL", request.param)
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
