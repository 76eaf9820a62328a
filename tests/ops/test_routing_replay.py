"""The fused MoE routing ops' OpSpecs (CPU, launcher stubbed): schemas as registered before the
OpSpecs, a memoized configuration launches exactly what its checked first call launches
(kernel, key, arguments, outputs' dtype/shape/strides), and every fact the memo key leaves out
(token counts that must agree, ``num_expanded_tokens``, strides, data pointers) is refused on a
replay with the message a fresh process gives, before any launch and without storing anything."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ops_stub import StubbedOps, describe, describe_launches
from tilebin.ops import _spec
from tilebin.ops.moe import _routing as r
from tilebin.runtime import ArgumentError

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

BF, F32, E4M3, I32, I64 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int32, torch.int64


@pytest.fixture
def ops(monkeypatch):
    """The stubs, and moe.get_fused_mapping's counts written (1 per expert): the sync form's
    trimmed sizes and count list are then defined."""
    stub = StubbedOps(monkeypatch)
    recorder = r.launcher

    def launcher(name, **key):
        launch = recorder(name, **key)
        if name != "moe.get_fused_mapping" or getattr(launch, "__name__", "") == "_no_launch":
            return launch
        return lambda *args: launch(*args) or args[7].fill_(1)

    monkeypatch.setattr(r, "launcher", launcher)
    return stub


# the TorchOp schema strings of these ops before their OpSpecs (tilebin::<op> must not change), but for
# get_fused_mapping's result: seven tensors since its outputs are separate allocations (they were rows of
# two [3, n] tensors, which the custom op returned)
SCHEMAS = {
    "get_fused_mapping": "(Tensor topk_idx, int num_experts, int num_expanded_tokens, int alignment, "
                         "bool force_no_sync=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    "expand_to_fused": "(Tensor x, Tensor token_topk_to_pos, Tensor pos_to_expert) -> Tensor",
    "expand_to_fused_with_sf": "(Tensor x, Tensor x_sf, int num_per_channels, Tensor token_topk_to_pos, "
                               "Tensor pos_to_expert, bool use_tma_aligned_col_major_sf=False) -> (Tensor, Tensor)",
    "reduce_fused": "(Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, "
                    "str fp8_format=\"\", Tensor? sf=None) -> Tensor",
    "reduce_fused_out": "(Tensor x, Tensor? x_sf, Tensor? topk_weights, Tensor token_topk_to_pos, "
                        "str fp8_format, Tensor? sf, Tensor(a!) out) -> ()",
}


def test_schemas_are_unchanged():
    assert {op.name: op.schema for op in r.TORCH_OPS} == SCHEMAS
    specs = {spec.name: spec.schema() for spec in r.SPECS}
    assert specs == {name: schema for name, schema in SCHEMAS.items() if name != "reduce_fused_out"}
    ops = {op.name: op for op in r.TORCH_OPS}
    assert ops["reduce_fused_out"].fake == r.REDUCE_FUSED.fake == ops["reduce_fused"].fake
    assert ops["reduce_fused_out"].public is r.reduce_fused is ops["reduce_fused"].public
    assert ops["get_fused_mapping"].eager_only is r.mapping_syncs


def test_the_public_ops_are_their_specs():
    for spec in r.SPECS:
        fn = getattr(r, spec.name)
        assert fn.__name__ == spec.name and fn.__doc__


# ---------------------------------------------------------------- valid calls
def _ttp(tokens, topk=8, slots=50):
    return torch.randint(-1, slots, (tokens, topk), dtype=I32)


def _calls(tokens):
    """(op, args) of every form, at ``tokens`` tokens."""
    idx = torch.randint(0, 64, (tokens, 8))
    ttp, pte = _ttp(tokens), torch.zeros(50, dtype=I32)
    calls = [(r.get_fused_mapping, (idx, 64, tokens * 8 + 64 * 16, 16, True)),
             (r.get_fused_mapping, (idx, 64, 0, 16, True)), (r.get_fused_mapping, (idx, 64, 0, 16))]
    calls += [(r.expand_to_fused, (torch.zeros(tokens, 64, dtype=d), ttp, pte)) for d in (BF, F32, E4M3)]
    data = torch.zeros(tokens, 576, dtype=E4M3)
    calls += [(r.expand_to_fused_with_sf, ((data, torch.ones(tokens, 18)), 32, ttp, pte)),
              (r.expand_to_fused_with_sf, ((data, torch.ones(tokens, 5)), 128, ttp, pte, True)),
              (r.expand_to_fused_with_sf, ((data, torch.ones(tokens, 5, dtype=I32)), 32, ttp, pte, 1))]
    for dtype in (BF, F32):
        y, w = torch.randn(50, 64).to(dtype), torch.rand(tokens, 8)
        calls += [(r.reduce_fused, (y, w, ttp)), (r.reduce_fused, (y, None, ttp)),
                  (r.reduce_fused, ((y, torch.rand(50)), w, ttp, "e4m3", torch.ones(1))),
                  (r.reduce_fused, (y, w, ttp, "", None, torch.empty(tokens, 64, dtype=dtype)))]
    return calls


def _memos():
    return sum(len(spec.memo) for spec in r.SPECS)


@pytest.mark.parametrize("tokens", [0, 1, 7, 128])
def test_a_replay_launches_what_the_checked_call_launches(ops, monkeypatch, tokens):
    checked = []
    real = _spec.OpSpec.checked
    monkeypatch.setattr(_spec.OpSpec, "checked", lambda self, a, k: checked.append(self.name) or real(self, a, k))
    for fn, args in _calls(tokens):
        ops.fresh()
        ops.launches.clear()
        cold = describe(fn(*args)), describe_launches(ops.launches)
        assert _memos() == 1, fn.__name__
        checked.clear()
        ops.launches.clear()
        warm = describe(fn(*args)), describe_launches(ops.launches)
        assert warm == cold and not checked, fn.__name__


def test_token_and_slot_counts_vary_within_a_configuration(ops):
    r.get_fused_mapping(torch.randint(0, 64, (4, 8)), 64, 4 * 8 + 64 * 16, 16, True)
    ops.launches.clear()
    out = r.get_fused_mapping(torch.randint(0, 64, (9, 8)), 64, 100, 16, True)
    out2 = r.get_fused_mapping(torch.randint(0, 64, (9, 8)), 64, np.int64(101), 16, True)
    assert len(r.GET_FUSED_MAPPING.memo) == 2  # num_expanded_tokens: its type in the key, not its value
    assert out[0].shape == (100,) and out2[0].shape == (101,) and out[3].shape == (9, 8)
    assert ops.launches[0][2][-1] == 16 and ops.launches[0][2][-2].shape == (2, 64)
    y = torch.randn(50, 64)
    for tokens in (3, 9, 0):
        assert r.reduce_fused(y, torch.rand(tokens, 8), _ttp(tokens)).shape == (tokens, 64)
        assert r.expand_to_fused(y[:tokens], _ttp(tokens), torch.zeros(tokens * 3, dtype=I32)).shape == (tokens * 3, 64)
    assert len(r.REDUCE_FUSED.memo) == len(r.EXPAND_TO_FUSED.memo) == 1


def test_the_key_separates_what_the_checks_tell_apart():
    idx, y, w, ttp = torch.zeros(4, 8, dtype=I64), torch.zeros(50, 64), torch.rand(4, 8), torch.zeros(4, 8, dtype=I32)
    key = r.GET_FUSED_MAPPING.key
    assert key((idx, 64, 100, 16, True)) == key((idx, 64, 7, 16, True)) == key((idx[:1], 64, 0, 16, True))
    base = key((idx, 64, 100, 16, True))
    for other in [(idx, 64, np.int64(100), 16, True), (idx, np.int64(64), 100, 16, True), (idx, 64, 100, 16, 1),
                  (idx, 32, 100, 16, True), (idx, 64, 100, 8, True), (idx[:, :4], 64, 100, 16, True)]:
        assert key(other) != base, other
    key = r.REDUCE_FUSED.key
    base = key((y, w, ttp, "", None, None))
    assert key((y[:7], w, ttp, "", None, None)) == base
    for other in [((y, torch.ones(50)), w, ttp, "", None, None), (y, None, ttp, "", None, None),
                  (y, w, ttp, "e4m3", None, None), (y, w, ttp, "", torch.ones(1), None),
                  (y, w, ttp, "", None, torch.empty(4, 64)), (y.to(BF), w, ttp, "", None, None),
                  (torch.zeros(50, 32), w, ttp, "", None, None)]:
        assert key(other) != base
    key = r.EXPAND_TO_FUSED_WITH_SF.key
    data = torch.zeros(4, 576, dtype=E4M3)
    base = key(((data, torch.ones(4, 18)), 32, ttp, w[0].to(I32), False))
    for other in [((data, torch.ones(4, 5)), 32, ttp, w[0].to(I32), False), ((data, torch.ones(4, 18)), 128, ttp,
                  w[0].to(I32), False), ((data, torch.ones(4, 18, dtype=I32)), 32, ttp, w[0].to(I32), False)]:
        assert key(other) != base
    for bad in [(data, 32, ttp, w[0], False), ((data,), 32, ttp, w[0], False), ([data, data], 32, ttp, w[0], False)]:
        with pytest.raises((AttributeError, TypeError, IndexError, ValueError)):
            hash(key(bad))


def test_a_fake_call_stores_nothing(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tilebin.ops._torch import register_all, traced

    register_all()
    mode = FakeTensorMode()
    y, w, ttp = (mode.from_tensor(t) for t in (torch.zeros(50, 64), torch.rand(4, 8), torch.zeros(4, 8, dtype=I32)))
    with mode:
        out = traced("reduce_fused", y, w, ttp, "", None, None)
        traced("expand_to_fused", y[:4], ttp, mode.from_tensor(torch.zeros(50, dtype=I32)))
    assert out.shape == (4, 64) and not _memos() and not ops.launches


def test_a_numpy_num_expanded_tokens_replays_as_the_int(ops):
    idx = torch.randint(0, 64, (4, 8))
    want = describe(r.get_fused_mapping(idx, 64, 0, 16)), describe_launches(ops.launches)
    for _ in range(2):  # the checked first call of the numpy configuration, then its replay
        ops.launches.clear()
        assert (describe(r.get_fused_mapping(idx, 64, np.int32(0), 16)), describe_launches(ops.launches)) == want


@pytest.mark.parametrize("hidden, dtype, many", [
    (64, F32, "moe.reduce_fused_paired"), (3072, F32, "moe.reduce_fused_paired"),  # 12288 bytes: the limit
    (3076, F32, "moe.reduce_fused"), (6144, BF, "moe.reduce_fused_paired"), (6152, BF, "moe.reduce_fused"),
    (7168, F32, "moe.reduce_fused")])
def test_reduce_fused_kernel_by_token_count_and_row_bytes(ops, hidden, dtype, many):
    """moe.reduce_fused_few_tokens below _REDUCE_SPLIT_TOKENS tokens; from there on
    moe.reduce_fused_paired for rows of <= _PAIRED_ROW_BYTES bytes, else moe.reduce_fused: first
    call (checked) and memoized calls alike."""
    assert r._PAIRED_ROW_BYTES == 12288
    y = torch.randn(50, hidden).to(dtype)
    for tokens in (1, r._REDUCE_SPLIT_TOKENS - 1, r._REDUCE_SPLIT_TOKENS, 1, r._REDUCE_SPLIT_TOKENS + 1):
        ops.launches.clear()
        r.reduce_fused(y, torch.rand(tokens, 8), _ttp(tokens))
        want = many if tokens >= r._REDUCE_SPLIT_TOKENS else "moe.reduce_fused_few_tokens"
        assert [name for name, _, _ in ops.launches] == [want], tokens


def _misaligned(t):
    """``t``'s values in a view that starts 4 bytes into a fresh buffer (not 16-byte aligned)."""
    flat = torch.zeros(t.numel() + 16 // t.element_size(), dtype=t.dtype)
    view = flat[4 // t.element_size():][:t.numel()].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16
    return view


def test_misaligned_read_only_inputs_are_copied_on_a_replay_too(ops):
    ttp, pte = _ttp(4), torch.zeros(50, dtype=I32)
    y, w, ysf = torch.randn(50, 64), torch.rand(4, 8), torch.rand(50)
    data, sf = torch.zeros(4, 576, dtype=E4M3), torch.ones(4, 18)
    calls = [(r.expand_to_fused, lambda a: (y[:4], a(ttp), a(pte))),
             (r.expand_to_fused_with_sf, lambda a: ((data, a(sf)), 32, a(ttp), a(pte))),
             (r.reduce_fused, lambda a: ((y, a(ysf)), a(w), a(ttp), "e4m3", a(torch.ones(1))))]
    for fn, args in calls:
        ops.launches.clear()
        want = describe(fn(*args(lambda t: t))), describe_launches(ops.launches)
        for _ in range(2):  # memo warm with aligned inputs: misaligned ones are copied all the same
            ops.launches.clear()
            assert (describe(fn(*args(_misaligned))), describe_launches(ops.launches)) == want
            assert all(not t.data_ptr() % 16 for t in ops.launches[0][2] if isinstance(t, torch.Tensor))


# ---------------------------------------------------------------- refusals after a warm-up
def _error(fn, args):
    with pytest.raises(ArgumentError) as info:
        fn(*args)
    return str(info.value)


def _same_refusal(ops, warm, fn, *args):
    """The refusal with the memo empty equals the refusal with the memo warm (``warm()`` fills
    it); neither launches nor stores anything."""
    ops.fresh()
    ops.launches.clear()
    cold = _error(fn, args)
    assert not ops.launches and not _memos()
    warm()
    memos = {spec.name: dict(spec.memo) for spec in r.SPECS}
    assert any(memos.values()), "warm-up did not fill the memo"
    ops.launches.clear()
    assert _error(fn, args) == cold
    assert not ops.launches and {spec.name: dict(spec.memo) for spec in r.SPECS} == memos
    return cold


def test_get_fused_mapping_refusals_after_warm_up(ops):
    idx = torch.randint(0, 64, (4, 8))
    warm = lambda: r.get_fused_mapping(idx, 64, 1000, 16, True)  # noqa: E731
    for args, match in [((idx, 64, -1, 16, True), "num_expanded_tokens=-1 is out of range"),
                        ((idx, 64, 2**31, 16, True), "num_expanded_tokens=2147483648 is out of range"),
                        ((idx, 64, True, 16, True), "num_expanded_tokens must be an int, got bool"),
                        ((idx, 64, 1000.0, 16, True), "num_expanded_tokens must be an int, got float"),
                        ((idx, 64, np.int64(-5), 16, True), "num_expanded_tokens=-5 is out of range"),
                        ((idx, 64, 1000, 16, 1.0), "force_no_sync must be a bool"),
                        ((idx, True, 1000, 16, True), "num_experts must be an int, got bool"),
                        ((torch.randint(0, 64, (8, 4)).t(), 64, 1000, 16, True), "topk_idx must be contiguous")]:
        assert match in _same_refusal(ops, warm, r.get_fused_mapping, *args)
    # the slot count depends on the token count: 1024 experts x (2**20 - 1) padding leave room for 1024 entries
    warm = lambda: r.get_fused_mapping(idx, 1024, 64, 2**20, True)  # noqa: E731
    big = torch.zeros(200, 8, dtype=I64)
    assert "200 x 8 entries plus 1024 x (alignment 1048576 - 1) padding exceed 2**30 slots" in _same_refusal(
        ops, warm, r.get_fused_mapping, big, 1024, 64, 2**20, True)


def test_expand_to_fused_refusals_after_warm_up(ops):
    x, ttp, pte = torch.zeros(4, 64, dtype=BF), torch.zeros(4, 8, dtype=I32), torch.zeros(50, dtype=I32)
    warm = lambda: r.expand_to_fused(x, ttp, pte)  # noqa: E731
    for args, match in [((_misaligned(x), ttp, pte), "x's data pointer 0x"),
                        ((torch.zeros(64, 4, dtype=BF).t(), ttp, pte), "x must be contiguous"),
                        ((x, torch.zeros(5, 8, dtype=I32), pte), "token_topk_to_pos has 5 rows but x has 4 tokens"),
                        ((x, torch.zeros(8, 4, dtype=I32).t(), pte), "token_topk_to_pos must be contiguous"),
                        ((x, ttp, torch.zeros(100, dtype=I32)[::2]), "pos_to_expert must be contiguous")]:
        assert match in _same_refusal(ops, warm, r.expand_to_fused, *args)


def test_expand_to_fused_with_sf_refusals_after_warm_up(ops):
    data, sf = torch.zeros(4, 576, dtype=E4M3), torch.ones(4, 18)
    ttp, pte = torch.zeros(4, 8, dtype=I32), torch.zeros(50, dtype=I32)
    warm = lambda: r.expand_to_fused_with_sf((data, sf), 32, ttp, pte)  # noqa: E731
    for args, match in [(((_misaligned(data), sf), 32, ttp, pte), "x[0] (data)'s data pointer 0x"),
                        (((torch.zeros(576, 4, dtype=E4M3).t(), sf), 32, ttp, pte), "(data) must be contiguous"),
                        (((data, torch.ones(18, 4).t()), 32, ttp, pte), "x[1] (sf) must be contiguous"),
                        (((data, torch.ones(5, 18)), 32, ttp, pte), "x[1] (sf) has shape (5, 18); for data (4, 576)"),
                        (((data, sf), 32, torch.zeros(3, 8, dtype=I32), pte), "3 rows but x has 4 tokens"),
                        (((data, sf), 32, ttp, torch.zeros(100, dtype=I32)[::2]), "pos_to_expert must be contiguous"),
                        (((data, sf, sf), 32, ttp, pte), "must be a (data, sf) tuple"),
                        ((data, 32, ttp, pte), "must be a (data, sf) tuple")]:
        assert match in _same_refusal(ops, warm, r.expand_to_fused_with_sf, *args)
    warm = lambda: r.expand_to_fused_with_sf((data, torch.ones(4, 5, dtype=I32)), 32, ttp, pte, True)  # noqa: E731
    assert "it must be (4, 5)" in _same_refusal(ops, warm, r.expand_to_fused_with_sf,
                                               (data, torch.ones(6, 5, dtype=I32)), 32, ttp, pte, True)


def test_reduce_fused_refusals_after_warm_up(ops):
    y, ysf, w, ttp = torch.zeros(50, 64), torch.rand(50), torch.rand(4, 8), torch.zeros(4, 8, dtype=I32)
    good = dict(x=(y, ysf), topk_weights=w, token_topk_to_pos=ttp, fp8_format="e4m3", sf=torch.ones(1),
                out=torch.empty(4, 64, dtype=E4M3))
    warm = lambda: r.reduce_fused(**good)  # noqa: E731
    for over, match in [(dict(x=(y, torch.rand(49))), "x_sf has 49 scales but x has 50 rows"),
                        (dict(x=(y, torch.rand(100)[::2])), "x_sf must be contiguous"),
                        (dict(x=(y, ysf, 1)), "got a tuple of 3"), (dict(x=(y, None)), "x_sf None"),
                        (dict(x=(torch.zeros(64, 50).t(), ysf)), "x must be contiguous"),
                        (dict(x=(_misaligned(y), ysf)), "x's data pointer 0x"),
                        (dict(topk_weights=torch.rand(5, 8)), "topk_weights has shape (5, 8) but token_topk_to_pos"),
                        (dict(topk_weights=torch.rand(8, 4).t()), "topk_weights must be contiguous"),
                        (dict(token_topk_to_pos=torch.zeros(8, 4, dtype=I32).t()), "token_topk_to_pos must be contig"),
                        (dict(out=torch.empty(5, 64, dtype=E4M3)), "out has shape (5, 64); it must be (4, 64)"),
                        (dict(out=torch.empty(64, 4, dtype=E4M3).t()), "out must be contiguous"),
                        (dict(out=_misaligned(torch.empty(4, 64, dtype=E4M3))), "out's data pointer 0x"),
                        (dict(out=torch.empty(4, 64, dtype=BF)), "out has dtype bfloat16; supported: float8_e4m3fn"),
                        (dict(out=[1]), "out must be a torch.Tensor, got list"),
                        (dict(fp8_format="e5m2"), "fp8_format='e5m2' is not supported"),
                        (dict(sf=torch.ones(2)), "sf has shape (2,)")]:
        assert match in _same_refusal(ops, warm, r.reduce_fused, *{**good, **over}.values())


@pytest.mark.parametrize("sf", [1.0, "x", torch.ones(1), torch.ones(4, dtype=I32), torch.ones(2)], ids=repr)
def test_an_sf_without_e4m3_is_refused_as_such_whatever_it_is(ops, sf):
    """fp8_format '' takes no sf: that refusal comes before sf's own checks (as it did by hand)."""
    y, w, ttp = torch.zeros(50, 64), torch.rand(4, 8), torch.zeros(4, 8, dtype=I32)
    msg = _same_refusal(ops, lambda: r.reduce_fused(y, w, ttp), r.reduce_fused, y, w, ttp, "", sf)
    assert msg.startswith("reduce_fused: sf is supported with fp8_format='e4m3' only")


def test_a_refused_call_stores_nothing_and_changes_no_later_call(ops):
    y, w, ttp = torch.zeros(50, 64), torch.rand(4, 8), torch.zeros(4, 8, dtype=I32)
    with pytest.raises(ArgumentError, match="sf is supported with fp8_format='e4m3' only"):
        r.reduce_fused(y, w, ttp, "", torch.ones(1))
    assert not _memos() and not ops.launches
    out = r.reduce_fused(y, w, ttp, "e4m3", torch.ones(1))
    assert out.dtype == E4M3 and len(ops.launches) == 1
    with pytest.raises(ArgumentError, match="sf is supported with fp8_format='e4m3' only"):
        r.reduce_fused(y, w, ttp, "", torch.ones(1))


def test_the_out_form_compiles_to_reduce_fused_out(ops):
    """Under torch.compile(fullgraph=True) reduce_fused(..., out=buf) records tilebin::reduce_fused_out
    (which writes buf) and returns buf; launches as the eager call does."""
    from tilebin.ops._torch import register_all

    register_all()
    torch._dynamo.reset()
    y, w, ttp = torch.zeros(50, 64), torch.rand(4, 8), torch.zeros(4, 8, dtype=I32)
    buf = torch.empty(4, 64)
    assert r.reduce_fused(y, w, ttp, "", None, buf) is buf
    want = describe_launches(ops.launches)
    ops.launches.clear()
    compiled = torch.compile(lambda a, b, c, o: r.reduce_fused(a, b, c, "", None, o), fullgraph=True,
                             backend="aot_eager")
    assert compiled(y, w, ttp, buf) is buf
    assert describe_launches(ops.launches) == want


@pytest.mark.parametrize("slots", (0, 300), ids=("sized by the counts", "given"))
def test_the_mapping_outputs_are_separate_allocations(ops, slots):
    """Each of get_fused_mapping's seven tensors has its own storage (as tile_kernels' have), cold and warm."""
    for _ in range(2):
        out = r.get_fused_mapping(torch.randint(0, 64, (4, 8)), 64, slots, 16)
        storages = {t.untyped_storage().data_ptr() for t in out[:7]}
        assert len(storages) == 7 and all(t.is_contiguous() for t in out[:7])
        assert out[7] == ([1] * 64 if slots == 0 else [])
