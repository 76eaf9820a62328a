"""CPU tests of the argument checks of ``sinkhorn_normalize``, ``mhc_pre_split_mixes`` and
``mhc_multilayer_recompute`` (``tilebin.modeling.mhc.ops``): every bad argument raises an
ArgumentError naming the op, the argument and what is supported, before any GPU work (the
launcher is replaced by one that fails the test); valid CPU tensors get as far as the device
check (the last one)."""

from __future__ import annotations

import pytest
import torch

from tilebin.modeling.mhc.ops import multilayer_recompute as rc
from tilebin.modeling.mhc.ops import pre_split_mixes as sm
from tilebin.modeling.mhc.ops import sinkhorn as sk
from tilebin.runtime import ArgumentError

BF, F32 = torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    def launcher(name, **key):
        raise AssertionError(f"{name} was launched although its arguments were refused")

    for mod in (sk, sm, rc):
        monkeypatch.setattr(mod, "launcher", launcher)
    monkeypatch.setattr(sm, "get_num_sms", lambda device=None: 7)


def _raises(match: str, fn, *args, op: str, **kwargs) -> str:
    with pytest.raises(ArgumentError, match=match) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert msg.startswith(op + ":"), msg
    return msg


# ---------------------------------------------------------------- sinkhorn_normalize
@pytest.mark.parametrize("shape", [(3, 4, 4), (2, 5, 4, 4), (4, 4), (0, 4, 4), (7, 2, 2), (1, 8, 8)])
def test_sinkhorn_valid_reaches_device_check(shape):
    _raises("not a CUDA device", sk.sinkhorn_normalize, torch.zeros(shape), op="sinkhorn_normalize")
    _raises("not a CUDA device", sk.sinkhorn_normalize, torch.zeros(shape), 3, 1e-4, op="sinkhorn_normalize")


@pytest.mark.parametrize("x,match", [
    (torch.zeros((3, 4, 4), dtype=BF), "dtype bfloat16; supported: float32"),
    (torch.zeros((3, 4, 5)), r"supported: \[..., M, M\]"),
    (torch.zeros((3, 3, 3)), "M \\(mhc_mult\\) in 2, 4, 8"),
    (torch.zeros(4), r"shape \(4,\)"),
    ([[1.0]], "must be a torch.Tensor"),
])
def test_sinkhorn_bad_x(x, match):
    _raises(match, sk.sinkhorn_normalize, x, op="sinkhorn_normalize")


@pytest.mark.parametrize("repeat,match", [(0, "repeat=0 is out of range"), (-2, "out of range"), (1.5, "must be an int"),
                                          (True, "must be an int"), (torch.tensor(3), "must be an int"),
                                          (sk.MAX_REPEAT + 1, "out of range")])
def test_sinkhorn_bad_repeat(repeat, match):
    _raises(match, sk.sinkhorn_normalize, torch.zeros((2, 4, 4)), repeat, op="sinkhorn_normalize")


@pytest.mark.parametrize("eps", ["1e-6", None, True, torch.tensor(1e-6)])
def test_sinkhorn_bad_eps(eps):
    _raises("eps must be a float", sk.sinkhorn_normalize, torch.zeros((2, 4, 4)), 10, eps, op="sinkhorn_normalize")


def test_sinkhorn_backward_scratch_limit_is_checked_in_forward():
    x = torch.zeros((1, 4, 4), requires_grad=True).expand(2**22, 4, 4)  # 4M matrices, no memory
    msg = _raises("scratch floats", sk.sinkhorn_normalize, x, 200, op="sinkhorn_normalize")
    assert "lower repeat" in msg


# ---------------------------------------------------------------- mhc_pre_split_mixes
def _split_args(lead=(2, 3), m=4):
    k = m * (m + 2)
    return [torch.zeros((*lead, k)), torch.ones(3), torch.zeros(k), m, 2.0, 1e-6]


@pytest.mark.parametrize("lead,m", [((2, 3), 4), ((1, 1), 4), ((0, 5), 4), ((7,), 2), ((2, 2, 2), 8), ((0,), 8)])
def test_split_valid_reaches_device_check(lead, m):
    _raises("not a CUDA device", sm.mhc_pre_split_mixes, *_split_args(lead, m), op="mhc_pre_split_mixes")


@pytest.mark.parametrize("index,value,match", [
    (0, torch.zeros((2, 3, 24), dtype=BF), "input_mixes has dtype bfloat16"),
    (0, torch.zeros((2, 3, 25)), r"supported: \[..., 24\]"),
    (0, torch.zeros(24), r"shape \(24,\)"),
    (1, torch.ones(4), r"mhc_scale has shape \(4,\)"),
    (1, torch.ones(3, dtype=torch.float64), "mhc_scale has dtype float64"),
    (2, torch.zeros(23), r"mhc_base has shape \(23,\); supported: \(24,\)"),
    (2, None, "mhc_base must be a torch.Tensor"),
    (3, 3, "mhc_mult=3 is not supported; supported: 2, 4, 8"),
    (3, 4.0, "mhc_mult must be an int"),
    (4, "2", "mhc_post_mult_value must be a float"),
    (5, None, "mhc_pre_eps must be a float"),
])
def test_split_bad_arguments(index, value, match):
    args = _split_args()
    args[index] = value
    _raises(match, sm.mhc_pre_split_mixes, *args, op="mhc_pre_split_mixes")


def test_split_mult_mismatch_names_the_width():
    args = _split_args(m=4)
    args[3] = 8
    _raises(r"supported: \[..., 80\]", sm.mhc_pre_split_mixes, *args, op="mhc_pre_split_mixes")


# ---------------------------------------------------------------- mhc_multilayer_recompute
def _rc_args(n=3, m=4, hidden=64, layers=3, post=2):
    return [torch.zeros((n, m, hidden), dtype=BF),
            [torch.zeros((n, m, 1)) for _ in range(layers)],
            [torch.zeros((n, hidden), dtype=BF) for _ in range(post)],
            [torch.zeros((n, m, 1)) for _ in range(post)],
            [torch.zeros((n, m, m)) for _ in range(post)],
            [torch.zeros((n, hidden), dtype=BF) for _ in range(layers)],
            [torch.zeros((n, m, hidden), dtype=BF) for _ in range(post)]]


@pytest.mark.parametrize("kw", [{}, {"post": 3}, {"layers": 1, "post": 0}, {"layers": 1, "post": 1}, {"n": 0},
                                {"m": 2, "hidden": 8}, {"m": 8, "hidden": 1280}])
def test_recompute_valid_reaches_device_check(kw):
    _raises("not a CUDA device", rc.mhc_multilayer_recompute, *_rc_args(**kw), op="mhc_multilayer_recompute")


def _mutate(fn):
    args = _rc_args()
    fn(args)
    return args


@pytest.mark.parametrize("mutate,match", [
    (lambda a: a.__setitem__(0, a[0].float()), "initial_residual has dtype float32"),
    (lambda a: a.__setitem__(0, torch.zeros((3, 3, 64), dtype=BF)), "M \\(mhc_mult\\) in 2, 4, 8"),
    (lambda a: a.__setitem__(0, torch.zeros((3, 4, 60), dtype=BF)), "hidden a positive multiple of 8"),
    (lambda a: a.__setitem__(0, torch.zeros((3, 64, 4), dtype=BF).transpose(1, 2)), "not contiguous"),
    (lambda a: a.__setitem__(1, []), "pre_mix_list is empty"),
    (lambda a: a.__setitem__(1, a[1][0]), "pre_mix_list must be a list of tensors"),
    (lambda a: a[5].pop(), "layer_input_list has 2 tensors but pre_mix_list has 3"),
    (lambda a: a[4].pop(), "comb_mix_list has 1 tensors but layer_output_list has 2"),
    (lambda a: [a[i].pop() for i in (2, 3, 4, 6)], "layer_output_list has 1 tensors for 3 layers; supported: 2 or 3"),
    (lambda a: a[1].__setitem__(1, torch.zeros((3, 4, 1), dtype=torch.float64)), r"pre_mix_list\[1\] has dtype float64"),
    (lambda a: a[1].__setitem__(2, torch.zeros((3, 5))), r"pre_mix_list\[2\] has shape \(3, 5\)"),
    (lambda a: a[2].__setitem__(0, torch.zeros((3, 32), dtype=BF)), r"layer_output_list\[0\] has shape"),
    (lambda a: a[4].__setitem__(1, torch.zeros((3, 4, 4)).transpose(1, 2)), r"comb_mix_list\[1\] is not contiguous"),
    (lambda a: a[6].__setitem__(0, torch.zeros(3 * 4 * 64 + 8, dtype=BF)[4:4 + 3 * 4 * 64].view(3, 4, 64)),
     r"residual_list\[0\]'s data pointer .* is not 16-byte aligned"),
    (lambda a: a[5].__setitem__(0, a[2][0]), r"overlaps"),
    (lambda a: a[6].__setitem__(1, a[0]), r"overlaps"),
    (lambda a: a[5].__setitem__(2, a[5][0]), r"overlaps"),
    (lambda a: a[5].__setitem__(1, a[0].view(-1)[:3 * 64].view(3, 64)), r"overlaps"),
])
def test_recompute_bad_arguments(mutate, match):
    _raises(match, rc.mhc_multilayer_recompute, *_mutate(mutate), op="mhc_multilayer_recompute")


def test_recompute_inputs_may_share_memory():
    """Only the outputs must be disjoint: one pre mix tensor read by two layers is fine."""
    args = _rc_args()
    args[1][1] = args[1][0]
    args[3][1] = args[3][0]
    _raises("not a CUDA device", rc.mhc_multilayer_recompute, *args, op="mhc_multilayer_recompute")
