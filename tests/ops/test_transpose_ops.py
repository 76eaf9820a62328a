"""``tilebin.ops.transpose`` on CPU with the launch stubbed (``ops_stub.StubbedOps``): argument
checks (typed, naming the op, before any launch), output dtype/shape/strides as tile_kernels lays
them out, what is launched (variant by element size, the direct kernel for aligned decode grids,
contiguous aligned views, batch chunks), empty inputs (no launch) and the ``tilebin::`` registration."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ops_stub import StubbedOps
from tilebin.ops import _spec, transpose as T
from tilebin.ops.transpose import _transpose as impl
from tilebin.runtime import ArgumentError

KERNEL = "transpose.batched_transpose"
TILED_2D = "transpose.transpose_tiled"  # KERNEL's 2-D twin: a 2-D x's tiled launch, x and out as they are
VARIANT = {1: torch.float8_e4m3fn, 2: torch.bfloat16, 4: torch.float32}
BAD_DTYPES = (torch.float64, torch.int64, torch.bool, torch.complex64)


@pytest.fixture()
def stub(monkeypatch):
    return StubbedOps(monkeypatch)


def _x(shape, dtype=torch.bfloat16):
    return torch.arange(torch.Size(shape).numel()).reshape(shape).to(dtype)


def _raises(match, fn, *args):
    with pytest.raises(ArgumentError, match=match) as info:
        fn(*args)
    assert str(info.value).startswith(fn.__name__ + ":"), str(info.value)
    return str(info.value)


def test_public_api_is_tile_kernels():
    assert T.__all__ == ["batched_transpose", "transpose"]
    for name in T.__all__:
        assert list(inspect.signature(getattr(T, name)).parameters) == ["x"]


@pytest.mark.parametrize("dtype", impl.DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (64, 129), (1000, 7)], ids=str)
def test_transpose_output_layout_and_launch(stub, dtype, shape):
    x = _x(shape, dtype)
    out = T.transpose(x)
    assert (out.dtype, tuple(out.shape), out.is_contiguous()) == (dtype, shape[::-1], True)
    [(name, key, (kx, kout))] = stub.launches
    want = VARIANT[x.element_size()]
    assert (name, key) == (TILED_2D, {"dtype": str(want).removeprefix("torch."), "small": True})  # tiny grid
    assert (kx.dtype, kout.dtype) == (want, want)
    assert (tuple(kx.shape), tuple(kout.shape)) == (shape, shape[::-1])  # no [1, m, n] views
    assert kx.data_ptr() == x.data_ptr() and kout.data_ptr() == out.data_ptr()  # no copy of a contiguous x


@pytest.mark.parametrize("dtype", impl.DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 5), (5, 64, 129)], ids=str)
def test_batched_transpose_output_layout_and_launch(stub, dtype, shape):
    x = _x(shape, dtype)
    out = T.batched_transpose(x)
    b, m, n = shape
    assert (out.dtype, tuple(out.shape), out.is_contiguous()) == (dtype, (b, n, m), True)
    [(_, _, (kx, kout))] = stub.launches
    assert (tuple(kx.shape), tuple(kout.shape)) == (shape, (b, n, m))
    assert kout.data_ptr() == out.data_ptr()


DIRECT = "transpose.batched_transpose_direct"
DIRECT_2D = "transpose.transpose_direct"  # a 2-D x's direct launch: x and out as they are, no [1, m, n] view
WARPS = "transpose.batched_transpose_warps"


@pytest.mark.parametrize("dtype,shape,name,small", [
    (torch.bfloat16, (128, 7168), DIRECT_2D, None), (torch.bfloat16, (640, 7168), WARPS, None),  # 56 / 280 blocks
    (torch.bfloat16, (129, 7168), TILED_2D, True), (torch.bfloat16, (1, 7168), TILED_2D, True),  # rows not % 8
    (torch.bfloat16, (4, 7168), TILED_2D, True), (torch.bfloat16, (4001, 7168), TILED_2D, False),
    (torch.float8_e4m3fn, (256, 7168), DIRECT_2D, None), (torch.float8_e4m3fn, (248, 7168), TILED_2D, True),
    (torch.float32, (320, 3328), DIRECT_2D, None), (torch.float32, (320, 3392), WARPS, None),
    (torch.float32, (320, 3326), TILED_2D, True),  # cols not % 4
    (torch.int16, (263, 1, 1), KERNEL, True), (torch.int16, (264, 1, 1), KERNEL, False),
    (torch.int8, (264, 1, 1), KERNEL, False), (torch.int16, (263, 8, 8), DIRECT, None),
    (torch.int16, (264, 8, 8), WARPS, None), (torch.int16, (3, 9, 16), KERNEL, True),
], ids=str)
def test_aligned_grids_take_the_direct_or_warps_kernel_else_the_tiles(stub, dtype, shape, name, small):
    """Rows and cols multiples of 16 bytes' worth of elements: ``transpose.batched_transpose_direct``
    (``transpose.transpose_direct`` for a 2-D x, launched on x and out as they are: asserted below)
    below 2 blocks per SM of the 8-warp tiles (132 SMs here), ``transpose.batched_transpose_warps``
    from there on; otherwise ``transpose.batched_transpose`` (``transpose.transpose_tiled`` for a
    2-D x, as it is), its 2-warp tiles (``small``) below."""
    x = torch.zeros(shape, dtype=dtype)
    (T.transpose if x.dim() == 2 else T.batched_transpose)(x)
    [(launched, key, (kx, kout))] = stub.launches
    variant = str(VARIANT[x.element_size()]).removeprefix("torch.")
    assert (launched, key) == (name, {"dtype": variant} | ({} if small is None else {"small": small}))
    assert kx.dim() == kout.dim() == (2 if name in (DIRECT_2D, TILED_2D) else 3)


def test_the_token_count_picks_per_call_under_one_memo_key(stub, monkeypatch):
    """A 2-D x's rows are not in the memo key: one stored plan, the kernel picked per call."""
    monkeypatch.setattr(impl.TRANSPOSE, "memo", {})
    for rows in (64, 65, 64, 640, 1):
        T.transpose(torch.zeros((rows, 7168), dtype=torch.bfloat16))
    assert [(n, k.get("small")) for n, k, _ in stub.launches] == [
        (DIRECT_2D, None), (TILED_2D, True), (DIRECT_2D, None), (WARPS, None), (TILED_2D, True)]
    assert len(impl.TRANSPOSE.memo) == 1


@pytest.mark.parametrize("op,shape", [("transpose", (0, 5)), ("transpose", (7, 0)), ("transpose", (0, 0)),
                                      ("batched_transpose", (0, 4, 4)), ("batched_transpose", (3, 0, 9)),
                                      ("batched_transpose", (3, 9, 0))])
def test_empty_input_returns_empty_output_without_a_launch(stub, op, shape):
    out = getattr(T, op)(_x(shape))
    assert tuple(out.shape) == (*shape[:-2], shape[-1], shape[-2]) and out.is_contiguous()
    assert stub.launches == []


def test_non_contiguous_input_is_copied_first(stub):
    base = _x((6, 8))
    for x in (base.t(), base[:, ::2], base[::2]):
        out = T.transpose(x)
        kx = stub.launches[-1][2][0]
        assert kx.is_contiguous() and kx.data_ptr() != x.data_ptr() and tuple(out.shape) == tuple(x.shape[::-1])
        assert torch.equal(kx, x)  # the same values, laid out for the kernel


def test_misaligned_input_is_copied_first(stub):
    flat = _x((1 + 4 * 8,))
    x = flat[1:].view(4, 8)  # contiguous, its pointer 2 bytes past an aligned one
    T.transpose(x)
    kx = stub.launches[-1][2][0]
    assert kx.data_ptr() % 16 == 0 and torch.equal(kx, x)


def test_huge_batch_launches_in_aligned_chunks(stub):
    batch = impl._BATCH_CHUNK * 2 + 3
    x = torch.zeros((batch, 1, 1), dtype=torch.int8)
    out = T.batched_transpose(x)
    sizes = [a[0].shape[0] for _, _, a in stub.launches]
    assert sizes == [impl._BATCH_CHUNK, impl._BATCH_CHUNK, 3] and max(sizes) <= 65535
    assert all(a[0].data_ptr() % 16 == 0 and a[1].data_ptr() % 16 == 0 for _, _, a in stub.launches)
    assert tuple(out.shape) == (batch, 1, 1)


def test_a_shape_the_kernel_grid_cannot_cover_is_an_argument_error_naming_the_op(monkeypatch):
    def refuse(name, **key):
        def launch(*args):
            raise ArgumentError(f"{name}: grid (1, 70000, 1) is outside [1, [2147483647, 65535, 65535]]; "
                                "split the call")
        return launch

    monkeypatch.setattr(impl, "launcher", refuse)
    monkeypatch.setattr(_spec, "check_cuda", lambda *a, **k: None)
    monkeypatch.setattr(impl, "get_num_sms", lambda device=None: 132)
    monkeypatch.setattr(impl.TRANSPOSE, "memo", {})
    for _ in range(2):  # the refused call stores nothing: the second runs every check again, and fails alike
        msg = _raises("outside what transpose.transpose_tiled serves", T.transpose, _x((1, 64)))
        assert "split x along its last dim" in msg
        assert not impl.TRANSPOSE.memo


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=str)
def test_unsupported_dtype(stub, dtype):
    msg = _raises("x has dtype", T.transpose, torch.zeros((4, 4), dtype=dtype))
    assert "supported: bfloat16" in msg
    _raises("x has dtype", T.batched_transpose, torch.zeros((2, 4, 4), dtype=dtype))
    assert stub.launches == []


@pytest.mark.parametrize("op,shape", [("transpose", (4,)), ("transpose", (2, 4, 4)), ("transpose", ()),
                                      ("batched_transpose", (4, 4)), ("batched_transpose", (1, 2, 4, 4))])
def test_wrong_rank(stub, op, shape):
    _raises("must be", getattr(T, op), torch.zeros(shape, dtype=torch.bfloat16))
    assert stub.launches == []


@pytest.mark.parametrize("bad", [None, 3, [[1.0, 2.0]], "x"])
def test_not_a_tensor(stub, bad):
    _raises("must be a torch.Tensor", T.transpose, bad)
    _raises("must be a torch.Tensor", T.batched_transpose, bad)
    assert stub.launches == []


@pytest.mark.parametrize("op,shape", [("transpose", (4, 4)), ("batched_transpose", (2, 4, 4)),
                                      ("transpose", (0, 4))])
def test_cpu_tensor_stops_at_the_device_check(op, shape):
    msg = _raises("is on cpu, not a CUDA device", getattr(T, op), torch.zeros(shape, dtype=torch.float32))
    assert "x.cuda()" in msg


def test_registered_as_torch_library_ops_with_fake_shapes(stub):
    from tilebin.ops._torch import register_all, traced

    ops = register_all()
    assert {"transpose", "batched_transpose"} <= set(ops)
    mode = FakeTensorMode()
    with mode:
        fake2 = traced("transpose", mode.from_tensor(_x((3, 5))))
        fake3 = traced("batched_transpose", mode.from_tensor(_x((2, 3, 5), torch.float8_e4m3fn)))
    assert (tuple(fake2.shape), fake2.stride(), fake2.dtype) == ((5, 3), (3, 1), torch.bfloat16)
    assert (tuple(fake3.shape), fake3.stride(), fake3.dtype) == ((2, 5, 3), (15, 3, 1), torch.float8_e4m3fn)
    assert stub.launches == []


def test_fullgraph_compile_records_the_custom_op(stub):
    torch._dynamo.reset()
    x = _x((2, 6, 10))
    compiled = torch.compile(lambda t: T.batched_transpose(t), fullgraph=True, backend="aot_eager")
    out = compiled(x)
    assert (tuple(out.shape), out.dtype) == ((2, 10, 6), torch.bfloat16)
    assert [name for name, _, _ in stub.launches] == [KERNEL]
