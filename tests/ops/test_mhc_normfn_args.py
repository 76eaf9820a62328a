"""Argument errors of ``mhc_pre_norm_fn`` and ``mhc_pre_big_fuse`` on CPU tensors: each bad input is an
``ArgumentError`` naming the op and the problem, raised before any launch (the launcher is a
recorder here), and valid CPU input stops at the device check."""

from __future__ import annotations

import pytest
import torch

from tilebin.modeling.mhc.ops import norm_fn as nf
from tilebin.modeling.mhc.ops import pre_big_fuse as bf
from tilebin.runtime import ArgumentError


@pytest.fixture
def launches(monkeypatch):
    log = []

    def launcher(name, **key):
        return lambda *args: log.append(name)

    for mod in (nf, bf):
        monkeypatch.setattr(mod, "launcher", launcher)
    return log


def _ok(m=4, h=64, outer=(2, 3)):
    res = torch.zeros(*outer, m, h, dtype=torch.bfloat16)
    fn = torch.zeros(m * (m + 2), m * h)
    return res, fn, torch.ones(m * h)


def test_valid_cpu_input_reaches_the_device_check(launches):
    res, fn, w = _ok()
    with pytest.raises(ArgumentError, match=r"mhc_pre_norm_fn: residual is on cpu, not a CUDA device"):
        nf.mhc_pre_norm_fn(res, fn, w, 1e-6)
    with pytest.raises(ArgumentError, match=r"mhc_pre_big_fuse: residual is on cpu, not a CUDA device"):
        bf.mhc_pre_big_fuse(res, fn, torch.ones(3), torch.zeros(24), 1e-6, 1e-6, 1e-6, 1.0, 10)
    assert launches == []


def _bad_norm_fn():
    res, fn, w = _ok()
    yield "dtype", (res.float(), fn, w, 1e-6), r"residual has dtype float32; supported: bfloat16"
    yield "rank", (res[0, 0, 0], fn, w, 1e-6), r"residual must be \[\.\.\., mhc_mult, hidden\]"
    r3, f3, _ = _ok(m=4)
    yield "mult3", (torch.zeros(2, 3, 64, dtype=torch.bfloat16), f3, None, 1e-6), r"residual has mhc_mult=3 .*supported: 4, 2, 8"
    yield "mult1", (torch.zeros(2, 1, 64, dtype=torch.bfloat16), f3, None, 1e-6), r"residual has mhc_mult=1 .*supported: 4, 2, 8"
    yield "fn_for_mult8", (torch.zeros(2, 8, 64, dtype=torch.bfloat16), f3, None, 1e-6), r"fn has shape \(24, 256\); want .*\[80, 512\]"
    yield "hidden", (torch.zeros(2, 4, 96, dtype=torch.bfloat16), f3, None, 1e-6), r"residual has hidden=96; supported: a positive multiple of 64"
    yield "noncontig", (torch.zeros(4, 2, 64, dtype=torch.bfloat16).transpose(0, 1), fn, w, 1e-6), r"residual must be contiguous"
    yield "fn_shape", (res, fn[:20], w, 1e-6), r"fn has shape \(20, 256\); want .*\[24, 256\]"
    yield "fn_dtype", (res, fn.double(), w, 1e-6), r"fn has dtype float64; supported: float32"
    yield "fn_noncontig", (res, torch.zeros(256, 24).T, w, 1e-6), r"fn must be contiguous"
    yield "w_shape", (res, fn, w[:10], 1e-6), r"mhc_norm_weight has shape \(10,\); want \[mhc_mult \* hidden\] = \[256\]"
    yield "w_dtype", (res, fn, w.bfloat16(), 1e-6), r"mhc_norm_weight has dtype bfloat16; supported: float32"
    yield "eps", (res, fn, w, "x"), r"mhc_norm_eps must be a float, got str"
    yield "fuse", (res, fn, w, 1e-6, 2), r"fuse_grad_acc must be a bool, got int 2"
    yield "splits0", (res, fn, w, 1e-6, True, 0), r"n_splits=0 is out of range; supported: 1 <= n_splits"
    yield "splits_bool", (res, fn, w, 1e-6, True, True), r"n_splits must be an int, got bool"


@pytest.mark.parametrize("case", list(_bad_norm_fn()), ids=lambda c: c[0])
def test_norm_fn_bad_arguments(launches, case):
    _, args, match = case
    with pytest.raises(ArgumentError, match=r"^mhc_pre_norm_fn: " + match):
        nf.mhc_pre_norm_fn(*args)
    assert launches == []


def _bad_big_fuse():
    res, fn, _ = _ok()
    s, b = torch.ones(3), torch.zeros(24)
    yield "dtype", (res.half(), fn, s, b), r"residual has dtype float16; supported: bfloat16"
    yield "fn_shape", (res, fn[:, :128], s, b), r"fn has shape \(24, 128\)"
    yield "scale_shape", (res, fn, torch.ones(4), b), r"mhc_scale has shape \(4,\); want \[3\]"
    yield "scale_dtype", (res, fn, s.double(), b), r"mhc_scale has dtype float64; supported: float32"
    yield "base_shape", (res, fn, s, torch.zeros(25)), r"mhc_base has shape \(25,\); want .* = \[24\]"
    yield "repeat0", (res, fn, s, b, 1e-6, 1e-6, 1e-6, 1.0, 0), r"sinkhorn_repeat=0 is out of range"
    yield "repeat_float", (res, fn, s, b, 1e-6, 1e-6, 1e-6, 1.0, 2.0), r"sinkhorn_repeat must be an int"
    yield "post_mult", (res, fn, s, b, 1e-6, 1e-6, 1e-6, None, 3), r"mhc_post_mult_value must be a float"
    yield "splits", (res, fn, s, b, 1e-6, 1e-6, 1e-6, 1.0, 3, -1), r"n_splits=-1 is out of range"


@pytest.mark.parametrize("case", list(_bad_big_fuse()), ids=lambda c: c[0])
def test_big_fuse_bad_arguments(launches, case):
    _, args, match = case
    if len(args) == 4:
        args = (*args, 1e-6, 1e-6, 1e-6, 1.0, 10)
    with pytest.raises(ArgumentError, match=r"^mhc_pre_big_fuse: " + match):
        bf.mhc_pre_big_fuse(*args)
    assert launches == []


def test_bad_main_grad_fails_in_forward(launches):
    """Before any other check (on CPU tensors: before the device check)."""
    res, fn, w = _ok()
    fn = fn.requires_grad_(True)
    fn.main_grad = torch.zeros(3)
    with pytest.raises(ArgumentError, match=r"^mhc_pre_norm_fn: mhc_fn\.main_grad must be 2-D, got shape \(3,\)"):
        nf.mhc_pre_norm_fn(res, fn, w, 1e-6)
    assert launches == []
