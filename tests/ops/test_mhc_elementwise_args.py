"""Argument errors of the mHC stream ops on CPU tensors: each bad input is an ``ArgumentError``
naming the op and the problem, raised before any launch (the launcher is a recorder), and valid
CPU input stops at the device check."""

from __future__ import annotations

import pytest
import torch

from tilebin.modeling.mhc.ops import expand as ex
from tilebin.modeling.mhc.ops import head_compute_mix as hm
from tilebin.modeling.mhc.ops import post as po
from tilebin.modeling.mhc.ops import pre_apply_mix as am
from tilebin.runtime import ArgumentError

BF16, F32 = torch.bfloat16, torch.float32


@pytest.fixture
def launches(monkeypatch):
    log = []

    def launcher(name, **key):
        return lambda *args: log.append(name)

    for mod in (ex, am, po, hm):
        monkeypatch.setattr(mod, "launcher", launcher)
    return log


def _post_args(m=4, h=64, lead=(2, 3)):
    return (torch.zeros(*lead, h, dtype=BF16), torch.zeros(*lead, m, h, dtype=BF16),
            torch.zeros(*lead, m, 1), torch.zeros(*lead, m, m))


def test_valid_cpu_input_reaches_the_device_check(launches):
    with pytest.raises(ArgumentError, match=r"^expand_to_mhc: hidden is on cpu, not a CUDA device"):
        ex.expand_to_mhc(torch.zeros(2, 64, dtype=BF16), 4)
    with pytest.raises(ArgumentError, match=r"^mhc_pre_apply_mix: x is on cpu, not a CUDA device"):
        am.mhc_pre_apply_mix(torch.zeros(2, 4, 64, dtype=BF16), torch.zeros(2, 4, 1))
    with pytest.raises(ArgumentError, match=r"^mhc_post_fwd: x is on cpu, not a CUDA device"):
        po.mhc_post(*_post_args())
    with pytest.raises(ArgumentError, match=r"^mhc_post_bwd: x is on cpu, not a CUDA device"):
        po.mhc_post_bwd(*_post_args(), torch.zeros(2, 3, 4, 64, dtype=BF16))
    with pytest.raises(ArgumentError, match=r"^mhc_head_compute_mix: input_mix is on cpu, not a CUDA device"):
        hm.mhc_head_compute_mix(torch.zeros(2, 3, 4), torch.ones(1), torch.zeros(4), 1e-6)
    assert launches == []


def _bad_expand():
    x = torch.zeros(2, 64, dtype=BF16)
    yield "dtype", (x.float(), 4), r"hidden has dtype float32; supported: bfloat16"
    yield "0d", (torch.zeros((), dtype=BF16), 4), r"hidden must be \[\.\.\., hidden_size\]"
    yield "hidden", (torch.zeros(2, 60, dtype=BF16), 4), r"hidden has shape \(2, 60\); its last dim \(hidden=60\)"
    yield "mhc0", (x, 0), r"mhc_mult=0 is out of range"
    yield "mhc_float", (x, 4.0), r"mhc_mult must be an int, got float"
    yield "noncontig", (torch.zeros(64, 2, dtype=BF16).T, 4), r"hidden has shape|hidden must be contiguous"
    yield "out_shape", (x, 4, torch.zeros(2, 3, 64, dtype=BF16)), r"out has shape \(2, 3, 64\), want \(2, 4, 64\)"
    yield "out_dtype", (x, 4, torch.zeros(2, 4, 64)), r"out has dtype float32; supported: bfloat16"
    yield "out_overlap", (x, 4, None), None


@pytest.mark.parametrize("case", list(_bad_expand()), ids=lambda c: c[0])
def test_expand_bad_arguments(launches, case):
    _, args, match = case
    if match is None:  # out aliasing the input
        buf = torch.zeros(2 * 4 * 64 + 2 * 64, dtype=BF16)
        x, out = buf[:128].view(2, 64), buf[:512].view(2, 4, 64)
        with pytest.raises(ArgumentError, match=r"^expand_to_mhc: out overlaps hidden"):
            ex.expand_to_mhc(x, 4, out)
    else:
        with pytest.raises(ArgumentError, match=r"^expand_to_mhc: " + match):
            ex.expand_to_mhc(*args)
    assert launches == []


def _bad_apply_mix():
    x, mix = torch.zeros(2, 4, 64, dtype=BF16), torch.zeros(2, 4, 1)
    yield "dtype", (x.float(), mix), r"x has dtype float32; supported: bfloat16"
    yield "rank", (torch.zeros(64, dtype=BF16), mix), r"x must be \[\.\.\., mhc_mult, hidden\]"
    yield "mhc3", (torch.zeros(2, 3, 64, dtype=BF16), torch.zeros(2, 3, 1)), \
        r"mhc_mult \(x.shape\[-2\]\)=3 is not supported; supported: mhc_mult in \(2, 4, 8\)"
    yield "hidden", (torch.zeros(2, 4, 12, dtype=BF16), mix), \
        r"x has shape \(2, 4, 12\); its last dim \(hidden=12\) must be a positive multiple of 8"
    yield "noncontig", (torch.zeros(4, 2, 64, dtype=BF16).transpose(0, 1), mix), r"x must be contiguous"
    yield "mix_dtype", (x, mix.double()), r"mix has dtype float64; supported: float32"
    yield "mix_shape", (x, torch.zeros(2, 4)), r"mix has shape \(2, 4\), want \(2, 4, 1\)"
    yield "out_shape", (x, mix, torch.zeros(2, 4, 64, dtype=BF16)), r"out must be 2-D|out has shape"


@pytest.mark.parametrize("case", list(_bad_apply_mix()), ids=lambda c: c[0])
def test_apply_mix_bad_arguments(launches, case):
    _, args, match = case
    with pytest.raises(ArgumentError, match=r"^mhc_pre_apply_mix: " + match):
        am.mhc_pre_apply_mix(*args)
    assert launches == []


def _bad_post():
    x, r, p, c = _post_args()
    yield "r_dtype", (x, r.float(), p, c), r"residual has dtype float32; supported: bfloat16"
    yield "mhc6", (x, torch.zeros(2, 3, 6, 64, dtype=BF16), torch.zeros(2, 3, 6, 1), torch.zeros(2, 3, 6, 6)), \
        r"mhc_mult \(residual.shape\[-2\]\)=6 is not supported"
    yield "hidden", (torch.zeros(2, 3, 20, dtype=BF16), torch.zeros(2, 3, 4, 20, dtype=BF16), p, c), \
        r"residual has shape .*hidden=20"
    yield "x_shape", (x[:, :2], r, p, c), r"x has shape \(2, 2, 64\), want \(2, 3, 64\)"
    yield "x_dtype", (x.half(), r, p, c), r"x has dtype float16; supported: bfloat16"
    yield "x_noncontig", (torch.zeros(3, 2, 64, dtype=BF16).transpose(0, 1), r, p, c), r"x must be contiguous"
    yield "p_shape", (x, r, p.squeeze(-1), c), r"post_layer_mix has shape \(2, 3, 4\), want \(2, 3, 4, 1\)"
    yield "p_dtype", (x, r, p.bfloat16(), c), r"post_layer_mix has dtype bfloat16; supported: float32"
    yield "c_shape", (x, r, p, c[..., :2]), r"comb_res_mix has shape \(2, 3, 4, 2\), want \(2, 3, 4, 4\)"
    yield "out_dtype", (x, r, p, c, torch.zeros(2, 3, 4, 64)), r"out has dtype float32; supported: bfloat16"
    yield "out_is_residual", (x, r, p, c, r), r"out overlaps residual"


@pytest.mark.parametrize("case", list(_bad_post()), ids=lambda c: c[0])
def test_post_bad_arguments(launches, case):
    _, args, match = case
    with pytest.raises(ArgumentError, match=r"^mhc_post_fwd: " + match):
        po.mhc_post(*args)
    assert launches == []


def test_post_bwd_bad_arguments(launches):
    x, r, p, c = _post_args()
    with pytest.raises(ArgumentError, match=r"^mhc_post_bwd: d_o has shape \(2, 3, 64\), want \(2, 3, 4, 64\)"):
        po.mhc_post_bwd(x, r, p, c, x)
    with pytest.raises(ArgumentError, match=r"^mhc_post_bwd: d_o has dtype float32; supported: bfloat16"):
        po.mhc_post_bwd(x, r, p, c, r.float())
    with pytest.raises(ArgumentError, match=r"^mhc_post_bwd: fuse_grad_acc must be a bool, got int 2"):
        po.mhc_post_bwd(x, r, p, c, r, 2)
    assert launches == []


def _bad_head():
    a, s, b = torch.zeros(2, 3, 4), torch.ones(1), torch.zeros(4)
    yield "dtype", (a.double(), s, b, 1e-6), r"input_mix has dtype float64; supported: float32"
    yield "mhc9", (torch.zeros(2, 9), s, torch.zeros(9), 1e-6), \
        r"input_mix has shape \(2, 9\); supported: mhc_mult \(its last dim\) from 1 to 8"
    yield "scale_shape", (a, torch.ones(3), b, 1e-6), r"mhc_scale has shape \(3,\), want \(1,\)"
    yield "scale_dtype", (a, s.bfloat16(), b, 1e-6), r"mhc_scale has dtype bfloat16; supported: float32"
    yield "base_shape", (a, s, torch.zeros(5), 1e-6), r"mhc_base has shape \(5,\), want \(4,\)"
    yield "eps", (a, s, b, "x"), r"mhc_pre_eps must be a float, got str"
    yield "eps_tensor", (a, s, b, torch.tensor(1e-6)), r"mhc_pre_eps must be a float, got Tensor"


@pytest.mark.parametrize("case", list(_bad_head()), ids=lambda c: c[0])
def test_head_bad_arguments(launches, case):
    _, args, match = case
    with pytest.raises(ArgumentError, match=r"^mhc_head_compute_mix: " + match):
        hm.mhc_head_compute_mix(*args)
    assert launches == []
