"""``ops/_spec.py`` (CPU, launcher stubbed): an op declared by an OpSpec checks, memoizes, replays
and registers as its declaration says."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ops_stub import StubbedOps
from tilebin.ops import _spec
from tilebin.ops.moe import _stats as st
from tilebin.ops.transpose import _transpose as tr
from tilebin.runtime import ArgumentError

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

SPECS = st.SPECS + tr.SPECS


@pytest.fixture
def ops(monkeypatch):
    return StubbedOps(monkeypatch)


def _idx(tokens=4, topk=2, dtype=torch.int64):
    return torch.zeros((tokens, topk), dtype=dtype)


def test_every_spec_is_the_public_op():
    for spec in SPECS:
        module = st if spec in st.SPECS else tr
        fn = getattr(module, spec.name)
        assert fn.__name__ == spec.name and fn.__doc__


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_schema_comes_from_the_parameters(spec):
    schema = spec.schema()
    for p in spec.params:
        assert f" {p.name}" in schema
    assert ("Tensor(a!)" in schema) == any(getattr(p, "mutated", False) for p in spec.params)
    assert spec.torch_op(lambda *a: None).schema == schema


def test_written_schemas():
    assert st.MASK_INDICES_BY_TP.schema() == ("(Tensor indices, int n, int num_ep_ranks, int tp_rank, "
                                              "int num_tp_ranks) -> Tensor")
    assert st.INPLACE_UNIQUE_GROUP_INDICES.schema() == "(Tensor(a!) group_indices, int num_groups) -> ()"
    assert st.NORMALIZE_WEIGHT.schema() == "(Tensor topk_weights) -> (Tensor, Tensor)"


def test_a_configuration_is_checked_once_then_replayed(ops, monkeypatch):
    checked = []
    real = _spec.OpSpec.checked
    monkeypatch.setattr(_spec.OpSpec, "checked", lambda self, a, k: checked.append(self.name) or real(self, a, k))
    for tokens in (3, 4001, 1, 0):  # the token count is not part of the configuration
        st.aux_fi(_idx(tokens), 64, 2)
    assert checked == ["aux_fi"] and len(st.AUX_FI.memo) == 1
    launched = [(name, key) for name, key, _ in ops.launches]
    assert launched[0] == ("moe.aux_fi", {"mode": "single", "unroll": 8})
    assert launched[1][1]["mode"] == "arrivals"  # 4001 x 2 entries: the grid, decided per call
    st.aux_fi(_idx(3, 4), 64, 2)  # another top-k: another configuration
    st.aux_fi(_idx(3), 64, np.int64(2))  # another scalar type: another configuration
    assert checked == ["aux_fi"] * 3 and len(st.AUX_FI.memo) == 3


def test_the_compiled_key_serves_a_replay_and_falls_back_for_other_tensors(ops, key_path, monkeypatch):
    """With the compiled key (csrc/_hot_opkey.h) a configuration is stored under the tensors' bytes;
    a tensor the C call does not read (a subclass) takes the Python key: its own configuration."""
    class Sub(torch.Tensor):
        pass

    checked = []
    real = _spec.OpSpec.checked
    monkeypatch.setattr(_spec.OpSpec, "checked", lambda self, a, k: checked.append(self.name) or real(self, a, k))
    st.aux_fi(_idx(3), 64, 2)
    st.aux_fi(_idx(5), 64, 2)  # a replay
    (key,) = st.AUX_FI.memo
    assert isinstance(key[0], bytes) == (key_path == "compiled key") and checked == ["aux_fi"]
    st.aux_fi(_idx(3).as_subclass(Sub), 64, 2)
    st.aux_fi(_idx(4).as_subclass(Sub), 64, 2)  # a replay of the Python key's configuration
    assert len(st.AUX_FI.memo) == (2 if key_path == "compiled key" else 1) and len(ops.launches) == 4
    with pytest.raises(ArgumentError, match="must be contiguous"):
        st.aux_fi(_idx(4, 4)[:, ::2], 64, 2)


def test_true_and_one_are_different_configurations(ops):
    st.group_count(_idx(), 1)
    with pytest.raises(ArgumentError, match="num_groups must be an int, got bool True"):
        st.group_count(_idx(), True)


def test_a_replayed_configuration_still_runs_the_per_call_checks(ops):
    st.normalize_weight(torch.ones((4, 8)))
    assert len(st.NORMALIZE_WEIGHT.memo) == 1
    before = len(ops.launches)
    with pytest.raises(ArgumentError, match="must be contiguous"):
        st.normalize_weight(torch.ones((8, 4)).t())
    assert len(ops.launches) == before


def test_a_replayed_configuration_still_checks_the_size_limit(monkeypatch):
    """The declared limit is checked on every call (the generated call tests it inline, then lets
    ``check_call`` say why)."""
    runs = []
    spec = _spec.OpSpec("limited", (_spec.TensorParam("w", (torch.float32,), 2, max_numel=16),), "()",
                        lambda values: (lambda w: runs.append(w.shape[0])))
    monkeypatch.setattr(_spec, "check_cuda", lambda *a, **k: None)
    spec.call(torch.ones((2, 8)))
    spec.call(torch.ones((1, 8)))  # a replay
    with pytest.raises(ArgumentError, match="w has 4 x 8 entries, more than 2\\*\\*4; split the tokens"):
        spec.call(torch.ones((4, 8)))  # the same configuration, too many rows
    assert runs == [2, 1] and len(spec.memo) == 1


def test_a_failed_call_stores_nothing_and_changes_no_later_call(ops):
    with pytest.raises(ArgumentError, match="tp_rank=2 is out of range"):
        st.mask_indices_by_tp(_idx(), 64, 8, 2, 2)
    assert not st.MASK_INDICES_BY_TP.memo and not ops.launches
    out = st.mask_indices_by_tp(_idx(), 64, 8, 1, 2)
    assert out.shape == (4, 2) and len(ops.launches) == 1
    with pytest.raises(ArgumentError, match="tp_rank=2 is out of range"):  # the memo never serves it
        st.mask_indices_by_tp(_idx(), 64, 8, 2, 2)


def test_the_device_is_checked_last_and_not_skipped_by_the_memo(monkeypatch):
    """Without the stubbed device check, CPU tensors get every other check, then the device error;
    a memo filled under a stub in another test never serves them (the stub swaps the memo)."""
    with pytest.raises(ArgumentError, match="num_groups=0 is out of range"):
        st.group_count(_idx(), 0)
    for _ in range(2):
        with pytest.raises(ArgumentError, match="not a CUDA device"):
            st.group_count(_idx(), 8)
    assert not st.GROUP_COUNT.memo


def test_a_wrong_argument_type_takes_the_checked_path(ops):
    st.normalize_weight(torch.ones((4, 8)))
    with pytest.raises(ArgumentError, match="must be a torch.Tensor, got list"):
        st.normalize_weight([[1.0]])
    with pytest.raises(ArgumentError, match="num_experts must be an int, got list"):
        st.aux_fi(_idx(), [64], 2)


def test_the_generic_key_equals_for_equal_configurations():
    spec = _spec.OpSpec("toy", (_spec.IntParam("n"), _spec.TensorParam("x", (torch.float32,), None)), "Tensor",
                        lambda values: None)
    a, b = torch.zeros(3, 4), torch.zeros(9, 4)
    assert spec.key((2, a)) == spec.key((2, b)) != spec.key((True, a))
    assert spec.key((2, a)) != spec.key((2, torch.zeros(3, 5)))
    with pytest.raises(AttributeError):
        spec.key((2, [1.0]))


def test_a_limit_that_is_not_a_power_of_two_is_named_as_is():
    param = _spec.TensorParam("w", (torch.float32,), 2, max_numel=10)
    with pytest.raises(ArgumentError, match="w has 3 x 4 entries, more than 10; split the tokens"):
        param.check_call("toy", torch.zeros(3, 4))


def test_the_generated_key_separates_what_the_checks_distinguish():
    """Declared ranks read sizes by index (exact given the rank in the key); a tensor whose rows do
    not vary keys its whole shape; None and a tensor differ; a float by its bits; a wrong argument
    count or a non-tensor raises (the caller takes the checked path)."""
    f32 = (torch.float32,)
    spec = _spec.OpSpec("toy", (_spec.TensorParam("x", f32, 2), _spec.TensorParam("w", f32, 1, rows_vary=False),
                                _spec.TensorParam("m", f32, 2, optional=True), _spec.IntParam("n"),
                                _spec.Param("c", "float", lambda op, v: v)), "Tensor", lambda values: None)
    x, w = torch.zeros(3, 4), torch.zeros(8)
    key = spec.key
    assert key((x, w, None, 2, 1.0)) == key((torch.zeros(7, 4), w, None, 2, 1.0))
    assert key((x, w, None, 2, 1.0)) != key((torch.zeros(3, 5), w, None, 2, 1.0))
    assert key((x, w, None, 2, 1.0)) != key((x, torch.zeros(9), None, 2, 1.0))  # the whole shape of w
    assert key((x, w, None, 2, 1.0)) != key((x, w, torch.zeros(3, 4), 2, 1.0))
    assert key((x, w, None, 2, 0.0)) != key((x, w, None, 2, -0.0))
    assert key((x, w, None, 2, (128, 128))) != key((x, w, None, 2, (128.0, 128.0)))  # tuples element-wise
    assert key((x, w, None, 2, "a")) == key((x, w, None, 2, "a")) != key((x, w, None, 2, None))
    assert key((x, w, None, 2, 1.0)) != key((x, w, None, True, 1.0)) != key((x, w, None, 2.0, 1.0))
    assert key((x, w, None, 2, 1.0)) != key((torch.zeros(3), w, None, 2, 1.0))  # rank 1: len differs
    assert key((x, w, None, 2, 1.0)) != key((torch.zeros(3, 2, 4), w, None, 2, 1.0))
    c = lambda value: key((x, w, None, 2, value))  # noqa: E731 - the key of the generic Param c
    assert c(np.float64(0.0)) != c(np.float64(-0.0)) != c(-0.0)  # float subclasses by their bits too
    assert c(float("nan")) == c(float("nan")) != c(np.float64("nan"))  # a NaN finds its configuration again
    assert c(1.5) == c(1.5) != c(np.float64(1.5)) and c(1.5) != c(3 / 2 + 2**-52)
    assert c((1, 2)) == c((1, 2)) != c([1, 2]) != c((1, 2.0)) and c((1, 2)) != c((1, True)) != c((1, 2, 3))
    assert c(torch.float32) == c(torch.float32) != c(torch.bfloat16)
    with pytest.raises(ValueError):
        key((x, w, None, 2))
    with pytest.raises(AttributeError):
        key(([1.0], w, None, 2, 1.0))


def test_ptr_align_is_checked_on_every_call(monkeypatch):
    """A ``ptr_align`` parameter's data pointer is checked on the first call and on every replay (an
    empty tensor has nothing to align); a refused call launches nothing and stores nothing."""
    runs = []
    spec = _spec.OpSpec("aligned_demo", (_spec.TensorParam("out", (torch.float32,), 1, mutated=True, ptr_align=16),),
                        "()", lambda values: (lambda out: runs.append(out.shape[0])))
    monkeypatch.setattr(_spec, "check_cuda", lambda *a, **k: None)
    buf = torch.zeros(64)
    with pytest.raises(ArgumentError, match=r"out's data pointer 0x[0-9a-f]+ is not 16-byte aligned"):
        spec(buf[1:9])  # a first call
    assert not spec.memo and not runs
    spec(buf[:8])
    spec(buf[4:13])  # 16 bytes in: aligned, a replay
    with pytest.raises(ArgumentError, match="not 16-byte aligned"):
        spec(buf[1:10])  # a replay of the stored configuration
    spec(buf[1:1])
    assert runs == [8, 9, 0] and len(spec.memo) == 1


def test_the_generated_call_is_the_op(ops):
    """``spec.call`` (what the public functions call) and ``spec(...)`` are one op: the same memo,
    checks and results; a wrong argument count through ``spec(...)`` is the checks' error."""
    out = st.NORMALIZE_WEIGHT.call(torch.ones((4, 8)))
    assert len(st.NORMALIZE_WEIGHT.memo) == 1
    again = st.NORMALIZE_WEIGHT(torch.ones((4, 8)))
    assert [t.shape for t in out] == [t.shape for t in again] and len(ops.launches) == 2
    with pytest.raises(ArgumentError, match="takes 1 arguments, got 2"):
        st.NORMALIZE_WEIGHT(torch.ones((4, 8)), 1)
    with pytest.raises(ArgumentError, match="must be a torch.Tensor, got list"):
        st.NORMALIZE_WEIGHT.call([[1.0]])


def test_is_compiling_routes_the_generated_call_to_the_custom_op(ops, monkeypatch):
    """``torch.compiler.is_compiling()`` (export's flag here) sends a call to ``tilebin::<name>``,
    as it always did; the generated call reads the same flag without its scripting check."""
    traced = []
    monkeypatch.setattr(_spec, "traced", lambda name, *args: traced.append((name, len(args))) or "traced")
    spec = _spec.OpSpec("toy_traced", (_spec.TensorParam("x", (torch.float32,), 2),), "Tensor",
                        lambda values: (lambda x: "eager"))
    monkeypatch.setattr(_spec, "check_cuda", lambda *a, **k: None)
    assert spec.call(torch.ones(2, 2)) == "eager"
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert torch.compiler.is_compiling()
    assert spec.call(torch.ones(2, 2)) == "traced" and spec(torch.ones(2, 2)) == "traced"
    assert traced == [("toy_traced", 1)] * 2


def _cases():
    """2-D tensors a replayed call may get: contiguous or not, empty with odd strides, misaligned."""
    base = torch.zeros(4096, dtype=torch.bfloat16)
    yield torch.zeros(4, 64, dtype=torch.bfloat16)
    yield torch.zeros(0, 64, dtype=torch.bfloat16)
    yield torch.zeros(64, 4, dtype=torch.bfloat16).t()
    yield torch.empty_strided((0, 64), (64, 2), dtype=torch.bfloat16)
    yield torch.empty_strided((0, 64), (1, 0), dtype=torch.bfloat16)
    yield torch.empty_strided((3, 1), (1, 5), dtype=torch.bfloat16)
    yield base[1:129].view(2, 64)
    yield base[8:136].view(2, 64)
    yield base[:128].view(2, 64)[:, ::2]
    yield torch.zeros(1, 64, dtype=torch.bfloat16).expand(2**25, 64)  # 2**31 elements (not contiguous)
    yield torch.empty_strided((2**25, 64), (64, 1), dtype=torch.bfloat16, device="meta")  # 2**31, contiguous


def test_call_tests_hold_whenever_check_call_raises():
    """A parameter's ``call_test`` (the generated call's cheap test before ``check_call``) is true for
    every tensor ``check_call`` refuses: the per-block and per-channel inputs, and pos_to_token."""
    from tilebin.ops.quant import _per_block as pb, _per_channel as pc

    params = [pb.PER_BLOCK_CAST.params[0], pc.PER_CHANNEL_CAST.params[0], pc.PER_CHANNEL_CAST_FUSED.params[5]]
    refused = 0
    for p in params:
        test = _spec._call_test(p, "a", "s")
        assert test is not None
        for t in (*_cases(), None, torch.zeros(8, dtype=torch.int32), torch.zeros(16, dtype=torch.int32)[::2],
                  torch.zeros(9, dtype=torch.int32)[1:]):
            if (t is None and not p.optional) or (t is not None and t.dim() != p.ndim):
                continue
            try:
                p.check_call("op", t)
            except ArgumentError:
                refused += 1
                assert eval(test, {"a": t, "s": None if t is None else t.shape}), (p.name, t.shape, t.stride())  # noqa: S307
    assert refused >= 10


def test_with_one_gpu_a_key_holds_is_cuda_and_never_serves_another_device(monkeypatch):
    """Where the process sees one CUDA device, keys hold a tensor's ``is_cuda`` for its device (every
    CUDA tensor is on it; ``t.device`` is a new object per read, costly to hash and compare): the
    generated key and the hand-written key parts alike.  A configuration stored for CUDA tensors
    never serves a tensor that is not on CUDA.  (Here CPU tensors stand in for CUDA ones:
    ``is_cuda`` patched to mean "on the CPU"; meta tensors then stand for any other device.)"""
    from tilebin.ops import _common
    from tilebin.ops.quant import _cast_back

    monkeypatch.setattr(_common.SOLE_GPU, "on", True)
    monkeypatch.setattr(_common.SOLE_GPU, "_settled", True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t.device.type == "cpu"))
    monkeypatch.setattr(_spec, "check_cuda", lambda *a, **k: None)
    f32 = (torch.float32,)
    runs: list = []
    spec = _spec.OpSpec("toy", (_spec.TensorParam("x", f32, 2), _spec.TensorParam("w", f32, 1, rows_vary=False)),
                        "Tensor", lambda values: lambda x, w: runs.append(x.device.type))
    x, w = torch.zeros(3, 4), torch.zeros(8)
    key = spec.key((x, w))
    assert key.count(True) == 2 and not any(isinstance(part, torch.device) for part in key)
    pair = _cast_back._pair_key((torch.zeros(2, 64, dtype=torch.float8_e4m3fn), torch.ones(2, 1)))
    assert not any(isinstance(part, torch.device) for part in pair)
    checked: list = []
    real = _spec.OpSpec.checked
    monkeypatch.setattr(_spec.OpSpec, "checked", lambda s, args, k: checked.append(1) or real(s, args, k))
    spec.call(x, w)
    spec.call(torch.zeros(5, 4), w)  # replayed: the same configuration
    assert len(checked) == 1
    spec.call(torch.zeros(5, 4, device="meta"), w)  # is_cuda differs: checked, never replayed
    spec.call(x, torch.zeros(8, device="meta"))
    assert len(checked) == 3 and runs == ["cpu", "cpu", "meta", "cpu"]


def test_without_cuda_keys_hold_the_device():
    """On a machine without CUDA (this one in CI), keys hold ``t.device``, as with several GPUs."""
    from tilebin.ops import _common

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU suite covers one-GPU keys")
    spec = _spec.OpSpec("toy", (_spec.TensorParam("x", (torch.float32,), 2),), "Tensor", lambda values: None)
    assert torch.device("cpu") in spec.key((torch.zeros(3, 4),)) and _common.SOLE_GPU.on is False


def test_rows_of_is_tested_on_every_call_and_sends_a_mismatch_to_the_checks(monkeypatch):
    """``rows_of``: a replayed call whose token counts differ takes the checked path, where the op's
    own check raises (no launch); equal counts replay.  A misdeclared ``rows_of`` fails at import."""
    monkeypatch.setattr(_spec, "check_cuda", lambda *a, **k: None)
    f32 = (torch.float32,)
    launched: list = []

    def relations(op, values):
        if values["y"].shape[0] != values["x"].shape[0]:
            raise _spec.fail(op, "y needs a row per row of x")

    spec = _spec.OpSpec("toy", (_spec.TensorParam("x", f32, 2), _spec.TensorParam("y", f32, 1, rows_of="x")),
                        "Tensor", lambda values: lambda x, y: launched.append(x.shape[0]), relations=relations)
    spec.call(torch.zeros(3, 4), torch.zeros(3))
    spec.call(torch.zeros(5, 4), torch.zeros(5))
    with pytest.raises(ArgumentError, match="toy: y needs a row per row of x"):
        spec.call(torch.zeros(5, 4), torch.zeros(6))
    assert launched == [3, 5] and len(spec.memo) == 1
    for bad in (_spec.TensorParam("y", f32, 1, rows_of="z"), _spec.TensorParam("y", f32, None, rows_of="x"),
                _spec.TensorParam("y", f32, 1, rows_of="x", optional=True)):
        with pytest.raises(ValueError, match="rows_of"):
            _spec.OpSpec("toy", (_spec.TensorParam("x", f32, 2), bad), "Tensor", lambda values: None)


def test_fast_runs_where_the_compiled_key_tested_it(key_path, monkeypatch):
    """A TensorParam's Fast is tested by the compiled key only: a replay that passes it runs
    ``run.fast``, one that fails it (a misaligned view here) runs ``run``, as every call does with
    the Python key; a plan whose run lacks ``.fast`` is a declaration error."""
    ran = []

    def plan(values):
        def run(w):
            ran.append("run")

        run.fast = lambda w: ran.append("fast")
        return run

    monkeypatch.setattr(_spec, "check_cuda", lambda *a, **k: None)
    spec = _spec.OpSpec("fast_op", (_spec.TensorParam("w", (torch.float32,), 2, fast=_spec.Fast(align=16)),), "()",
                        plan)
    w = torch.zeros(5, 8)
    spec.call(w)  # the first call: checked, then run
    spec.call(w)
    spec.call(torch.zeros(41)[1:].view(5, 8))  # 4-byte aligned: not Fast
    compiled = key_path == "compiled key"
    assert ran == ["run", "fast" if compiled else "run", "run"]
    broken = _spec.OpSpec("no_fast", spec.params, "()", lambda values: (lambda w: None))
    with pytest.raises(TypeError, match="no_fast: a parameter declares Fast, so its plan's run needs run.fast"):
        broken.call(w)
