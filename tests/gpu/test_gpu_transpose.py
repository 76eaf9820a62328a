"""transpose.batched_transpose: bit-exact over dtypes and shapes (empty, tiny, odd, large)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _cases import TRANSPOSE, TransposeCase, launch_rounds, ref_transpose  # noqa: E402
from _gpu_util import DTYPES, assert_bits_equal, poison_  # noqa: E402

pytestmark = pytest.mark.gpu
SHAPES = [(1, 1, 1), (3, 17, 33), (2, 0, 5), (1, 129, 257), (4, 1000, 1001), (1, 8192, 7168)]


@pytest.fixture(autouse=True)
def _need(require):
    require(TRANSPOSE)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_transpose_bit_exact(rt, rng, dtype, shape):
    case = TransposeCase(rng, DTYPES[dtype], shape)
    case.poison()
    assert case.launch(rt) is None
    case.check(f"seed={rng.seed}")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(3, 17, 33), (2, 256, 512), (1, 1000, 1001)], ids=lambda s: "x".join(map(str, s)))
def test_transpose_random_bit_patterns(rt, rng, dtype, shape):
    """Every non-NaN bit pattern (subnormals, -0, inf) must move unchanged."""
    case = TransposeCase(rng, DTYPES[dtype], shape, fill="bits")
    case.poison()
    case.launch(rt)
    case.check(f"random bits, seed={rng.seed}")


@pytest.mark.parametrize("small", [False, True])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(2, 40, 24), (1, 200, 7168), (3, 129, 257)], ids=lambda s: "x".join(map(str, s)))
def test_transpose_pinned_variant(rt, rng, dtype, shape, small):
    """Each variant, 8-warp tiles and the 2-warp ``small`` ones, on full, partial and unaligned tiles."""
    case = TransposeCase(rng, DTYPES[dtype], shape)
    case.poison()
    case.launch(rt, dtype=dtype, small=small)
    case.check(f"with dtype={dtype!r} small={small} pinned")


def test_transpose_shapes_interleaved(rt, rng):
    """Alternating shapes and dtypes back to back (no sync): cached launch state must not leak."""
    cases = [TransposeCase(rng, DTYPES[d], s) for d in DTYPES for s in [(1, 64, 96), (5, 33, 7), (2, 300, 301)]]
    launch_rounds(rt, cases, 3)


def test_transpose_adjacent_buffers_allowed(rt, rng):
    """Input and output back to back in one allocation (touching, not overlapping) are legal."""
    b, r, c = 2, 64, 96
    n = b * r * c
    buf = torch.empty(2 * n, dtype=torch.bfloat16, device="cuda")
    x, out = buf[:n].view(b, r, c), buf[n:].view(b, c, r)
    x.copy_(rng.normal((b, r, c), torch.bfloat16))
    poison_(out)
    rt.launch(TRANSPOSE, x, out)
    assert_bits_equal(out, ref_transpose(x), "adjacent x/out in one buffer")


def test_transpose_launch_many_then_sync(rt, rng):
    """500 launches queued without a sync, each into its own output slot, then one check."""
    x = rng.normal((1, 64, 128), torch.float32)
    outs = torch.empty((500, 1, 128, 64), dtype=torch.float32, device="cuda")
    poison_(outs)
    for i in range(500):
        rt.launch(TRANSPOSE, x, outs[i])
    want = ref_transpose(x).expand(500, 1, 128, 64)
    assert_bits_equal(outs, want.contiguous(), "500 queued launches")
