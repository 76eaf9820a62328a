"""runtime.unchecked_launcher on the GPU: one launcher serves every shape (no per-shape plan),
launches on torch's current stream, skips empty problems, and captures in CUDA graphs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _cases import TRANSPOSE  # noqa: E402
from _gpu_util import assert_bits_equal, poison_  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _need(require):
    require(TRANSPOSE)


@pytest.mark.parametrize("small", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_launcher_many_shapes(rt, rng, dtype, small):
    fn = rt.unchecked_launcher(TRANSPOSE, dtype=str(dtype).removeprefix("torch."), small=small)
    for shape in [(1, 1, 1), (2, 17, 33), (1, 0, 8), (3, 1000, 1001), (1, 4001, 7168)]:
        x = rng.normal(shape, dtype)
        out = poison_(torch.empty(shape[0], shape[2], shape[1], dtype=dtype, device="cuda"))
        fn(x, out)
        torch.cuda.synchronize()
        assert_bits_equal(out, x.transpose(1, 2), f"unchecked transpose {shape} small={small}")


def test_current_stream_and_graph_capture(rt, rng):
    fn = rt.unchecked_launcher(TRANSPOSE, dtype="bfloat16", small=False)
    x = rng.normal((2, 64, 96), torch.bfloat16)
    out = poison_(torch.empty(2, 96, 64, dtype=torch.bfloat16, device="cuda"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # the launch must queue behind this on the side stream
        fn(x, out)
    side.synchronize()
    assert_bits_equal(out, x.transpose(1, 2), "unchecked launch on a side stream")
    poison_(out)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x, out)
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    assert_bits_equal(out, x.transpose(1, 2), "unchecked launch replayed from a CUDA graph")
