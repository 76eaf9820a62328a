"""GPU tests of ``transpose.batched_transpose_direct`` (issue 12, shipped after the 15:24 UTC H200 run
of 2026-12-02) and ``transpose.batched_transpose_warps`` (shipped after the 02:27 UTC H200 run of
2026-12-03): each kernel launched directly on every shape, and ``tilebin.ops.transpose``'s default
path, which launches them for grids whose rows and cols are multiples of 16 bytes' worth of
elements (direct below 2 blocks per SM of the 8-warp tiles, warps from there on) and
``transpose.batched_transpose`` for everything else.

``transpose.transpose_direct`` and ``transpose.transpose_tiled`` (issue 10: the direct kernel and
``transpose.batched_transpose`` on 2-D x and out, which the op launches for a 2-D x without a view per
call) are tested the same way, every variant.

Every result is compared bit for bit with torch's ``x.t().contiguous()`` / ``x.transpose(1, 2)``
(on an integer view of the bits) and, for the op, with the shipped ``transpose.batched_transpose``
launched directly, on fresh random bit patterns (NaN payloads included) with the allocator's free
memory poisoned (0xFF) first, so an element never written shows.  Shapes: empty, 1 and odd rows
(the element paths), decode token counts against 7168 columns, tile edges, and the large benchmark
shapes (8192 x 7168, 8 x 4096 x 4096).  Which kernel the op picks is checked on the benchmark shapes.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import poison_cache
from test_gpu_transpose_ops import KERNEL, _name, check, random_bits

DIRECT = "transpose.batched_transpose_direct"
DIRECT_2D = "transpose.transpose_direct"  # the same kernel on 2-D x and out (the op's 2-D decode calls)
TILED_2D = "transpose.transpose_tiled"  # KERNEL on 2-D x and out (the op's 2-D calls of unaligned rows or cols)
WARPS = "transpose.batched_transpose_warps"
DTYPES = (torch.bfloat16, torch.float32, torch.float8_e4m3fn)
_VIEW = {1: torch.float8_e4m3fn, 2: torch.bfloat16, 4: torch.float32}
SHAPES_2D = [(0, 7168), (1, 7168), (1, 1), (3, 17), (4, 7168), (16, 7168), (17, 7168), (64, 7168), (128, 7168),
             (200, 7168), (7168, 64), (64, 64), (72, 136), (192, 256), (264, 520), (129, 257), (1000, 1001),
             (4001, 7168), (8192, 7168)]
SHAPES_3D = [(1, 64, 7168), (3, 40, 136), (5, 17, 33), (8, 128, 128), (2, 4096, 7168), (8, 4096, 4096),
             (3, 144, 272), (2, 4112, 208)]
_id = lambda s: "x".join(map(str, s))  # noqa: E731


def _launch_kernel(name: str, x: torch.Tensor, **key) -> torch.Tensor:
    """``name`` (compile-time key values ``key`` pin the variant) on x ``[b, m, n]`` into a poisoned output."""
    from tilebin import runtime

    view = _VIEW[x.element_size()]
    out = torch.empty((x.shape[0], x.shape[2], x.shape[1]), dtype=x.dtype, device=x.device)
    out.view(torch.uint8).fill_(0xFF)
    if out.numel():
        runtime.launch(name, x.view(view), out.view(view), **key)
    return out


@pytest.mark.parametrize("kernel", (DIRECT, WARPS), ids=lambda k: k.split("_")[-1])
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("shape", [(1, *s) for s in SHAPES_2D] + SHAPES_3D, ids=_id)
def test_kernel_bit_exact(require, rng, kernel, dtype, shape):
    """Each kernel is correct for every shape (the op launches them on aligned grids only)."""
    require(kernel)
    x = random_bits(shape, dtype, rng.gen)
    poison_cache(2 * x.numel() * x.element_size())
    check(_launch_kernel(kernel, x), x, f"{kernel} {shape} {_name(dtype)} seed={rng.seed}")


@pytest.mark.parametrize("kernel,key", [(DIRECT_2D, {}), (TILED_2D, {"small": False}), (TILED_2D, {"small": True})],
                         ids=("direct", "tiled", "tiled-small"))
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("shape", SHAPES_2D, ids=_id)
def test_kernel_2d_bit_exact(require, rng, kernel, key, dtype, shape):
    """transpose.transpose_direct and every transpose.transpose_tiled variant on 2-D x ``[m, n]`` and
    out ``[n, m]``, every shape."""
    from tilebin import runtime

    require(kernel)
    x = random_bits(shape, dtype, rng.gen)
    poison_cache(2 * x.numel() * x.element_size())
    view = _VIEW[x.element_size()]
    out = torch.empty((shape[1], shape[0]), dtype=dtype, device=x.device)
    out.view(torch.uint8).fill_(0xFF)
    if out.numel():
        runtime.launch(kernel, x.view(view), out.view(view), **key)
    check(out, x, f"{kernel} {key} {shape} {_name(dtype)} seed={rng.seed}")


@pytest.fixture()
def T(require):
    """``tilebin.ops.transpose`` with its memos cleared before and after."""
    from tilebin.ops import transpose
    from tilebin.ops.transpose import _transpose

    for name in (KERNEL, DIRECT, DIRECT_2D, TILED_2D, WARPS):
        require(name)
    for spec in _transpose.SPECS:
        spec.memo.clear()
    yield transpose
    for spec in _transpose.SPECS:
        spec.memo.clear()


def _shipped(x: torch.Tensor) -> torch.Tensor:
    """``transpose.batched_transpose`` (8-warp tiles) launched directly, whatever the op would pick."""
    x3 = x if x.dim() == 3 else x.unsqueeze(0)
    out = _launch_kernel(KERNEL, x3, small=False) if x3.numel() else x3.transpose(1, 2).contiguous()
    return out if x.dim() == 3 else out.squeeze(0)


@pytest.mark.parametrize("dtype", DTYPES + (torch.int16,), ids=_name)
@pytest.mark.parametrize("shape", SHAPES_2D, ids=_id)
def test_op_transpose(T, rng, dtype, shape):
    x = random_bits(shape, dtype, rng.gen)
    poison_cache(2 * x.numel() * x.element_size())
    out = T.transpose(x)
    what = f"transpose {shape} {_name(dtype)} seed={rng.seed}"
    check(out, x, what)
    assert_bits_equal(out, _shipped(x), what + " (vs the shipped kernel)")


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("shape", SHAPES_3D, ids=_id)
def test_op_batched_transpose(T, rng, dtype, shape):
    x = random_bits(shape, dtype, rng.gen)
    poison_cache(2 * x.numel() * x.element_size())
    out = T.batched_transpose(x)
    what = f"batched_transpose {shape} {_name(dtype)} seed={rng.seed}"
    check(out, x, what)
    assert_bits_equal(out, _shipped(x), what + " (vs the shipped kernel)")


@pytest.mark.parametrize(
    ("shape", "dtype", "kernel"),
    [((1, 7168), torch.bfloat16, TILED_2D), ((4, 7168), torch.bfloat16, TILED_2D),  # rows not a multiple of 8
     ((16, 7168), torch.bfloat16, DIRECT_2D), ((64, 7168), torch.bfloat16, DIRECT_2D),
     ((128, 7168), torch.bfloat16, DIRECT_2D), ((1, 64, 7168), torch.bfloat16, DIRECT),
     ((8192, 7168), torch.bfloat16, WARPS), ((8192, 7168), torch.float32, WARPS),
     ((8192, 7168), torch.float8_e4m3fn, WARPS), ((8, 4096, 4096), torch.bfloat16, WARPS),
     ((4001, 7168), torch.bfloat16, TILED_2D), ((4096, 7170), torch.bfloat16, TILED_2D),  # rows, cols not % 8
     ((4, 3, 7168), torch.bfloat16, KERNEL)],
    ids=lambda v: _id(v) if isinstance(v, tuple) else _name(v) if isinstance(v, torch.dtype) else v.split(".")[1],
)
def test_op_picks(T, rng, monkeypatch, shape, dtype, kernel):
    """The op launches the kernel meant for each benchmark shape (decode grids: 56 blocks of 8 warps)."""
    from tilebin.ops.config import get_num_sms
    from tilebin.ops.transpose import _transpose

    if 2 * get_num_sms() <= 56:
        pytest.skip(f"{get_num_sms()} SMs: 128 x 7168 bf16 gives 2 blocks per SM of the 8-warp tiles")
    picked = []
    real = _transpose.launcher

    def spy(name, **key):  # the plan makes its launchers up front: record the ones that launch
        fn = real(name, **key)

        def launch(*args):
            picked.append(name)
            return fn(*args)

        return launch

    monkeypatch.setattr(_transpose, "launcher", spy)
    x = random_bits(shape, dtype, rng.gen)
    out = T.transpose(x) if len(shape) == 2 else T.batched_transpose(x)
    check(out, x, f"{shape} {_name(dtype)}")
    assert picked == [kernel], f"{shape} {_name(dtype)}: launched {picked}, expected {kernel}"


@pytest.mark.parametrize("rows", (64, 16), ids=str)
def test_direct_under_a_cuda_graph(T, rng, rows):
    x = random_bits((rows, 7168), torch.bfloat16, rng.gen)
    T.transpose(x)  # warm: the module is loaded before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = T.transpose(x)
    x.copy_(random_bits(x.shape, x.dtype, rng.gen))
    captured.view(torch.uint8).fill_(0xFF)
    graph.replay()
    check(captured, x, "CUDA graph replay with new input values")
