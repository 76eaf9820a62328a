"""CPU tests of the Engram ops' argument checks (no GPU): every bad argument raises an ArgumentError
naming the op, the argument and what is supported, before any GPU work (a recording launcher
proves nothing launched); valid CPU tensors get as far as the device check (the last one)."""

from __future__ import annotations

import pytest
import torch

from tilebin.ops import _spec
from tilebin.ops.engram import _gate as gt, _hash as hs
from tilebin.runtime import ArgumentError

BF, F32, I32, I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Any launch fails the test: every call here must stop at a check."""
    def launcher(name, **key):
        raise AssertionError(f"{name} was launched although its arguments were refused")

    for m in (gt, hs):
        monkeypatch.setattr(m, "launcher", launcher)
        for spec in m.SPECS:  # a configuration memoized by another test never serves these calls
            monkeypatch.setattr(spec, "memo", {})
    monkeypatch.setattr(gt, "get_num_sms", lambda device=None: 7)


def _raises(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(ArgumentError, match=match) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert msg.startswith(fn.__name__ + ":"), msg
    return msg


def _hash_args(tokens=5, n=3, layers=2, tables=8):
    return [torch.zeros((tokens, n), dtype=I32), torch.ones((layers, n), dtype=I64),
            torch.full((layers, n - 1, tables), 7, dtype=I32), torch.zeros((layers, (n - 1) * tables), dtype=I32)]


def _fwd_args(tokens=3, hc=4, hidden=576):
    return [torch.zeros((tokens, hc, hidden), dtype=BF), torch.zeros((tokens, hc, hidden), dtype=BF),
            torch.zeros((tokens, hidden), dtype=BF), torch.zeros((hc, hidden)), 1e-20, 1e-6]


def _bwd_args(tokens=3, hc=4, hidden=576):
    x, k, v, w, _, clamp = _fwd_args(tokens, hc, hidden)
    stats = [torch.zeros((tokens, hc)) for _ in range(4)]
    return [torch.zeros((tokens, hc, hidden), dtype=BF), x, k, v, w, *stats, clamp]


def _reduce_args(blocks=7, hc=4, hidden=576):
    return [torch.zeros((blocks, hc, hidden)), torch.zeros((hc, hidden), dtype=BF), torch.zeros((hc, hidden), dtype=BF),
            torch.zeros((hc, hidden)), torch.zeros((hc, hidden))]


VALID = {
    "engram_hash": lambda: (hs.engram_hash, _hash_args()),
    "engram_hash_any_sizes": lambda: (hs.engram_hash, _hash_args(tokens=0, n=5, layers=3, tables=1)),
    "fused_weight": lambda: (hs.fused_weight, [torch.zeros((4, 7168), dtype=BF), torch.zeros((4, 7168), dtype=BF)]),
    "fused_weight_odd": lambda: (hs.fused_weight, [torch.zeros((3, 1096), dtype=BF), torch.zeros((3, 1096), dtype=BF)]),
    "gate_fwd": lambda: (gt.engram_gate_fwd, _fwd_args()),
    "gate_fwd_0_tokens": lambda: (gt.engram_gate_fwd, _fwd_args(tokens=0, hidden=8192)),
    "gate_fwd_hc1_odd": lambda: (gt.engram_gate_fwd, _fwd_args(tokens=1, hc=1, hidden=1088)),
    "gate_bwd": lambda: (gt.engram_gate_bwd, _bwd_args()),
    "gate_bwd_0_tokens": lambda: (gt.engram_gate_bwd, _bwd_args(tokens=0, hidden=7168)),
    "grad_w_reduce": lambda: (gt.grad_w_reduce, _reduce_args()),
    "grad_w_reduce_114": lambda: (gt.grad_w_reduce, _reduce_args(blocks=114, hc=2, hidden=64)),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_cpu_arguments_reach_the_device_check(name):
    fn, args = VALID[name]()
    msg = _raises("not a CUDA device", fn, *args)
    assert ".cuda()" in msg


def test_gate_fwd_keyword_and_default():
    args = _fwd_args()
    _raises("not a CUDA device", gt.engram_gate_fwd, *args, save_for_backward=False)
    _raises("not a CUDA device", gt.engram_gate_fwd, *args[:4], eps=0, clamp_value=0.0)


# ---------------------------------------------------------------- engram_hash
@pytest.mark.parametrize("pos,bad,match", [
    (0, torch.zeros((5, 3), dtype=I64), "ngram_token_ids has dtype int64; supported: int32"),
    (0, torch.zeros((5,), dtype=I32), "ngram_token_ids must be 2-D"),
    (0, torch.zeros((3, 5), dtype=I32).T, "ngram_token_ids must be contiguous"),
    (0, torch.zeros((5, 1), dtype=I32), "n >= 2"),
    (1, torch.ones((2, 3), dtype=I32), "multipliers has dtype int32; supported: int64"),
    (1, torch.ones((2, 4), dtype=I64), r"multipliers has shape \(2, 4\)"),
    (1, torch.ones((0, 3), dtype=I64), "num_ngram_layers >= 1"),
    (2, torch.ones((2, 3, 8), dtype=I32), r"vocab_sizes has shape \(2, 3, 8\), want \(2, 2, "),
    (2, torch.ones((2, 2, 8), dtype=I64), "vocab_sizes has dtype int64"),
    (2, torch.ones((2, 2, 0), dtype=I32), "num_embed_table_per_ngram >= 1"),
    (3, torch.zeros((2, 15), dtype=I32), r"offsets has shape \(2, 15\), want \(2, 16\)"),
    (3, torch.zeros((16, 2), dtype=I32).T, "offsets must be contiguous"),
    (3, [[0] * 16] * 2, "offsets must be a torch.Tensor"),
])
def test_hash_bad_tensors(pos, bad, match):
    args = _hash_args()
    args[pos] = bad
    _raises(match, hs.engram_hash, *args)


def test_hash_too_many_outputs():
    args = _hash_args(tokens=1)
    args[0] = torch.zeros((1, 3), dtype=I32).expand(2**27, 3)  # 2 x 2**27 x 16 entries, no memory
    _raises("not a CUDA device|contiguous", hs.engram_hash, *args)


# ---------------------------------------------------------------- fused_weight
@pytest.mark.parametrize("a,b,match", [
    (torch.zeros((4, 576)), torch.zeros((4, 576), dtype=BF), "weight_hidden has dtype float32; supported: bfloat16"),
    (torch.zeros((4, 576), dtype=BF), torch.zeros((4, 512), dtype=BF), r"weight_embed has shape \(4, 512\)"),
    (torch.zeros((4, 577), dtype=BF), torch.zeros((4, 577), dtype=BF), "hidden size 577; supported: multiples of 8"),
    (torch.zeros((576,), dtype=BF), torch.zeros((576,), dtype=BF), "must be 2-D"),
    (torch.zeros((576, 4), dtype=BF).T, torch.zeros((4, 576), dtype=BF), "weight_hidden must be contiguous"),
    (torch.zeros((4, 584), dtype=BF)[:, 8:], torch.zeros((4, 576), dtype=BF), "contiguous"),
])
def test_fused_weight_bad(a, b, match):
    _raises(match, hs.fused_weight, a, b)


def test_fused_weight_misaligned():
    a = torch.zeros(4 * 576 + 1, dtype=BF)[1:].view(4, 576)
    _raises("not 16-byte aligned", hs.fused_weight, a, torch.zeros((4, 576), dtype=BF))


# ---------------------------------------------------------------- engram_gate_fwd / bwd: tensors
GATE_TENSOR_CASES = [
    (0, torch.zeros((3, 4, 576)), "hidden_states has dtype float32; supported: bfloat16"),
    (0, torch.zeros((3, 2304), dtype=BF), "hidden_states must be 3-D"),
    (0, torch.zeros((3, 576, 4), dtype=BF).transpose(1, 2), "hidden_states must be contiguous"),
    (0, torch.zeros((3, 0, 576), dtype=BF), "hc_mult >= 1"),
    (0, torch.zeros((3, 4, 580), dtype=BF), "hidden size 580; supported: multiples of 8 up to 8192"),
    (0, torch.zeros((3, 4, 8200), dtype=BF), "hidden size 8200; supported: multiples of 8 up to 8192"),
    (1, torch.zeros((3, 4, 512), dtype=BF), r"k has shape \(3, 4, 512\), want \(3, 4, 576\)"),
    (1, torch.zeros((3, 4, 576), dtype=torch.float16), "k has dtype float16"),
    (1, torch.zeros((3, 4, 1152), dtype=BF)[:, :, ::2], "dim 2 stride 1"),
    (1, torch.zeros((3, 4, 580), dtype=BF)[:, :, :576], "dim 1 stride non-negative multiples of 8"),
    (2, torch.zeros((576, 3), dtype=BF).T, "dim 1 stride 1"),
    (2, torch.zeros((4, 576), dtype=BF), r"v has shape \(4, 576\), want \(3, 576\)"),
    (2, torch.zeros((3, 580), dtype=BF)[:, :576], "v has strides"),
    (3, torch.zeros((4, 576), dtype=BF), "weight_fused has dtype bfloat16; supported: float32"),
    (3, torch.zeros((3, 576)), r"weight_fused has shape \(3, 576\), want \(4, 576\)"),
    (3, torch.zeros((576, 4)).T, "weight_fused must be contiguous"),
]


@pytest.mark.parametrize("pos,bad,match", GATE_TENSOR_CASES)
def test_gate_fwd_bad_tensors(pos, bad, match):
    args = _fwd_args()
    args[pos] = bad
    _raises(match, gt.engram_gate_fwd, *args)


@pytest.mark.parametrize("pos,bad,match", GATE_TENSOR_CASES)
def test_gate_bwd_bad_tensors(pos, bad, match):
    args = _bwd_args()
    args[pos + 1] = bad
    _raises(match, gt.engram_gate_bwd, *args)


def test_gate_strided_k_and_v_are_accepted():
    x, _, _, w, eps, clamp = _fwd_args(hidden=1088)
    kv = torch.zeros((3, 4, 2 * 1088 + 8), dtype=BF)
    k = kv[:, :, 8:1096]                             # strides (4 * 2184, 2184, 1), offset 16 bytes
    v = kv[:, 1, :1088]                              # strides (4 * 2184, 1)
    _raises("not a CUDA device", gt.engram_gate_fwd, x, k, v, w, eps, clamp)
    _raises("not a CUDA device", gt.engram_gate_fwd, x, x[:, :1].expand(3, 4, 1088), v, w, eps, clamp)


def test_gate_misaligned_k():
    x, _, v, w, eps, clamp = _fwd_args()
    k = torch.zeros(3 * 4 * 576 + 4, dtype=BF)[4:].view(3, 4, 576)
    _raises("k's data pointer .* not 16-byte aligned", gt.engram_gate_fwd, x, k, v, w, eps, clamp)


@pytest.mark.parametrize("pos,bad,match", [
    (0, torch.zeros((3, 4, 576)), "grad_out has dtype float32"),
    (0, torch.zeros((3, 4, 512), dtype=BF), r"grad_out has shape \(3, 4, 512\)"),
    (0, torch.zeros((3, 4, 1), dtype=BF).expand(3, 4, 576), "grad_out must be contiguous"),
    (5, torch.zeros((3, 4), dtype=BF), "dot has dtype bfloat16; supported: float32"),
    (6, torch.zeros((3, 3)), r"gate_score has shape \(3, 3\), want \(3, 4\)"),
    (7, torch.zeros((4, 3)).T, "rstd_x must be contiguous"),
    (8, torch.zeros((3, 4, 1)), "rstd_k must be 2-D"),
])
def test_gate_bwd_bad_grad_and_stats(pos, bad, match):
    args = _bwd_args()
    args[pos] = bad
    _raises(match, gt.engram_gate_bwd, *args)


# ---------------------------------------------------------------- scalars
@pytest.mark.parametrize("value", [True, None, "1e-6", float("nan"), float("inf"), -1e-6, 1e39, torch.tensor(1e-6)])
@pytest.mark.parametrize("name", ["eps", "clamp_value"])
def test_gate_fwd_bad_floats(name, value):
    args = _fwd_args()
    args[4 if name == "eps" else 5] = value
    _raises(name, gt.engram_gate_fwd, *args)


@pytest.mark.parametrize("value", [True, -1.0, float("nan"), "0"])
def test_gate_bwd_bad_clamp(value):
    args = _bwd_args()
    args[-1] = value
    _raises("clamp_value", gt.engram_gate_bwd, *args)


@pytest.mark.parametrize("value", [1, 0, None, "yes", 1.0])
def test_gate_fwd_save_for_backward_is_a_bool(value):
    msg = _raises("save_for_backward must be a bool", gt.engram_gate_fwd, *_fwd_args(), value)
    assert "True or False" in msg


# ---------------------------------------------------------------- grad_w_reduce
@pytest.mark.parametrize("pos,bad,match", [
    (0, torch.zeros((7, 4, 576), dtype=BF), "grad_w_partial has dtype bfloat16; supported: float32"),
    (0, torch.zeros((4, 576)), "grad_w_partial must be 3-D"),
    (0, torch.zeros((7, 4, 580)), "hidden size 580"),
    (0, torch.zeros((7, 576, 4)).transpose(1, 2), "grad_w_partial must be contiguous"),
    (1, torch.zeros((4, 512), dtype=BF), r"weight_hidden has shape \(4, 512\), want \(4, 576\)"),
    (2, torch.zeros((4, 576)), "weight_embed has dtype float32"),
    (3, torch.zeros((4, 576), dtype=BF), "grad_weight_hidden has dtype bfloat16; supported: float32"),
    (3, torch.zeros((2, 4, 576)), "grad_weight_hidden must be 2-D"),
    (4, torch.zeros((576, 4)).T, "grad_weight_embed must be contiguous"),
    (4, torch.zeros((3, 576)), r"grad_weight_embed has shape \(3, 576\)"),
])
def test_grad_w_reduce_bad(pos, bad, match):
    args = _reduce_args()
    args[pos] = bad
    _raises(match, gt.grad_w_reduce, *args)


def test_grad_w_reduce_refuses_aliased_outputs(monkeypatch):
    for m in (gt, _spec):  # CPU tensors get to the aliasing check (after the device check)
        monkeypatch.setattr(m, "check_cuda", lambda op, **t: None)
    args = _reduce_args()
    args[4] = args[3]
    _raises("grad_weight_hidden overlaps grad_weight_embed", gt.grad_w_reduce, *args)
    args = _reduce_args()
    both = torch.zeros((8, 576))
    args[3], args[4] = both[:4], both[4:]          # adjacent halves of one buffer: fine
    with pytest.raises(AssertionError, match="launched"):
        gt.grad_w_reduce(*args)
    args[0] = torch.zeros((1, 4, 576))
    args[3] = args[0][0]
    _raises("grad_weight_hidden overlaps grad_w_partial", gt.grad_w_reduce, *args)
