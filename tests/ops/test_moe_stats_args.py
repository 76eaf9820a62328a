"""CPU tests of the MoE statistics ops' argument checks (no GPU): every bad argument raises an
ArgumentError naming the op, the value and what is supported, before any GPU work; valid CPU
tensors get as far as the device check (the last one)."""

from __future__ import annotations


import pytest
import torch

from ops_stub import declared_variants
from tilebin.ops import _spec
from tilebin.ops._common import specialised_key
from tilebin.ops._spec import TensorParam

from tilebin.ops.moe import _stats as st
from tilebin.runtime import ArgumentError
from tilebin.runtime._record import replace


def _idx(tokens=4, topk=2, dtype=torch.int64):
    return torch.zeros((tokens, topk), dtype=dtype)


def _raises(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(ArgumentError, match=match) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert msg.startswith(fn.__name__ + ":"), msg
    return msg


# Valid arguments per op (CPU tensors): each reaches the device check.
VALID = {
    "aux_fi": lambda: (st.aux_fi, (_idx(), 8, 2)),
    "group_count": lambda: (st.group_count, (_idx(), 8)),
    "normalize_weight": lambda: (st.normalize_weight, (torch.ones((4, 2)),)),
    "mask_indices_by_tp": lambda: (st.mask_indices_by_tp, (_idx(), 64, 8, 1, 2)),
    "mask_indices_by_tp_int32": lambda: (st.mask_indices_by_tp, (_idx(dtype=torch.int32), 64, 8, 1, 2)),
    "inplace_unique_group_indices": lambda: (st.inplace_unique_group_indices, (_idx(), 8)),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_cpu_arguments_reach_the_device_check(name):
    fn, args = VALID[name]()
    msg = _raises("not a CUDA device", fn, *args)
    assert ".cuda()" in msg


@pytest.mark.parametrize("tokens,topk", [(0, 8), (1, 1), (4001, 9), (3, 0)])
def test_any_token_count_and_topk_is_accepted(tokens, topk):
    _raises("not a CUDA device", st.aux_fi, _idx(tokens, topk), 256, topk or 1)
    _raises("not a CUDA device", st.group_count, _idx(tokens, topk), 72)
    _raises("not a CUDA device", st.normalize_weight, torch.ones((tokens, topk)))
    _raises("not a CUDA device", st.mask_indices_by_tp, _idx(tokens, topk), 256, 8, 0, 4)
    _raises("not a CUDA device", st.inplace_unique_group_indices, _idx(tokens, topk), 16)


class _Index:
    """An integer-like (numpy / torch integers behave the same way)."""

    def __init__(self, v: int):
        self.v = v

    def __index__(self) -> int:
        return self.v


def test_integer_likes_are_accepted():
    _raises("not a CUDA device", st.aux_fi, _idx(), _Index(8), _Index(2))
    _raises("not a CUDA device", st.mask_indices_by_tp, _idx(), _Index(64), 8, _Index(1), 2)


# ---------------------------------------------------------------- index tensors
INDEX_OPS = [
    (st.aux_fi, (8, 2)),
    (st.group_count, (8,)),
    (st.inplace_unique_group_indices, (8,)),
]


@pytest.mark.parametrize("fn,rest", INDEX_OPS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.float32, torch.uint8])
def test_index_ops_want_int64(fn, rest, dtype):
    msg = _raises("dtype", fn, _idx(dtype=dtype), *rest)
    assert "int64" in msg and str(dtype).removeprefix("torch.") in msg


@pytest.mark.parametrize("dtype", [torch.int16, torch.float32, torch.uint8, torch.int8])
def test_mask_wants_int64_or_int32(dtype):
    msg = _raises("dtype", st.mask_indices_by_tp, _idx(dtype=dtype), 64, 8, 0, 2)
    assert "int64" in msg and "int32" in msg


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_normalize_wants_float32(dtype):
    msg = _raises("dtype", st.normalize_weight, torch.ones((4, 2), dtype=dtype))
    assert "float32" in msg


ALL_TENSOR_FIRST = INDEX_OPS + [(st.mask_indices_by_tp, (64, 8, 0, 2))]


@pytest.mark.parametrize("fn,rest", ALL_TENSOR_FIRST, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("shape", [(8,), (2, 3, 4), ()])
def test_index_tensor_must_be_2d(fn, rest, shape):
    _raises("must be 2-D", fn, torch.zeros(shape, dtype=torch.int64), *rest)


def test_normalize_tensor_must_be_2d():
    _raises("must be 2-D", st.normalize_weight, torch.ones((8,)))


@pytest.mark.parametrize("fn,rest", ALL_TENSOR_FIRST, ids=lambda v: getattr(v, "__name__", ""))
def test_index_tensor_must_be_contiguous(fn, rest):
    msg = _raises("contiguous", fn, _idx(4, 6)[:, ::2], *rest)
    assert ".contiguous()" in msg
    _raises("contiguous", fn, _idx(6, 4).T, *rest)


def test_normalize_tensor_must_be_contiguous():
    _raises("contiguous", st.normalize_weight, torch.ones((6, 4)).T)


@pytest.mark.parametrize("fn,rest", ALL_TENSOR_FIRST, ids=lambda v: getattr(v, "__name__", ""))
def test_not_a_tensor(fn, rest):
    _raises("must be a torch.Tensor", fn, [[0, 1]], *rest)


def test_too_many_entries(monkeypatch):
    """More than MAX_ENTRIES (2**30) entries: refused (here with the limit lowered to 2**2)."""
    for spec in st.SPECS:
        params = tuple(replace(p, max_numel=4) if isinstance(p, TensorParam) else p for p in spec.params)
        monkeypatch.setattr(spec, "params", params)
        monkeypatch.setattr(spec, "_per_call", tuple((i, params[i]) for i in spec._tensors))
        monkeypatch.setattr(spec, "memo", {})
    for fn, rest in ALL_TENSOR_FIRST:
        _raises("split the tokens", fn, _idx(4, 2), *rest)
    _raises("split the tokens", st.normalize_weight, torch.ones((4, 2)))


# ---------------------------------------------------------------- integer arguments
@pytest.mark.parametrize("value", [0, -3, 2**31, True, 2.0, "8", None])
def test_aux_fi_num_experts(value):
    _raises("num_experts", st.aux_fi, _idx(), value, 2)


@pytest.mark.parametrize("value", [0, -1, 2**31, False, 1.5])
def test_aux_fi_num_aux_topk(value):
    _raises("num_aux_topk", st.aux_fi, _idx(), 8, value)


@pytest.mark.parametrize("value", [0, -1, 2**31, True, 8.0])
def test_group_count_num_groups(value):
    _raises("num_groups", st.group_count, _idx(), value)


@pytest.mark.parametrize("value", [0, -1, False, 8.0])
def test_inplace_unique_num_groups(value):
    _raises("num_groups", st.inplace_unique_group_indices, _idx(), value)


@pytest.mark.parametrize("args,name", [
    ((0, 8, 0, 2), "n="),
    ((-64, 8, 0, 2), "n="),
    ((64.0, 8, 0, 2), "n must be an int"),
    ((64, 0, 0, 2), "num_ep_ranks"),
    ((64, 65, 0, 2), "num_ep_ranks"),
    ((64, 8, 0, 0), "num_tp_ranks"),
    ((64, 8, 2, 2), "tp_rank"),
    ((64, 8, -1, 2), "tp_rank"),
    ((64, 8, True, 2), "tp_rank"),
    ((2**31 - 1, 1, 0, 2), "exceeds 2\\*\\*31"),
])
def test_mask_integer_arguments(args, name):
    _raises(name, st.mask_indices_by_tp, _idx(), *args)


def test_messages_name_the_value_and_the_range():
    msg = _raises("num_experts", st.aux_fi, _idx(), 0, 2)
    assert "num_experts=0" in msg and "1 <= num_experts" in msg
    msg = _raises("tp_rank", st.mask_indices_by_tp, _idx(), 64, 8, 4, 4)
    assert "tp_rank=4" in msg and "0 <= tp_rank <= 3" in msg


def test_device_is_checked_last():
    """A bad argument is reported even with CPU tensors: the device check comes after all others."""
    _raises("num_groups", st.group_count, _idx(), 0)
    _raises("dtype", st.normalize_weight, torch.ones((4, 2), dtype=torch.float16))


# ---------------------------------------------------------------- op <-> kernel wiring
def _recorded_launches(monkeypatch) -> list:
    """Run every op on CPU tensors with the device check and the launcher stubbed: what each
    would launch (kernel name, variant key, arguments)."""
    calls = []
    monkeypatch.setattr(_spec, "check_cuda", lambda op, **tensors: None)
    for spec in st.SPECS:  # plans built now, under these stubs, and forgotten after the test
        monkeypatch.setattr(spec, "memo", {})
    monkeypatch.setattr(st, "get_num_sms", lambda device=None: 132)
    monkeypatch.setattr(st, "launcher", lambda name, **key: lambda *args: calls.append((name, key, args)))
    monkeypatch.setattr(st, "specialised_launcher", lambda name, sizes, **key: st.launcher(
        name, **specialised_key(declared_variants(name), sizes, key)))
    st.aux_fi(_idx(3, 2), 16, 2)
    st.aux_fi(_idx(4001, 8), 16, 2)
    st.aux_fi(_idx(40001, 2), 16, 2)
    st.aux_fi(_idx(4001, 8), 2000, 2)
    st.aux_fi(_idx(3, 2), 5000, 2)
    st.aux_fi(_idx(4001, 8), 5000, 2)
    st.group_count(_idx(3, 2), 16)
    st.group_count(_idx(4001, 8), 16)
    st.normalize_weight(torch.ones((3, 2)))
    st.normalize_weight(torch.ones((3, 3)))
    st.mask_indices_by_tp(_idx(3, 2), 64, 8, 1, 2)
    st.mask_indices_by_tp(_idx(3, 2, torch.int32), 64, 8, 1, 2)
    st.inplace_unique_group_indices(_idx(3, 2), 8)
    return calls


def test_ops_launch_declared_variants_with_matching_parameters(monkeypatch):
    """Each op asks for a declared variant and passes the PrimFunc's parameters in order:
    tensors of the declared dtypes and ranks, then int scalars (traced here, no GPU)."""
    pytest.importorskip("tilelang")
    import importlib

    from tvm.target import Target

    calls = _recorded_launches(monkeypatch)
    assert {(name, tuple(key.items())) for name, key, _ in calls} == {
        ("moe.aux_fi", (("mode", "single"), ("unroll", 8))),
        ("moe.aux_fi", (("mode", "arrivals"), ("unroll", 4))),
        ("moe.aux_fi", (("mode", "arrivals"), ("unroll", 8))),
        ("moe.aux_fi", (("mode", "ticket"), ("unroll", 4))),
        ("moe.aux_fi_many_experts", (("single_block", True),)),
        ("moe.aux_fi_many_experts", (("single_block", False),)),
        ("moe.group_count", (("single_block", True),)), ("moe.group_count", (("single_block", False),)),
        ("moe.normalize_weight", (("num_topk", 2),)), ("moe.normalize_weight", ()),
        ("moe.mask_indices_by_tp", (("dtype", "int64"),)),
        ("moe.mask_indices_by_tp", (("dtype", "int32"),)), ("moe.inplace_unique_group_indices", ()),
    }
    for name, key, args in calls:
        decl = next(d for d in importlib.import_module(f"tilebin.kernels.{name}").KERNELS if d.name == name)
        sizes = set().union(*decl.specialise)  # specialised size symbols: bound after the factory runs
        grid_key = {k: v for k, v in key.items() if k not in sizes}
        assert grid_key in [dict(v) for v in decl.grid], (name, key)
        assert {k: v for k, v in key.items() if k in sizes} in [{}, *map(dict, decl.specialise)], (name, key)
        with Target({"kind": "cuda", "arch": "sm_90a"}):
            func = decl.factory(**grid_key)
        assert len(func.params) == len(args), (name, [p.name for p in func.params], len(args))
        for param, arg in zip(func.params, args):
            buf = func.buffer_map.get(param)
            if buf is None:
                assert isinstance(arg, int) and not isinstance(arg, bool), (name, param.name, arg)
            else:
                assert isinstance(arg, torch.Tensor), (name, param.name)
                assert str(buf.dtype) == str(arg.dtype).removeprefix("torch."), (name, param.name, arg.dtype)
                assert len(buf.shape) == arg.dim() and arg.is_contiguous(), (name, param.name)


def test_zeroed_state_one_per_stream_and_fresh_under_capture():
    """aux_fi's grid state (ops._common.ZeroedState): zeroed int32, the same buffer for a stream,
    another for another stream, and a fresh one (not kept) while a CUDA graph is captured."""
    from tilebin.ops._common import ZeroedState

    state = ZeroedState((2, 4), torch.device("cpu"))
    first = state.get()
    assert first.dtype == torch.int32 and tuple(first.shape) == (2, 4) and not first.any()
    assert state.get() is first
    streams = iter((1, 2, 1))
    state.stream = lambda: next(streams)
    one, two, one_again = state.get(), state.get(), state.get()
    assert one is one_again and one is not two and one is not first
    state.capturing = lambda: True
    captured = state.get()
    assert not captured.any() and all(captured is not kept for kept in state.by_stream.values())
    assert len(state.by_stream) == 3
