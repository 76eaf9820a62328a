"""GPU tests of ``engram._engram_gate_bwd_candidate`` (the speed trial of issue 8; the op
launches it under ``TILEBIN_CANDIDATE_ENGRAM_GATE_BWD=1``): bit for bit equal to
``engram.engram_gate_bwd`` on the gate test grid of ``test_gpu_engram.py``, in the flat region
of the clamp and at other partial-row counts.  (``TILEBIN_CANDIDATE_ENGRAM_GATE_BWD=1 pytest
tests/gpu/test_gpu_engram.py`` runs every engram test, autograd and CUDA graphs included, on it.)
Removed with the switch when the winner is swapped in.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import poison_cache, seed
from engram_ref import gate as ref
from test_gpu_engram import CLAMP, EPS, GATE_CASES, _gate_inputs, _id, eg  # noqa: F401  (eg: the fixture)


CANDIDATE = "engram._engram_gate_bwd_candidate"  # launched by the op when TILEBIN_CANDIDATE_ENGRAM_GATE_BWD=1


def _bwd_both(case, clamp=CLAMP, zero_rows=False):
    """(the current kernel's outputs, the candidate's) on one case, fed the reference's statistics."""
    from tilebin.ops.engram import _gate

    tokens, hc, hidden = case
    seed("bwd_candidate", case, clamp)
    x, k, v, wh, we = _gate_inputs(tokens, hc, hidden, strided=tokens in (37, 129))
    if zero_rows:
        x[::7] = 0
    wf = ref.fused_weight(wh, we)
    go = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    stats = [s.float() for s in ref.gate_fwd(x, k, v, wf, EPS, clamp)[1:]]
    want = _gate._gate_bwd("engram.engram_gate_bwd", go, x, k, v, wf, *stats, clamp)
    poison_cache(3 * x.numel() * 2)
    got = _gate._gate_bwd(CANDIDATE, go, x, k, v, wf, *stats, clamp)
    return want, got


# the grid, plus hc > 4 (the staged heads, then the others loaded directly) at both row layouts
@pytest.mark.parametrize("case", GATE_CASES + [(65, 6, 2048), (33, 5, 7168), (17, 8, 576)], ids=_id)
def test_engram_gate_bwd_candidate_bits(eg, require, case):
    """The candidate equals engram.engram_gate_bwd bit for bit (all four outputs, grad_w_partial
    row by row), so it passes every test the current kernel passes."""
    require(CANDIDATE)
    want, got = _bwd_both(case)
    for name, a, b in zip(("grad_x", "grad_k", "grad_v", "grad_w_partial"), got, want):
        assert_bits_equal(a, b, f"candidate engram_gate_bwd{case} {name}")


def test_engram_gate_bwd_candidate_bits_clamp_and_sms(eg, require, sm_counts):
    """The flat region (G = 0: a large clamp, zero rows of x) and other partial-row counts."""
    require(CANDIDATE)
    counts, set_num_sms = sm_counts
    for sms in counts:
        set_num_sms(sms)
        for case, clamp in (((513, 4, 2048), 0.5), ((301, 4, 7168), 0.5), ((4001, 4, 4096), CLAMP)):
            want, got = _bwd_both(case, clamp, zero_rows=True)
            for name, a, b in zip(("grad_x", "grad_k", "grad_v", "grad_w_partial"), got, want):
                assert_bits_equal(a, b, f"candidate engram_gate_bwd{case} clamp={clamp} num_sms={sms} {name}")
    set_num_sms(0)
