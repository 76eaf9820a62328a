"""The per-block and per-channel casts replayed through their OpSpecs (CPU, launch stubbed).

Every form of every op memoizes its configuration after the first (checked) call; here a warm
replay must launch exactly what a cold checked call launches (same kernel, key, scalar
arguments, tensor arguments of the same dtype/shape/strides and the same input objects where
the cold call passes an input through; outputs alike), at any token count; a call that fails a
per-call check (contiguity, pointer alignment, int32 element count, the scales' row count)
after warm-up is refused with the cold call's message, launches nothing and stores nothing; the
configuration keys keep apart what the checks tell apart; the torch.library schemas are the
ones these ops always registered.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ops_stub import StubbedOps, describe, describe_launches
from tilebin.ops import _spec
from tilebin.ops.quant import _per_block as pb
from tilebin.ops.quant import _per_channel as pc
from tilebin.runtime import ArgumentError

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

BF16, FP32, E4M3, I8, I32 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int8, torch.int32
SPECS = pb.SPECS + pc.SPECS
SPEC_OF = {getattr(m, s.name): s for m in (pb, pc) for s in m.SPECS}
TOKENS = (0, 1, 4, 300)


@pytest.fixture
def ops(monkeypatch):
    stub = StubbedOps(monkeypatch)
    stub.checked = []
    real = _spec.OpSpec.checked
    monkeypatch.setattr(_spec.OpSpec, "checked", lambda self, a, k: stub.checked.append(self.name) or real(self, a, k))
    return stub


def _tensors(args) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, tuple):
            out += _tensors(a)
    return out


def _work(ops, fn, args) -> tuple:
    """What ``fn(*args)`` did: its result and launches described, and which launch arguments are
    the caller's tensors themselves."""
    ops.launches.clear()
    result = fn(*args)
    inputs = _tensors(args)
    same = [tuple(next((i for i, t in enumerate(inputs) if a is t), None) for a in largs)
            for _, _, largs in ops.launches]
    return describe(result), describe_launches(ops.launches), same


def _mis(shape, dtype, elements=1):
    """A contiguous tensor whose data pointer is ``elements`` past a 16-byte boundary."""
    n = int(np.prod(shape))
    return torch.zeros(n + elements, dtype=dtype)[elements:].view(shape)


def _x(t, h=7168, dtype=BF16):
    return torch.randn(t, h).to(dtype)


def _fp4(t, h=576, kind="row"):
    g = h // 32
    data = torch.zeros((t, h // 2), dtype=I8)
    if kind == "packed":
        return data, torch.zeros((-(-g // 4), t), dtype=I32).T
    return data, (torch.ones((g, t)).T if kind == "col" else torch.ones((t, g)))


def _pair(t, h=7168, sf=None):
    return _x(t, h, E4M3), (torch.ones((t, -(-h // 128))) if sf is None else sf(t, -(-h // 128)))


# (op, args for t tokens): one configuration each, replayed at every token count
CASES = {
    "pb_e4m3": (pb.per_block_cast, lambda t: (_x(t), "e4m3", (128, 128))),
    "pb_e2m1_packed": (pb.per_block_cast, lambda t: (_x(t, 576, FP32), "e2m1", (32, 32), True, True, True)),
    "pb_list_int_flags": (pb.per_block_cast, lambda t: (_x(t, 576), "e4m3", [32, 32], 1, 0, 0)),
    "pb_col": (pb.per_block_cast, lambda t: (_x(t, 2048), "e2m1", (128, 128), True, True)),
    "sf_only": (pb.per_block_cast_with_sf_only, lambda t: (_x(t, 576), "e2m1", (128, 128), True)),
    "sf_only_packed": (pb.per_block_cast_with_sf_only, lambda t: (_x(t), "e4m3", (32, 32), True, True, True)),
    "precomputed": (pb.per_block_cast_with_precomputed_sf,
                    lambda t: (_x(t), "e4m3", (128, 128), torch.ones((-(-t // 128), 56)))),
    "precomputed_copied_sf": (pb.per_block_cast_with_precomputed_sf,  # a transposed sf: copied per call
                              lambda t: (_x(t, 576, FP32), "e2m1", (32, 32), torch.ones((18, -(-t // 32))).T, 0, 1)),
    "precomputed_misaligned_sf": (pb.per_block_cast_with_precomputed_sf,
                                  lambda t: (_x(t, 576), "e4m3", (32, 32), _mis((-(-t // 32), 18), FP32))),
    "lossless_row": (pb.per_block_cast_lossless, lambda t: (_fp4(t), "e4m3", (1, 32), (1, 128))),
    "lossless_col": (pb.per_block_cast_lossless, lambda t: (_fp4(t, 7168, "col"), "e4m3", (1, 32), (32, 32), True)),
    "lossless_packed": (pb.per_block_cast_lossless,
                        lambda t: (_fp4(t, 576, "packed"), "e4m3", (1, 32), (128, 128), True, True, True)),
    "lossless_misaligned_sf": (pb.per_block_cast_lossless,
                               lambda t: ((_fp4(t)[0], _mis((t, 18), FP32)), "e4m3", (1, 32), (1, 128))),
    "pc_bf16": (pc.per_channel_cast, lambda t: (_x(t), "e4m3", 128)),
    "pc_fp32_round": (pc.per_channel_cast, lambda t: (_x(t, 576, FP32), "e4m3", 128, True)),
    "fused_plain": (pc.per_channel_cast_fused, lambda t: (_x(t, 576), "e4m3", 128, True)),
    "fused_pair": (pc.per_channel_cast_fused, lambda t: (_pair(t), "e4m3", 128, False, 128)),
    "fused_pair_pos": (pc.per_channel_cast_fused,
                       lambda t: (_pair(t, 576), "e4m3", 128, 1, 128, torch.zeros(2 * t, dtype=I32))),
    "fused_plain_pos": (pc.per_channel_cast_fused,
                        lambda t: (_x(t, 576, FP32), "e4m3", 128, False, None, torch.zeros(t, dtype=I32))),
    "fused_pair_sf_copied": (pc.per_channel_cast_fused,  # 4-byte aligned sf: the kernel gets a 16-byte aligned copy
                             lambda t: (_pair(t, 576, lambda a, b: _mis((a, b), FP32)), "e4m3", 128, False, 128)),
    "transpose_32": (pc.per_channel_cast_and_transpose, lambda t: (_x(t, 576), "e4m3", 32, True)),
    "transpose_128": (pc.per_channel_cast_and_transpose, lambda t: (_x(t), "e4m3", 128)),
}


@pytest.mark.parametrize("case", CASES)
def test_warm_replay_launches_what_the_cold_call_launches(ops, case):
    fn, make = CASES[case]
    spec = SPEC_OF[fn]
    args = {t: make(t) for t in TOKENS}
    cold = {}
    for t in TOKENS:
        ops.fresh()
        cold[t] = _work(ops, fn, args[t])
    ops.fresh()
    ops.checked.clear()
    for t in TOKENS:  # the first call checks, every later one (any token count) replays
        assert _work(ops, fn, args[t]) == cold[t], t
    assert ops.checked == [spec.name] and len(spec.memo) == 1
    assert [len(launches) for _, launches, _ in cold.values()] == [0, 1, 1, 1]  # 0 tokens: nothing launched


def _same_refusal(ops, fn, warm_args, bad_args, match):
    """After ``warm_args`` memoized, ``bad_args`` is refused with ``match``, exactly as in a fresh
    process, launching nothing and storing nothing."""
    spec = SPEC_OF[fn]
    ops.fresh()
    fn(*warm_args)
    memo = dict(spec.memo)
    ops.launches.clear()
    with pytest.raises(ArgumentError, match=match) as warm:
        fn(*bad_args)
    assert spec.memo == memo and not ops.launches
    ops.fresh()
    with pytest.raises(ArgumentError) as cold:
        fn(*bad_args)
    assert str(cold.value) == str(warm.value)
    assert not spec.memo and not ops.launches


def _meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


def _strided(t, h, dtype=BF16):
    return torch.zeros((t, 2 * h), dtype=dtype)[:, ::2]


REFUSALS = {  # (op, warm args, bad args of the same configuration, message)
    "pb_not_contiguous": (pb.per_block_cast, (_x(4), "e4m3", (128, 128)), (_strided(4, 7168), "e4m3", (128, 128)),
                          r"per_block_cast: x must be contiguous \(strides \(14336, 2\)\); call x.contiguous\(\)"),
    "pb_misaligned": (pb.per_block_cast, (_x(4), "e4m3", (128, 128)), (_mis((9, 7168), BF16), "e4m3", (128, 128)),
                      r"per_block_cast: x's data pointer 0x[0-9a-f]+ is not 16-byte aligned"),
    "pb_int32_elements": (pb.per_block_cast, (_meta(4, 7168), "e4m3", (32, 32)),
                          (_meta(300000, 7168), "e4m3", (32, 32)),
                          r"per_block_cast: x has 300000 x 7168 elements, more than 2\*\*31 - 1; split the tokens"),
    "sf_only_misaligned": (pb.per_block_cast_with_sf_only, (_x(4, 576), "e2m1", (32, 32)),
                           (_mis((4, 576), BF16, 4), "e2m1", (32, 32)), r"not 16-byte aligned"),
    "precomputed_sf_rows": (pb.per_block_cast_with_precomputed_sf, (_x(4), "e4m3", (32, 32), torch.ones((1, 224))),
                            (_x(300), "e4m3", (32, 32), torch.ones((1, 224))),
                            r"sf has shape \(1, 224\); for x of 300 x 7168 and block_size \(32, 32\) it must be "
                            r"\(10, 224\) \(row-major fp32, one scale per block\)"),
    "precomputed_misaligned_x": (pb.per_block_cast_with_precomputed_sf,
                                 (_x(4), "e4m3", (128, 128), torch.ones((1, 56))),
                                 (_mis((4, 7168), BF16), "e4m3", (128, 128), torch.ones((1, 56))),
                                 r"x's data pointer .* not 16-byte aligned"),
    "lossless_misaligned": (pb.per_block_cast_lossless, (_fp4(4), "e4m3", (1, 32), (1, 128)),
                            ((_mis((4, 288), I8), _fp4(4)[1]), "e4m3", (1, 32), (1, 128)),
                            r"per_block_cast_lossless: data's data pointer .* not 16-byte aligned"),
    "lossless_not_contiguous": (pb.per_block_cast_lossless, (_fp4(4), "e4m3", (1, 32), (1, 128)),
                                ((_strided(4, 288, I8), _fp4(4)[1]), "e4m3", (1, 32), (1, 128)),
                                r"data must be contiguous"),
    "lossless_row_sf_rows": (pb.per_block_cast_lossless, (_fp4(4), "e4m3", (1, 32), (1, 128)),
                             ((_fp4(5)[0], _fp4(4)[1]), "e4m3", (1, 32), (1, 128)),
                             r"the input sf \(row layout\) has kernel-side shape \(4, 18\); for data of 5 x 576 values "
                             r"and x_block_size \(1, 32\) it must be \(5, 18\)"),
    "lossless_col_sf_rows": (pb.per_block_cast_lossless, (_fp4(4, kind="col"), "e4m3", (1, 32), (1, 128)),
                             ((_fp4(6)[0], _fp4(4, kind="col")[1]), "e4m3", (1, 32), (1, 128)),
                             r"the input sf \(col layout\) has kernel-side shape \(18, 4\); .* must be \(18, 6\)"),
    "lossless_packed_sf_rows": (pb.per_block_cast_lossless, (_fp4(4, kind="packed"), "e4m3", (1, 32), (1, 128)),
                                ((_fp4(3)[0], _fp4(4, kind="packed")[1]), "e4m3", (1, 32), (1, 128)),
                                r"the input sf \(ue8m0 layout\) has kernel-side shape \(5, 16\); .* must be \(5, 12\)"),
    "lossless_int32_elements": (pb.per_block_cast_lossless,
                                ((_meta(4, 3584, dtype=I8), _meta(4, 224, dtype=FP32)), "e4m3", (1, 32), (1, 128)),
                                ((_meta(300000, 3584, dtype=I8), _meta(300000, 224, dtype=FP32)), "e4m3", (1, 32),
                                 (1, 128)), r"data has 300000 x 7168 elements, more than 2\*\*31 - 1"),
    "pc_not_contiguous": (pc.per_channel_cast, (_x(4), "e4m3", 128), (_strided(4, 7168), "e4m3", 128),
                          r"per_channel_cast: x must be contiguous \(got strides \(14336, 2\) for shape \(4, 7168\)\); "
                          r"pass x.contiguous\(\)"),
    "pc_misaligned": (pc.per_channel_cast, (_x(4), "e4m3", 128), (_mis((4, 7168), BF16), "e4m3", 128),
                      r"per_channel_cast: x's data pointer .* not 16-byte aligned"),
    "fused_plain_misaligned": (pc.per_channel_cast_fused, (_x(4, 576, FP32), "e4m3", 128),
                               (_mis((4, 576), FP32), "e4m3", 128), r"x's data pointer .* not 16-byte aligned"),
    "fused_data_misaligned": (pc.per_channel_cast_fused, (_pair(4), "e4m3", 128, False, 128),
                              ((_mis((4, 7168), E4M3), _pair(4)[1]), "e4m3", 128, False, 128),
                              r"x\[0\] \(data\)'s data pointer .* not 16-byte aligned"),
    "fused_data_not_contiguous": (pc.per_channel_cast_fused, (_pair(4), "e4m3", 128, False, 128),
                                  ((_strided(4, 7168, E4M3), _pair(4)[1]), "e4m3", 128, False, 128),
                                  r"x\[0\] \(data\) must be contiguous"),
    "fused_sf_rows": (pc.per_channel_cast_fused, (_pair(4), "e4m3", 128, False, 128),
                      ((_pair(5)[0], _pair(4)[1]), "e4m3", 128, False, 128),
                      r"x\[1\] \(sf\) has shape \(4, 56\); for data of shape \(5, 7168\) .* must be \(5, 56\)"),
    "fused_sf_not_contiguous": (pc.per_channel_cast_fused, (_pair(4), "e4m3", 128, False, 128),
                                ((_pair(4)[0], torch.ones((56, 4)).T), "e4m3", 128, False, 128),
                                r"x\[1\] \(sf\) must be row-major contiguous"),
    "fused_pos_not_contiguous": (pc.per_channel_cast_fused,
                                 (_x(4), "e4m3", 128, False, None, torch.zeros(3, dtype=I32)),
                                 (_x(4), "e4m3", 128, False, None, torch.zeros(6, dtype=I32)[::2]),
                                 r"pos_to_token must be contiguous \(stride 2\); pass pos_to_token.contiguous\(\)"),
    "transpose_not_contiguous": (pc.per_channel_cast_and_transpose, (_x(4, 576), "e4m3", 32),
                                 (_strided(4, 576), "e4m3", 32),
                                 r"per_channel_cast_and_transpose: x must be contiguous"),
    "transpose_misaligned": (pc.per_channel_cast_and_transpose, (_x(4, 576), "e4m3", 32),
                             (_mis((4, 576), BF16, 2), "e4m3", 32), r"not 16-byte aligned"),
}


def _empty_strided(h, dtype=BF16):
    """0 rows, last-dim stride 2: torch calls it contiguous, the ops' alignment check does not."""
    return torch.zeros((4, 2 * h), dtype=dtype)[:0, ::2]


REFUSALS.update({  # an empty tensor whose last-dim stride is not 1, after a warm-up of its configuration
    "pb_empty_strided": (pb.per_block_cast, (_x(4), "e4m3", (128, 128)), (_empty_strided(7168), "e4m3", (128, 128)),
                         r"per_block_cast: x must be contiguous in its last dim \(strides \(14336, 2\)\)"),
    "precomputed_empty_strided": (pb.per_block_cast_with_precomputed_sf,
                                  (_x(4), "e4m3", (128, 128), torch.ones((1, 56))),
                                  (_empty_strided(7168), "e4m3", (128, 128), torch.ones((0, 56))),
                                  r"x must be contiguous in its last dim"),
    "lossless_empty_strided": (pb.per_block_cast_lossless, (_fp4(4), "e4m3", (1, 32), (1, 128)),
                               ((_empty_strided(288, I8), _fp4(0)[1]), "e4m3", (1, 32), (1, 128)),
                               r"per_block_cast_lossless: data must be contiguous in its last dim"),
    "pc_empty_strided": (pc.per_channel_cast, (_x(4), "e4m3", 128), (_empty_strided(7168), "e4m3", 128),
                         r"per_channel_cast: x must be contiguous in its last dim"),
    "fused_sf_empty_strided": (pc.per_channel_cast_fused, (_pair(4), "e4m3", 128, False, 128),
                               ((_pair(0)[0], _empty_strided(56, FP32)), "e4m3", 128, False, 128),
                               r"x\[1\] \(sf\) must be contiguous in its last dim"),
    "transpose_empty_strided": (pc.per_channel_cast_and_transpose, (_x(4, 576), "e4m3", 32),
                                (_empty_strided(576), "e4m3", 32), r"x must be contiguous in its last dim"),
    # two per-call faults: a replay checks x before pos_to_token, as the first call does
    "fused_x_then_pos": (pc.per_channel_cast_fused, (_x(4), "e4m3", 128, False, None, torch.zeros(3, dtype=I32)),
                         (_mis((4, 7168), BF16), "e4m3", 128, False, None, torch.zeros(6, dtype=I32)[::2]),
                         r"x's data pointer .* not 16-byte aligned"),
    "precomputed_x_then_sf_rows": (pb.per_block_cast_with_precomputed_sf,
                                   (_x(4), "e4m3", (128, 128), torch.ones((1, 56))),
                                   (_mis((4, 7168), BF16), "e4m3", (128, 128), torch.ones((2, 56))),
                                   r"x's data pointer .* not 16-byte aligned"),
})


@pytest.mark.parametrize("case", REFUSALS)
def test_per_call_checks_refuse_after_warm_up_as_cold(ops, case):
    fn, warm, bad, match = REFUSALS[case]
    _same_refusal(ops, fn, warm, bad, match)


@pytest.mark.parametrize("fn, warm, bad, match", [
    (pb.per_block_cast, (_x(4), "e4m3", (128, 128)), (_x(4), "e4m3", (128.0, 128.0)), r"block_size=\(128.0, 128.0\)"),
    (pb.per_block_cast, (_x(4), "e4m3", (128, 128), 1), (_x(4), "e4m3", (128, 128), 2), r"must be a bool, got int 2"),
    (pb.per_block_cast, (_x(4), "e4m3", (128, 128)), (_x(4, 7000), "e4m3", (128, 128)), r"hidden=7000"),
    (pb.per_block_cast_with_precomputed_sf, (_x(4), "e4m3", (128, 128), torch.ones((1, 56))),
     (_x(4), "e4m3", (128, 128), None), r"sf must be a torch.Tensor, got NoneType"),
    (pb.per_block_cast_lossless, (_fp4(4), "e4m3", (1, 32), (1, 128)), (_fp4(4), "e4m3", [1, 32], (1, 128)),
     r"x_block_size must be a \(rows, cols\) tuple for a quantized input, got \[1, 32\]"),
    (pc.per_channel_cast, (_x(4), "e4m3", 128), (_x(4), "e4m3", np.int64(128)),
     r"num_per_tokens=np.int64\(128\) is not supported"),
    (pc.per_channel_cast, (_x(4), "e4m3", 128), (_pair(4), "e4m3", 128), r"x must be a plain bf16/fp32 tensor"),
    (pc.per_channel_cast_fused, (_pair(4), "e4m3", 128, False, 128), (_pair(4), "e4m3", 128, False, None),
     r"a quantized \(data, sf\) input needs num_per_channels=128"),
    (pc.per_channel_cast_fused, (_x(4), "e4m3", 128), (_x(4), "e4m3", 128, False, 128),
     r"num_per_channels=128 is only for a quantized"),
])
def test_other_configurations_are_checked_not_replayed(ops, fn, warm, bad, match):
    _same_refusal(ops, fn, warm, bad, match)


@pytest.mark.parametrize("fn, a, b, same", [
    (pb.per_block_cast, (_x(4), "e4m3", (128, 128), True), (_x(4), "e4m3", (128, 128), 1), True),
    (pb.per_block_cast, (_x(4), "e4m3", (32, 32)), (_x(4), "e4m3", [32, 32]), True),
    (pb.per_block_cast_with_sf_only, (_x(4), "e4m3", (32, 32), False), (_x(4), "e4m3", (32, 32), 0), True),
    (pc.per_channel_cast, (_x(4), "e4m3", 128, True), (_x(4), "e4m3", 128, 1), True),
    (pc.per_channel_cast_fused, (_x(4), "e4m3", 128), (_x(4), "e4m3", 128, False, None, torch.arange(4, dtype=I32)),
     False),
    (pb.per_block_cast_lossless, (_fp4(1), "e4m3", (1, 32), (1, 128)),  # row-major (1, 18) and column-major (1, 18)
     (_fp4(1, kind="col"), "e4m3", (1, 32), (1, 128)), False),
])
def test_what_the_checks_tell_apart_are_two_configurations(ops, fn, a, b, same):
    """Two configurations (each checked once); where they differ only in a scalar's type, the same launch."""
    spec = SPEC_OF[fn]
    work = [_work(ops, fn, args)[1] for args in (a, b, a, b)]
    assert len(spec.memo) == 2 and ops.checked == [spec.name] * 2
    assert work[0] == work[2] and work[1] == work[3] and (work[0] == work[1]) == same


def test_lossless_row_and_col_sf_launch_their_own_kinds(ops):
    """One token: a row-major and a column-major (1, 18) sf have the same shape, different strides."""
    for kind, want in (("row", 0), ("col", 1), ("row", 0), ("col", 1)):
        ops.launches.clear()
        pb.per_block_cast_lossless(_fp4(1, kind=kind), "e4m3", (1, 32), (1, 128))
        assert ops.launches[0][2][4] == want


def test_lossless_round_sf_is_not_read(ops):
    """As before the OpSpec: round_sf is implied for the lossless cast and never checked."""
    out, sf = pb.per_block_cast_lossless(_fp4(4), "e4m3", (1, 32), (1, 128), False, "yes")
    assert out.shape == (4, 576) and len(ops.launches) == 1


def test_a_fake_call_stores_nothing(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tilebin.ops._common import TRACING

    mode = FakeTensorMode()
    x = mode.from_tensor(_x(4))
    TRACING.on = True
    try:
        with mode:
            out, sf = pb.PER_BLOCK_CAST.fake(x, "e4m3", (128, 128), False, False, False)
            pc.PER_CHANNEL_CAST_FUSED.fake(x, "e4m3", 128, False, None, None)
    finally:
        TRACING.on = False
    assert out.shape == (4, 7168) and sf.shape == (1, 56)
    assert not pb.PER_BLOCK_CAST.memo and not pc.PER_CHANNEL_CAST_FUSED.memo and not ops.launches


def test_hot_launches_explicit(ops):
    """The decode-size hot calls, cold then warm, written out (independent of the ops' arithmetic)."""
    x = _x(4)
    for _ in range(2):
        ops.launches.clear()
        out, sf = pb.per_block_cast(x, "e4m3", (128, 128))
        [(name, key, args)] = ops.launches
        assert (name, key) == ("quant.per_block_cast", dict(in_dtype="bfloat16", fmt="e4m3", block=128, sf_only=False))
        assert args[0] is x and args[1] is out and args[2] is sf and args[3:] == (0, 0, 0)  # sf as returned
        assert (out.dtype, out.shape, out.stride()) == (E4M3, (4, 7168), (7168, 1))
        assert (sf.dtype, sf.shape, sf.stride()) == (FP32, (1, 56), (56, 1))

        ops.launches.clear()
        out, sf = pc.per_channel_cast(x, "e4m3", 128)
        [(name, key, args)] = ops.launches
        assert (name, key) == ("quant.per_channel_cast_bf16", dict(in_dtype="bfloat16", expand=False))
        assert args[0] is x and args[1] is out and args[2] is sf and args[5] == 0
        assert [(a.dtype, tuple(a.shape)) for a in args[3:5]] == [(FP32, (4, 4)), (I32, (4,))]  # unread stand-ins
        assert (out.dtype, out.shape, out.stride()) == (E4M3, (4, 7168), (7168, 1))
        assert (sf.dtype, sf.shape, sf.stride()) == (FP32, (1, 7168), (7168, 1))
    assert len(pb.PER_BLOCK_CAST.memo) == len(pc.PER_CHANNEL_CAST.memo) == 1
    assert ops.checked == ["per_block_cast", "per_channel_cast"]


_FLAGS = "bool use_tma_aligned_col_major_sf=False, bool round_sf=False, bool use_packed_ue8m0=False"
SCHEMAS = {  # what these ops registered before the OpSpec: unchanged
    "per_block_cast": f"(Tensor x, str fmt, int[] block_size, {_FLAGS}) -> (Tensor, Tensor)",
    "per_block_cast_with_sf_only": f"(Tensor x, str fmt, int[] block_size, {_FLAGS}) -> Tensor",
    "per_block_cast_with_precomputed_sf": f"(Tensor x, str fmt, int[] block_size, Tensor sf, {_FLAGS}) -> Tensor",
    "per_block_cast_lossless": f"(Tensor x, Tensor x_sf, str fmt, int[] x_block_size, int[] out_block_size, "
                               f"{_FLAGS}) -> (Tensor, Tensor)",
    "per_channel_cast": "(Tensor x, str fmt, int num_per_tokens, bool round_sf=False) -> (Tensor, Tensor)",
    "per_channel_cast_fused": "(Tensor x, Tensor? x_sf, str fmt, int num_per_tokens, bool round_sf=False, "
                              "int? num_per_channels=None, Tensor? pos_to_token=None) -> (Tensor, Tensor)",
    "per_channel_cast_and_transpose": "(Tensor x, str fmt, int num_per_tokens, bool round_sf=False) -> "
                                      "(Tensor, Tensor)",
}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_schemas_and_torch_ops_are_unchanged(spec):
    assert spec.schema() == SCHEMAS[spec.name]
    module = pb if spec in pb.SPECS else pc
    (op,) = [o for o in module.TORCH_OPS if o.name == spec.name]
    public = getattr(module, spec.name)
    assert op.schema == SCHEMAS[spec.name] and op.public is public and op.fake == spec.fake
    assert public.__doc__ and public.__name__ == spec.name
    pair = spec.name in ("per_block_cast_lossless", "per_channel_cast_fused")
    assert (op.to_schema.__name__ == "pair_to_schema") == pair
