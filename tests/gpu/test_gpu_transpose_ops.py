"""GPU tests of ``tilebin.ops.transpose`` (``transpose``, ``batched_transpose``) against torch.

Every result is compared bit for bit (dtype, shape, contiguous strides, raw bytes) with
``x.transpose(-2, -1).contiguous()`` (on an integer view of the same bits, as torch lacks some
float8 copy kernels), for every dtype the op takes, on fresh random bit patterns (NaN payloads,
-0, subnormals and infinities included).  Before each call the caching allocator's free memory
is filled with 0xFF, so an output element the kernel never wrote shows up.  Sizes: 0, 1, odd,
tile edges (192 x 256: a partial 128-row tile), large; non-contiguous and misaligned inputs;
batches past the grid's z limit (chunked); a row too long for the grid (refused, nothing run).
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal, int_view
from _moe_util import poison_cache

KERNEL = "transpose.batched_transpose"
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.int8, torch.uint8, torch.int16, torch.int32)
SHAPES_2D = [(0, 5), (5, 0), (1, 1), (1, 7), (7, 1), (3, 17), (64, 64), (192, 256), (129, 257), (1000, 1001),
             (4001, 7168), (8192, 7168)]
SHAPES_3D = [(0, 4, 4), (2, 0, 3), (2, 3, 0), (1, 1, 1), (1, 192, 256), (3, 17, 33), (5, 64, 96), (4, 1000, 1001),
             (2, 4096, 7168)]


@pytest.fixture()
def T(require):
    require(KERNEL)
    from tilebin.ops import transpose

    return transpose


def random_bits(shape, dtype, gen: torch.Generator) -> torch.Tensor:
    """Uniformly random bytes viewed as ``dtype``: every bit pattern, NaNs included."""
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape, size), dtype=torch.uint8, device="cuda", generator=gen)
    return raw.view(dtype).reshape(shape)


def reference(x: torch.Tensor) -> torch.Tensor:
    return int_view(x).transpose(-2, -1).contiguous().view(x.dtype)


def check(out: torch.Tensor, x: torch.Tensor, what: str) -> None:
    torch.cuda.synchronize()
    assert out.is_contiguous(), f"{what}: output strides {out.stride()} are not contiguous"
    assert out.device == x.device, f"{what}: output on {out.device}, x on {x.device}"
    assert_bits_equal(out, reference(x), what)


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("shape", SHAPES_2D, ids=lambda s: "x".join(map(str, s)))
def test_transpose_bit_exact(T, rng, dtype, shape):
    x = random_bits(shape, dtype, rng.gen)
    poison_cache(2 * x.numel() * x.element_size())
    check(T.transpose(x), x, f"transpose {shape} {_name(dtype)} seed={rng.seed}")


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("shape", SHAPES_3D, ids=lambda s: "x".join(map(str, s)))
def test_batched_transpose_bit_exact(T, rng, dtype, shape):
    x = random_bits(shape, dtype, rng.gen)
    poison_cache(2 * x.numel() * x.element_size())
    check(T.batched_transpose(x), x, f"batched_transpose {shape} {_name(dtype)} seed={rng.seed}")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32, torch.float8_e4m3fn), ids=_name)
def test_non_contiguous_and_misaligned_inputs(T, rng, dtype):
    base = random_bits((3, 130, 258), dtype, rng.gen)
    flat = random_bits((1 + 3 * 129 * 257,), dtype, rng.gen)
    inputs = {
        "column-major": base[0].t(),
        "strided rows": base[1, ::2],
        "strided columns": base[2, :, ::2],
        "padded row stride": base[:, :129, :257],
        "misaligned pointer": flat[1:].view(3, 129, 257),
        "permuted batch": base.permute(1, 0, 2),
    }
    for what, x in inputs.items():
        poison_cache(2 * x.numel() * x.element_size())
        out = T.transpose(x) if x.dim() == 2 else T.batched_transpose(x)
        check(out, x, f"{what} {tuple(x.shape)} strides {x.stride()} {_name(dtype)} seed={rng.seed}")


def test_batches_past_the_grid_limit_are_chunked(T, rng):
    x = random_bits((2 * 65520 + 7, 3, 5), torch.bfloat16, rng.gen)
    poison_cache(2 * x.numel() * 2)
    check(T.batched_transpose(x), x, f"batch {x.shape[0]} seed={rng.seed}")


def test_a_row_too_long_for_the_grid_is_refused_before_any_launch(T, rng):
    from tilebin.runtime import ArgumentError

    x = random_bits((1, 64 * 65535 + 1), torch.float32, rng.gen)  # fp32 tiles are 64 columns wide
    with pytest.raises(ArgumentError, match="transpose: .*split x along its last dim"):
        T.transpose(x)
    torch.cuda.synchronize()  # nothing was queued that could fault


def test_runs_on_the_current_stream_and_under_a_cuda_graph(T, rng):
    x = random_bits((2, 300, 301), torch.bfloat16, rng.gen)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = T.batched_transpose(x)
    side.synchronize()
    check(out, x, "on a side stream")
    T.batched_transpose(x)  # warm: the module is loaded before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = T.batched_transpose(x)
    x.copy_(random_bits(x.shape, x.dtype, rng.gen))
    captured.view(torch.uint8).fill_(0xFF)
    graph.replay()
    check(captured, x, "CUDA graph replay with new input values")


def test_back_to_back_calls_of_mixed_shapes_and_dtypes(T, rng):
    """No sync between calls: per-shape launch state must not leak from one call to the next."""
    calls = []
    for dtype in DTYPES:
        for shape in [(1, 64, 96), (5, 33, 7), (2, 300, 301), (1, 192, 256)]:
            x = random_bits(shape, dtype, rng.gen)
            calls.append((x, T.batched_transpose(x), T.transpose(x[0])))
    for x, out3, out2 in calls:
        check(out3, x, f"batched {tuple(x.shape)} {_name(x.dtype)}")
        check(out2, x[0], f"2-D {tuple(x[0].shape)} {_name(x.dtype)}")
