"""GPU tests of the speed candidates of ``engram.engram_gate_bwd`` (``kernels/engram/
engram_gate_bwd_candidate.py``): each candidate must give the shipped kernel's bits.

Both kernels are launched as ``ops/engram/_gate.py`` launches the shipped one (the shipped
kernel's argument list, ``grad_w_partial`` with ``num_blocks`` rows, scalars clamp and
hidden**-0.5) through ``runtime.unchecked_launcher``, on the same fresh random inputs (the saved
statistics from the float64 reference forward), into outputs filled with 0xFF (NaN) first; all
four outputs are compared bit for bit.  Cases: tokens {0, 1, 7, 131, 4001} x hidden {576, 2048,
4096, 4160, 7168, 8192} at hc 4 (k and v strided views of one packed buffer at 2048 and 7168);
hc {1, 2, 3, 8} at a few sizes; the flat region (clamp 0.5, zero rows of x); partial-row counts
other than the SM count (1, 2, 5, 7, 78, 114), which change the blocks' token ranges and, with
fewer rows than head groups, the grid.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import seed
from engram_ref import gate as ref

SHIPPED = "engram.engram_gate_bwd"
CANDIDATES = ("engram._engram_gate_bwd_candidate_halfbar", "engram._engram_gate_bwd_candidate_halfbar_split",
              "engram._engram_gate_bwd_candidate_halfbar_split_early")
EPS, CLAMP = 1e-20, 1e-6
HIDDEN = (576, 2048, 4096, 4160, 7168, 8192)
STRIDED = (2048, 7168)  # k and v as views into one packed buffer
CASES = ([(t, 4, h) for t in (0, 1, 7, 131, 4001) for h in HIDDEN]
         + [(t, hc, h) for hc in (1, 2, 3, 8) for t in (7, 131) for h in (576, 4096, 7168)]
         + [(1001, 8, 4096), (1001, 2, 7168)])
ROWS_CASES = [(4001, 4, 4096), (131, 3, 7168), (7, 8, 576), (1001, 4, 2048)]
ROWS = (1, 2, 5, 7, 78, 114)


def _id(case) -> str:
    return "t{}-hc{}-h{}".format(*case)


@pytest.fixture(scope="module")
def launchers(require):
    from tilebin import runtime

    for name in (SHIPPED, *CANDIDATES):
        require(name)
    return {name: runtime.unchecked_launcher(name) for name in (SHIPPED, *CANDIDATES)}


def _inputs(tokens: int, hc: int, hidden: int, clamp: float, zero_rows: bool = False) -> tuple:
    """go, x, k, v, weight_fused and the four saved statistics (the float64 reference forward's)."""
    x = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    if zero_rows:
        x[::7] = 0
    if hidden in STRIDED:
        kv = torch.randn(tokens, hc + 1, 2 * hidden, device="cuda").bfloat16()
        k, v = kv[:, :hc, hidden:], kv[:, hc, :hidden]
    else:
        k = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
        v = torch.randn(tokens, hidden, device="cuda").bfloat16()
    wh, we = (torch.randn(hc, hidden, device="cuda").bfloat16() for _ in range(2))
    wf = ref.fused_weight(wh, we)
    go = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    stats = tuple(s.float().contiguous() for s in ref.gate_fwd(x, k, v, wf, EPS, clamp)[1:])
    return go, x, k, v, wf, stats


def _poisoned(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device="cuda")
    t.view(torch.int16 if dtype == torch.bfloat16 else torch.int32).fill_(-1)  # all bits set: NaN
    return t


def _run(fn, args: tuple, clamp: float, rows: int) -> tuple:
    go, x, k, v, wf, stats = args
    tokens, hc, hidden = x.shape
    out = (_poisoned((tokens, hc, hidden), torch.bfloat16), _poisoned((tokens, hc, hidden), torch.bfloat16),
           _poisoned((tokens, hidden), torch.bfloat16), _poisoned((rows, hc, hidden), torch.float32))
    fn(go, x, k, v, wf, *stats, *out, clamp, hidden ** -0.5)
    torch.cuda.synchronize()
    return out


def _compare(launchers, args: tuple, clamp: float, rows: int, what: str) -> None:
    want = _run(launchers[SHIPPED], args, clamp, rows)
    for name in CANDIDATES:
        got = _run(launchers[name], args, clamp, rows)
        for label, g, w in zip(("grad_x", "grad_k", "grad_v", "grad_w_partial"), got, want):
            assert_bits_equal(g, w, f"{name} {what} {label}")


def _device_rows() -> int:
    from tilebin.ops.config import get_num_sms

    return get_num_sms()


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_candidates_bits(launchers, case):
    tokens, hc, hidden = case
    seed("cand_engram_bwd", case)
    _compare(launchers, _inputs(tokens, hc, hidden, CLAMP), CLAMP, _device_rows(), f"{case}")


@pytest.mark.parametrize("case", [(513, 4, 2048), (301, 4, 7168), (129, 3, 4096), (37, 1, 1088)], ids=_id)
def test_candidates_bits_clamp(launchers, case):
    """The flat region: clamp 0.5 and zero rows of x (G = 0 for many pairs)."""
    tokens, hc, hidden = case
    seed("cand_engram_bwd_clamp", case)
    _compare(launchers, _inputs(tokens, hc, hidden, 0.5, zero_rows=True), 0.5, _device_rows(), f"{case} clamp")


@pytest.mark.parametrize("case", ROWS_CASES, ids=_id)
def test_candidates_bits_rows(launchers, case):
    """Other partial-row counts (num_blocks): other ranges per block, fewer rows than head groups."""
    tokens, hc, hidden = case
    seed("cand_engram_bwd_rows", case)
    args = _inputs(tokens, hc, hidden, CLAMP)
    for rows in ROWS:
        _compare(launchers, args, CLAMP, rows, f"{case} rows={rows}")
