"""GPU tests of the engram_gate_bwd speed candidates (issue 8) against the shipped op, bit for bit.

``engram._engram_gate_bwd_candidate`` (persistent blocks, 3-stage ring) and
``engram._engram_gate_bwd_candidate_s2`` (persistent blocks, 2 stages) are launched directly, as
``bench/bench_engram.py --candidate`` launches them (``runtime.unchecked_launcher`` with the
arguments ``ops/engram/_gate.py``'s ``_plan_bwd`` passes its kernel, ``grad_w_partial`` with
``get_num_sms()`` rows), into outputs pre-filled with NaN (an element a kernel forgot to write
stays NaN), and compared with ``torch.equal`` to the shipped op's four outputs on the same fresh
random inputs (the op's fresh outputs come from allocator memory filled with 0xFF first).  Shapes:
tokens {0, 1, 7, 4001} x hidden {576, 2048, 4096, 4160, 7168, 8192} x hc {4, 2, 8}, k and v
strided views of one packed buffer at hidden 2048 and 7168 (as test_gpu_engram.py's strided
cases); then the flat region (a large clamp, zero rows of x) and other partial-row counts.
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import poison_cache, seed
from engram_ref import gate as ref

CANDIDATES = ("engram._engram_gate_bwd_candidate", "engram._engram_gate_bwd_candidate_s2")
EPS, CLAMP = 1e-20, 1e-6
TOKENS = (0, 1, 7, 4001)
HIDDEN = (576, 2048, 4096, 4160, 7168, 8192)
CASES = [(t, hc, h) for t in TOKENS for hc in (4, 2, 8) for h in HIDDEN]
OUTPUTS = ("grad_x", "grad_k", "grad_v", "grad_w_partial")


def _id(case) -> str:
    return "t{}-hc{}-h{}".format(*case)


@pytest.fixture(scope="module")
def eg(require):
    require("engram.engram_gate_bwd")
    for name in CANDIDATES:
        require(name)
    from tilebin.ops import engram

    return engram


def _inputs(tokens: int, hc: int, hidden: int, clamp: float, zero_rows: bool = False):
    """go, x, k, v, weight_fused and the four saved statistics (from the float64 reference)."""
    x = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    if zero_rows:
        x[::7] = 0
    if hidden in (2048, 7168):  # k and v as views into one packed [tokens, hc + 1, 2 * hidden] buffer
        kv = torch.randn(tokens, hc + 1, 2 * hidden, device="cuda").bfloat16()
        k, v = kv[:, :hc, hidden:], kv[:, hc, :hidden]
    else:
        k = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
        v = torch.randn(tokens, hidden, device="cuda").bfloat16()
    wh, we = (torch.randn(hc, hidden, device="cuda").bfloat16() for _ in range(2))
    wf = ref.fused_weight(wh, we)
    go = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    stats = [s.float().contiguous() for s in ref.gate_fwd(x, k, v, wf, EPS, clamp)[1:]]
    return go, x, k, v, wf, stats


def _candidate(name: str, go, x, k, v, wf, stats, clamp: float) -> tuple:
    """The candidate launched as ``_plan_bwd``'s ``run`` launches the shipped kernel, outputs NaN-filled."""
    from tilebin import runtime
    from tilebin.ops.config import get_num_sms

    tokens, hc, hidden = x.shape
    nan = float("nan")
    grad_x = torch.full((tokens, hc, hidden), nan, dtype=torch.bfloat16, device="cuda")
    grad_k = torch.full((tokens, hc, hidden), nan, dtype=torch.bfloat16, device="cuda")
    grad_v = torch.full((tokens, hidden), nan, dtype=torch.bfloat16, device="cuda")
    grad_w_partial = torch.full((get_num_sms(x.device), hc, hidden), nan, dtype=torch.float32, device="cuda")
    runtime.unchecked_launcher(name)(go, x, k, v, wf, *stats, grad_x, grad_k, grad_v, grad_w_partial,
                                     clamp, hidden ** -0.5)
    return grad_x, grad_k, grad_v, grad_w_partial


def _assert_equal(got: tuple, want: tuple, what: str) -> None:
    for name, a, b in zip(OUTPUTS, got, want):
        assert a.shape == b.shape and a.dtype == b.dtype, (
            f"{what} {name}: {a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}")
        if not torch.equal(a, b):
            bad = ~(a == b)
            i = tuple(int(j) for j in torch.nonzero(bad)[0])
            raise AssertionError(f"{what} {name}: {int(bad.sum())}/{a.numel()} elements differ "
                                 f"({int(torch.isnan(a).sum())} NaN, i.e. unwritten); first at {i}: "
                                 f"candidate {a[i].item()!r}, shipped {b[i].item()!r}")


def _check(eg, case, clamp: float = CLAMP, zero_rows: bool = False, what: str = "") -> None:
    tokens, hc, hidden = case
    seed("bwd_candidate_bits", case, clamp, zero_rows)
    go, x, k, v, wf, stats = _inputs(tokens, hc, hidden, clamp, zero_rows)
    poison_cache(4 * go.numel() * 2 + 132 * hc * hidden * 4)
    want = eg.engram_gate_bwd(go, x, k, v, wf, *stats, clamp)
    for name in CANDIDATES:
        got = _candidate(name, go, x, k, v, wf, stats, clamp)
        _assert_equal(got, want, f"{name}{case}{what}")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_candidate_bits(eg, case):
    """Both candidates equal the shipped engram_gate_bwd bit for bit: grad_x, grad_k, grad_v and
    every grad_w_partial row (zeros for the ranges with no tokens, all of them at 0 tokens)."""
    _check(eg, case)


@pytest.mark.parametrize("case", [(513, 4, 2048), (301, 4, 7168), (129, 3, 4096), (37, 1, 1088)], ids=_id)
def test_candidate_bits_clamp(eg, case):
    """The flat region (G = 0 for ~40 % of the pairs: a large clamp, zero rows of x); hc 3 and 1."""
    _check(eg, case, clamp=0.5, zero_rows=True, what=" clamp=0.5")


@pytest.mark.parametrize("case", [(4001, 4, 4096), (4001, 4, 7168), (1001, 8, 7168), (7, 3, 576)], ids=_id)
def test_candidate_bits_sm_counts(eg, sm_counts, case):
    """Other partial-row counts (the device's SMs, 20 fewer, 7, 1, and 114 / 78 / 5 / 2): the
    candidates' persistent grid ``max(1, num_blocks // groups) * groups`` then covers each head
    group's ranges with other strides (fewer rows than head groups too)."""
    counts, set_num_sms = sm_counts
    for sms in dict.fromkeys(c for c in counts + [114, 78, 5, 2] if c <= counts[0]):
        set_num_sms(sms)
        _check(eg, case, what=f" num_sms={sms}")
    set_num_sms(0)
