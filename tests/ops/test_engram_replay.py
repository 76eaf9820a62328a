"""The Engram ops' OpSpecs (CPU, launcher stubbed): schemas as registered before the OpSpecs, a
memoized configuration launches exactly what its checked first call launches, and every fact the
memo key leaves out (token counts that must agree, strides, data pointers, sizes, the outputs'
overlap) is refused on a replay with the message a fresh process gives, before any launch and
without storing anything."""

from __future__ import annotations

import re

import pytest
import torch

from ops_stub import StubbedOps, describe, describe_launches
from tilebin.ops.engram import _gate as gt, _hash as hs
from tilebin.runtime import ArgumentError

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

BF, F32, I32, I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
SPECS = hs.SPECS + gt.SPECS


@pytest.fixture
def ops(monkeypatch):
    return StubbedOps(monkeypatch)


# the TorchOp schema strings of these ops before their OpSpecs (tilebin::<op> must not change), but for
# engram_gate_fwd's result: five tensors since its statistics are separate allocations (they were rows of one
# [4, tokens, hc] tensor, which the custom op returned)
SCHEMAS = {
    "engram_hash": "(Tensor ngram_token_ids, Tensor multipliers, Tensor vocab_sizes, Tensor offsets) -> Tensor",
    "fused_weight": "(Tensor weight_hidden, Tensor weight_embed) -> Tensor",
    "engram_gate_fwd": "(Tensor hidden_states, Tensor k, Tensor v, Tensor weight_fused, float eps, "
                       "float clamp_value, bool save_for_backward=True) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "engram_gate_bwd": "(Tensor grad_out, Tensor hidden_states, Tensor k, Tensor v, Tensor weight_fused, "
                       "Tensor dot, Tensor gate_score, Tensor rstd_x, Tensor rstd_k, float clamp_value) "
                       "-> (Tensor, Tensor, Tensor, Tensor)",
    "grad_w_reduce": "(Tensor grad_w_partial, Tensor weight_hidden, Tensor weight_embed, "
                     "Tensor(a!) grad_weight_hidden, Tensor(b!) grad_weight_embed) -> ()",
}


def test_schemas_are_unchanged():
    declared = {op.name: op.schema for op in hs.TORCH_OPS + gt.TORCH_OPS}
    assert declared == SCHEMAS
    assert {spec.name: spec.schema() for spec in SPECS} == SCHEMAS
    fwd = {op.name: op for op in gt.TORCH_OPS}["engram_gate_fwd"]
    assert fwd.result_to_schema is gt._fwd_result and fwd.result_to_public is gt._fwd_public
    assert all(op.fake == spec.fake for op, spec in zip(hs.TORCH_OPS + gt.TORCH_OPS, SPECS))


def test_the_public_ops_are_their_specs():
    for spec in SPECS:
        module = hs if spec in hs.SPECS else gt
        fn = getattr(module, spec.name)
        assert fn.__name__ == spec.name and fn.__doc__


# ---------------------------------------------------------------- valid calls
def _hash(tokens=4, n=3, layers=2, tables=8, device="cpu"):
    return [torch.zeros((tokens, n), dtype=I32, device=device), torch.ones((layers, n), dtype=I64, device=device),
            torch.full((layers, n - 1, tables), 7, dtype=I32, device=device),
            torch.zeros((layers, (n - 1) * tables), dtype=I32, device=device)]


def _fwd(tokens=4, hc=4, hidden=64, device="cpu"):
    return [torch.zeros((tokens, hc, hidden), dtype=BF, device=device),
            torch.zeros((tokens, hc, hidden), dtype=BF, device=device),
            torch.zeros((tokens, hidden), dtype=BF, device=device), torch.zeros((hc, hidden), device=device),
            1e-20, 1e-6, True]


def _bwd(tokens=4, hc=4, hidden=64, device="cpu"):
    x, k, v, w = _fwd(tokens, hc, hidden, device)[:4]
    stats = [torch.zeros((tokens, hc), device=device) for _ in range(4)]
    return [torch.zeros((tokens, hc, hidden), dtype=BF, device=device), x, k, v, w, *stats, 1e-6]


def _reduce(blocks=7, hc=4, hidden=64):
    return [torch.zeros((blocks, hc, hidden)), torch.zeros((hc, hidden), dtype=BF), torch.zeros((hc, hidden), dtype=BF),
            torch.zeros((hc, hidden)), torch.zeros((hc, hidden))]


def _strided_kv(tokens=4, hc=4, hidden=64):
    kv = torch.zeros((tokens, hc, 2 * hidden + 8), dtype=BF)
    return kv[:, :, 8:8 + hidden], kv[:, 1, 8 + hidden:8 + 2 * hidden]


def _with(args, **changes):
    names = {"k": 1, "v": 2}
    out = list(args)
    for name, value in changes.items():
        out[names[name]] = value
    return out


CASES = {
    "engram_hash": lambda: (hs.engram_hash, _hash()),
    "engram_hash_0_tokens": lambda: (hs.engram_hash, _hash(tokens=0, n=2, tables=1)),
    "fused_weight": lambda: (hs.fused_weight, [torch.zeros((4, 64), dtype=BF), torch.zeros((4, 64), dtype=BF)]),
    "fused_weight_hc0": lambda: (hs.fused_weight, [torch.zeros((0, 64), dtype=BF), torch.zeros((0, 64), dtype=BF)]),
    "gate_fwd": lambda: (gt.engram_gate_fwd, _fwd()),
    "gate_fwd_no_save": lambda: (gt.engram_gate_fwd, _fwd()[:6] + [False]),
    "gate_fwd_int_eps": lambda: (gt.engram_gate_fwd, _fwd()[:4] + [0, 1, True]),
    "gate_fwd_strided_kv": lambda: (gt.engram_gate_fwd, _with(_fwd(), **dict(zip("kv", _strided_kv())))),
    "gate_fwd_0_tokens": lambda: (gt.engram_gate_fwd, _fwd(tokens=0)),
    "gate_bwd": lambda: (gt.engram_gate_bwd, _bwd()),
    "gate_bwd_0_tokens": lambda: (gt.engram_gate_bwd, _bwd(tokens=0)),
    "grad_w_reduce": lambda: (gt.grad_w_reduce, _reduce()),
    "grad_w_reduce_hc0": lambda: (gt.grad_w_reduce, _reduce(hc=0)),
    "grad_w_reduce_0_blocks": lambda: (gt.grad_w_reduce, _reduce(blocks=0)),
}


def _spec_of(fn):
    return next(spec for spec in SPECS if spec.name == fn.__name__)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_replay_launches_what_the_checked_call_launches(ops, name):
    fn, args = CASES[name]()
    spec = _spec_of(fn)
    cold = fn(*args)
    cold_launches = describe_launches(ops.launches)
    assert len(spec.memo) == 1
    ops.launches.clear()
    warm = fn(*args)
    assert describe_launches(ops.launches) == cold_launches and describe(warm) == describe(cold)
    assert len(spec.memo) == 1


def test_the_scalars_launched_are_the_checked_ones(ops):
    gt.engram_gate_fwd(*_fwd()[:4], 0, 1, True)  # ints: launched as the floats the kernel takes
    gt.engram_gate_fwd(*_fwd()[:4], 0, 1, True)
    gt.engram_gate_fwd(*_fwd(hidden=72)[:4], 1e-20, 0.5, False)
    gt.engram_gate_bwd(*_bwd()[:9], 2)
    scalars = [describe(args[-4:] if name.endswith("fwd") else args[-2:]) for name, _, args in ops.launches]
    assert scalars == [describe((0.0, 1.0, 0.125, 1))] * 2 + [describe((1e-20, 0.5, 72 ** -0.5, 0)),
                                                              describe((2.0, 0.125))]


def test_a_configuration_is_checked_once_for_every_token_count(ops, monkeypatch):
    checked = []
    real = gt._gate_checks
    monkeypatch.setattr(gt, "_gate_checks", lambda *a: checked.append(a[0]) or real(*a))
    k, v = _strided_kv(9)
    for tokens in (4, 1, 0, 9):
        args = _fwd(tokens)
        if tokens == 9:
            args[1], args[2] = k, v  # strided k and v: the per-call test passes them, no ordered checks
        gt.engram_gate_fwd(*args)
        gt.engram_gate_bwd(*_bwd(tokens))
    assert checked == ["engram_gate_fwd", "engram_gate_bwd"]
    assert len(gt.ENGRAM_GATE_FWD.memo) == len(gt.ENGRAM_GATE_BWD.memo) == 1
    assert [a[0].shape[0] for name, _, a in ops.launches if name.endswith("fwd")] == [4, 1, 9]  # 0 tokens: none


# ---------------------------------------------------------------- per-call refusals after a warm-up
def _misaligned(shape, dtype, by=1):
    """A tensor of ``shape`` whose data starts ``by`` elements into a fresh allocation."""
    n = 1
    for s in shape:
        n *= s
    return torch.zeros(n + by, dtype=dtype)[by:].view(shape)


def _transposed(shape, dtype):
    return torch.zeros(tuple(reversed(shape)), dtype=dtype).T if len(shape) == 2 else \
        torch.zeros((shape[0], shape[2], shape[1]), dtype=dtype).transpose(1, 2)


def _replace(args, pos, value):
    out = list(args)
    out[pos] = value
    return out


def _hash_cases():
    yield "ids non-contiguous", _hash, _replace(_hash(), 0, _transposed((4, 3), I32)), "ngram_token_ids must be contiguous"
    yield "ids misaligned", _hash, _replace(_hash(), 0, _misaligned((4, 3), I32)), "ngram_token_ids's data pointer"
    yield "offsets misaligned", _hash, _replace(_hash(), 3, _misaligned((2, 16), I32)), "offsets's data pointer"
    yield "vocab non-contiguous", _hash, _replace(_hash(), 2, torch.zeros((2, 8, 2), dtype=I32).transpose(1, 2)), \
        "vocab_sizes must be contiguous"
    meta = lambda tokens: _hash(tokens, n=2, layers=2, tables=8, device="meta")  # noqa: E731  (no memory)
    yield "output > 2**31 - 1", lambda: meta(4), meta(2**27), "the output would have 2 x 134217728 x 8 entries"


def _gate_cases(make, shift):
    """Bad calls of a gate op whose configuration ``make()`` warms (``shift``: hidden_states' position)."""
    x, k, v = shift, shift + 1, shift + 2
    yield "k tokens", make, _replace(make(), k, torch.zeros((5, 4, 64), dtype=BF)), \
        r"k has shape \(5, 4, 64\), want \(4, 4, 64\)"
    yield "v tokens", make, _replace(make(), v, torch.zeros((3, 64), dtype=BF)), r"v has shape \(3, 64\), want \(4, 64\)"
    yield "x non-contiguous", make, _replace(make(), x, _transposed((4, 4, 64), BF)), "hidden_states must be contiguous"
    yield "k strides", make, _replace(make(), k, torch.zeros((4, 4, 68), dtype=BF)[:, :, :64]), \
        "dim 1 stride non-negative multiples of 8"
    yield "k last dim strided", make, _replace(make(), k, torch.zeros((4, 4, 128), dtype=BF)[:, :, ::2]), \
        "dim 2 stride 1"
    yield "k misaligned", make, _replace(make(), k, _misaligned((4, 4, 64), BF, 4)), "k's data pointer .* not 16-byte"
    yield "v misaligned", make, _replace(make(), v, _misaligned((4, 64), BF, 2)), "v's data pointer .* not 16-byte"
    yield "weight non-contiguous", make, _replace(make(), x + 3, torch.zeros((64, 4)).T), "weight_fused must be contig"
    yield "weight misaligned", make, _replace(make(), x + 3, _misaligned((4, 64), F32, 1)), "weight_fused's data"
    meta = lambda tokens: [t.to("meta") if isinstance(t, torch.Tensor) else t for t in make(tokens)]  # noqa: E731
    yield "too many elements", lambda: meta(4), meta(2**23), "hidden_states has 2147483648 elements, more than 2\\*\\*31"


def _bwd_cases():
    make = lambda tokens=4: _bwd(tokens)  # noqa: E731
    yield from _gate_cases(make, 1)
    yield "grad_out tokens", make, _replace(make(), 0, torch.zeros((5, 4, 64), dtype=BF)), r"grad_out has shape \(5,"
    yield "grad_out non-contiguous", make, _replace(make(), 0, _transposed((4, 4, 64), BF)), "grad_out must be contig"
    yield "grad_out misaligned", make, _replace(make(), 0, _misaligned((4, 4, 64), BF, 4)), "grad_out's data pointer"
    yield "dot tokens", make, _replace(make(), 5, torch.zeros((3, 4))), r"dot has shape \(3, 4\), want \(4, 4\)"
    yield "rstd_k tokens", make, _replace(make(), 8, torch.zeros((5, 4))), r"rstd_k has shape \(5, 4\), want \(4, 4\)"
    yield "gate_score non-contiguous", make, _replace(make(), 6, torch.zeros((4, 4)).T), "gate_score must be contig"


def _reduce_cases():
    aliased = _reduce()
    yield "aliased outputs", _reduce, _replace(aliased, 4, aliased[3]), "grad_weight_hidden overlaps grad_weight_embed"
    part = torch.zeros((7, 4, 64))
    yield "output in grad_w_partial", _reduce, _replace(_replace(_reduce(), 0, part), 3, part[2]), \
        "grad_weight_hidden overlaps grad_w_partial"
    out = torch.zeros((4, 64))
    yield "input in output", _reduce, _replace(_replace(_reduce(), 4, out), 1, out.view(BF).view(-1)[:256].view(4, 64)), \
        "grad_weight_embed overlaps weight_hidden"
    yield "misaligned weight", _reduce, _replace(_reduce(), 2, _misaligned((4, 64), BF, 1)), "weight_embed's data"
    yield "non-contiguous grad", _reduce, _replace(_reduce(), 4, torch.zeros((64, 4)).T), "grad_weight_embed must be"
    yield "non-contiguous partials", _reduce, _replace(_reduce(), 0, torch.zeros((7, 64, 4)).transpose(1, 2)), \
        "grad_w_partial must be contiguous"


REFUSALS = {
    **{f"hash: {n}": (hs.engram_hash, *rest) for n, *rest in _hash_cases()},
    **{f"fused_weight: {n}": (hs.fused_weight, lambda: [torch.zeros((4, 64), dtype=BF)] * 2, [a, b], m)
       for n, a, b, m in [("non-contiguous", torch.zeros((64, 4), dtype=BF).T, torch.zeros((4, 64), dtype=BF),
                           "weight_hidden must be contiguous"),
                          ("misaligned", torch.zeros((4, 64), dtype=BF), _misaligned((4, 64), BF, 3),
                           "weight_embed's data pointer")]},
    **{f"gate_fwd: {n}": (gt.engram_gate_fwd, *rest) for n, *rest in _gate_cases(lambda tokens=4: _fwd(tokens), 0)},
    **{f"gate_bwd: {n}": (gt.engram_gate_bwd, *rest) for n, *rest in _bwd_cases()},
    **{f"grad_w_reduce: {n}": (gt.grad_w_reduce, *rest) for n, *rest in _reduce_cases()},
}


def _error(fn, args) -> str:
    with pytest.raises(ArgumentError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_a_refusal_after_warm_up_is_the_cold_refusal(ops, name, key_path):
    fn, warm_args, bad, match = REFUSALS[name]
    spec = _spec_of(fn)
    cold = _error(fn, bad)
    assert not spec.memo and not ops.launches
    fn(*warm_args())
    assert len(spec.memo) == 1
    if key_path == "python key":  # (the compiled key's per-call tests may send it to the checks before any lookup)
        assert spec.key(tuple(bad)) in spec.memo, "the bad call must share the warm configuration"
    ops.launches.clear()
    hot = _error(fn, bad)
    assert hot == cold and not ops.launches and len(spec.memo) == 1
    assert re.search(match, hot), hot
    assert hot.startswith(spec.name + ":")


def test_misaligned_saved_statistics_are_copied_not_refused(ops):
    args = _bwd()
    args[5] = _misaligned((4, 4), F32, 1)  # 4-byte aligned (scalar accesses): accepted, copied aligned
    for _ in range(2):  # cold, then replayed
        ops.launches.clear()
        gt.engram_gate_bwd(*args)
        (_, _, launched), = ops.launches
        assert launched[5] is not args[5] and launched[5].data_ptr() % 16 == 0
        assert launched[6] is args[6]
    assert len(gt.ENGRAM_GATE_BWD.memo) == 1


def _spy_reduce_checks(monkeypatch) -> list:
    """grad_w_reduce's ordered checks, recorded: a call's run reaches them when its per-call test fails."""
    calls: list = []
    real = gt._reduce_checks
    monkeypatch.setattr(gt, "_reduce_checks", lambda op, *args: calls.append(op) or real(op, *args))
    return calls


def test_adjacent_outputs_replay(ops, monkeypatch):
    """Valid, plain outputs side by side: the first call runs the ordered checks (relations), the
    replay only the per-call test."""
    calls = _spy_reduce_checks(monkeypatch)
    args = _reduce()
    both = torch.zeros((8, 64))
    args[3], args[4] = both[:4], both[4:]
    for _ in range(2):
        gt.grad_w_reduce(*args)
    assert len(ops.launches) == 2 and len(gt.GRAD_W_REDUCE.memo) == 1 and calls == ["grad_w_reduce"]


@pytest.mark.parametrize("name", sorted(n for n in REFUSALS if n.startswith("grad_w_reduce")))
def test_the_reduce_per_call_test_is_never_looser_than_the_checks(ops, monkeypatch, name, key_path):
    """grad_w_reduce's per-call test (in its run) passes nothing ``_reduce_checks`` refuses (for
    arguments of a valid configuration: the key covers the rest): a replayed bad call reaches the
    ordered checks, which raise before any launch; the plain valid call does not reach them."""
    _, warm_args, bad, _ = REFUSALS[name]
    gt.grad_w_reduce(*warm_args())
    calls = _spy_reduce_checks(monkeypatch)
    gt.grad_w_reduce(*warm_args())
    assert not calls
    ops.launches.clear()
    if key_path == "python key":  # a replay: only the per-call test judges it (the compiled key holds bytes)
        assert gt.GRAD_W_REDUCE.key(tuple(bad)) in gt.GRAD_W_REDUCE.memo
    with pytest.raises(ArgumentError):
        gt.grad_w_reduce(*bad)
    assert calls == ["grad_w_reduce"] and not ops.launches


def test_float_and_bool_keys_tell_types_and_zero_signs_apart(ops):
    """A float scalar's configuration is its type and bits: a replay launches the caller's eps and
    clamp value exactly (-0.0 after 0.0, a numpy float after a float); an int 1 for the bool
    save_for_backward is refused after True was memoized, as it is cold."""
    import math

    import numpy as np

    tensors = _fwd()[:4]
    launched = []
    for eps in (0.0, -0.0, 0.0, np.float64(-0.0), np.float64(0.0), 0, 1e-20, 1e-20):
        gt.engram_gate_fwd(*tensors, eps, -0.0 if type(eps) is int else 1e-6, True)
        launched.append(ops.launches[-1][2][-4])
    assert [math.copysign(1, e) for e in launched[:5]] == [1, -1, 1, -1, 1]
    assert all(type(e) is float for e in launched) and launched[5:] == [0.0, 1e-20, 1e-20]
    assert len(gt.ENGRAM_GATE_FWD.memo) == 6
    assert math.copysign(1, ops.launches[5][2][-3]) == -1  # clamp_value -0.0 with the int eps
    with pytest.raises(ArgumentError, match="save_for_backward must be a bool, got int 1"):
        gt.engram_gate_fwd(*tensors, 1e-20, 1e-6, 1)
    assert len(gt.ENGRAM_GATE_FWD.memo) == 6


def test_the_saved_statistics_are_separate_allocations(ops):
    """engram_gate_fwd's dot, gate_score, rstd_x and rstd_k each have their own storage (as tile_kernels'
    have), cold and warm; without save_for_backward the four are None."""
    for _ in range(2):
        out = gt.engram_gate_fwd(*_fwd())
        assert len({t.untyped_storage().data_ptr() for t in out}) == 5
        assert all(t.shape == (4, 4) and t.dtype == torch.float32 and t.is_contiguous() for t in out[1:])
        assert gt.engram_gate_fwd(*_fwd()[:6], False)[1:] == (None, None, None, None)
