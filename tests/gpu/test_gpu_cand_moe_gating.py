"""GPU tests of the issue-12 gating candidates against the shipped kernels (bit for bit) and the torch reference.

* ``moe._top2_sum_gate_candidate`` (``TILEBIN_CANDIDATE_TOP2_SUM_GATE``): every scoring function x
  mask x fixed routing x shared experts (random physical map) x TP rank x EP size, grouped
  (32 experts per group: the register path; other sizes: the shared-memory path) and not;
  tokens 0, 1, 4, 16, 64, 128 (decode), odd and the benchmark sizes 4001 / 8001.  Indices,
  weights and ``unmapped_topk_idx`` must equal the shipped kernel's bit for bit; indices also
  the reference's (weights within its tolerance), with exact ties and NaN / +-inf / -0.0 scores.
* ``moe._topk_sum_and_topk_group_idx_candidate`` and ``moe._normalize_weight_candidate``:
  bits equal to the shipped kernels' at decode and benchmark sizes (more in
  ``test_gpu_moe_gating`` / ``test_gpu_moe_stats``, which run both kernels).
Outputs are fresh allocations over a poisoned caching allocator, so unwritten elements fail.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import test_gpu_moe_gating as base
from _gpu_util import assert_bits_equal
from moe_ref import gating as ref

TOP2 = ("moe.top2_sum_gate", "moe._top2_sum_gate_candidate")
TOPK_SUM = ("moe.topk_sum_and_topk_group_idx", "moe._topk_sum_and_topk_group_idx_candidate")
NORMALIZE = ("moe.normalize_weight", "moe._normalize_weight_candidate")
DECODE = (1, 4, 16, 64, 128)
# (num_groups, num_topk_groups, routed experts, shared experts, topk)
CONFIGS = ((8, 4, 256, 2, 8), (8, 8, 256, 2, 8), (2, 1, 64, 2, 8), (4, 2, 128, 1, 4), (12, 4, 144, 1, 6),
           (4, 2, 16, 1, 2), (16, 8, 256, 1, 9), (0, 0, 108, 2, 6), (0, 0, 256, 2, 8), (0, 0, 9, 1, 1))


@pytest.fixture(scope="module")
def moe(require):
    for name in TOP2 + TOPK_SUM + NORMALIZE:
        require(name)
    from tilebin.ops import moe

    return moe


@pytest.fixture
def gen():
    g = torch.Generator(device="cuda")
    g.manual_seed(12)
    return g


def _with_kernel(module, attr: str, name: str, fn):
    """``fn()`` with ``module.<attr>`` (the op's kernel choice) set to ``name``, the op memo emptied."""
    saved = getattr(module, attr)
    setattr(module, attr, name)
    module._FAST.clear()
    try:
        return fn()
    finally:
        setattr(module, attr, saved)
        module._FAST.clear()


def _top2_both(moe, args, kw):
    """(outputs of the shipped kernel, of the candidate): (idx, weights, unmapped) each."""
    from tilebin.ops.moe import _gating

    outs = []
    for name in TOP2:
        kw_n = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        base._poison_cache()
        idx, w = _with_kernel(_gating, "_TOP2_KERNEL", name, lambda kw_n=kw_n: moe.top2_sum_gate(*args, **kw_n))
        outs.append((idx, w, kw_n["unmapped_topk_idx"]))
    return outs


def _check_top2(moe, args, kw, what: str, against_ref: bool = True) -> None:
    cur, cand = _top2_both(moe, args, kw)
    for label, a, b in zip(("topk_idx", "topk_weights", "unmapped_topk_idx"), cand, cur):
        assert_bits_equal(a, b, f"{what}: {label} (candidate vs shipped)")
    if against_ref:
        kw_ref = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        ref_idx, ref_w = ref.top2_sum_gate(*args, **kw_ref)
        base._equal(cand[0], ref_idx, f"{what}: topk_idx vs reference")
        base._equal(cand[2], kw_ref["unmapped_topk_idx"], f"{what}: unmapped_topk_idx vs reference")
        base._close(cand[1], ref_w, f"{what}: topk_weights vs reference")


def _cases():
    cases = [(cfg, t) for cfg in CONFIGS for t in (0, 1, 37, 4001)]
    cases += [(CONFIGS[0], t) for t in DECODE[1:] + (8001,)]
    return cases + [(CONFIGS[7], 8001)]


@pytest.mark.parametrize("cfg,tokens", _cases(), ids=lambda v: str(v))
def test_top2_sum_gate_candidate(moe, gen, cfg, tokens):
    groups, topk_groups, experts, num_shared, topk = cfg
    shared_ok = topk % num_shared == 0 and experts % (topk // num_shared) == 0
    flag_sets = list(itertools.product((0, 10), (False, True), (False, True) if shared_ok else (False,), (0, 1)))
    if tokens >= 4001:
        flag_sets = flag_sets[::3]
    for n, (pad, fix, shared, tp_rank) in enumerate(flag_sets):
        for scoring in base.SCORING:
            num_ep = (1, 4, 8)[(n + len(scoring)) % 3]
            num_tp = 2 if n % 2 else 1
            bias = torch.randn(experts, device="cuda", generator=gen)
            logits = ref.separated_logits(tokens + pad, experts, bias, scoring, topk, groups, topk_groups, gen)
            args = (logits, bias, topk, topk_groups, groups, shared, num_shared, 1.5, n % num_ep, num_ep,
                    tp_rank % num_tp, num_tp, scoring)
            kw = base._routing_kwargs(gen, tokens, pad, experts, topk, num_shared if shared else 0, fix)
            _check_top2(moe, args, kw, f"{cfg} tokens={tokens} pad={pad} fix={fix} shared={shared} "
                                       f"tp={tp_rank % num_tp}/{num_tp} ep={n % num_ep}/{num_ep} {scoring}")


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda v: str(v))
def test_top2_sum_gate_candidate_ties_and_specials(moe, gen, cfg):
    """Exact ties (zero logits, integer biases) and NaN / +-inf / -0.0 logits: the shipped kernel's bits."""
    groups, topk_groups, experts, num_shared, topk = cfg
    for scoring in base.SCORING:
        for case in range(3):
            logits = torch.zeros(67, experts, device="cuda")
            bias = torch.randint(0, 3, (experts,), device="cuda", generator=gen).float() if case else \
                torch.zeros(experts, device="cuda")
            if case == 2:
                logits = torch.randint(-2, 3, (67, experts), device="cuda", generator=gen).float()
                logits[0, 3] = float("nan")
                logits[1] = -0.0
                logits[2, :experts // 2] = float("inf")
                logits[3, ::3] = float("-inf")
                logits[4, 1::5] = float("nan")
            args = (logits, bias, topk, topk_groups, groups, False, num_shared, 1.0, 0, 1, 0, 1, scoring)
            kw = base._routing_kwargs(gen, 67, 0, experts, topk, 0, False)
            _check_top2(moe, args, kw, f"ties {cfg} {scoring} case {case}", against_ref=case < 2)


@pytest.mark.parametrize("groups", (8, 2, 5, 9))  # 32 experts per group: <= 8 groups is the register path
@pytest.mark.parametrize("tokens", (1, 4, 16, 64, 128, 1001, 4001, 8001))
def test_topk_sum_candidate_bits(moe, gen, tokens, groups):
    from tilebin.ops.moe import _gating

    scores = torch.randn(tokens, groups, 32, device="cuda", generator=gen)
    scores[:, :, ::7] = torch.randint(-1, 2, (tokens, groups, 5), device="cuda", generator=gen).float()
    if tokens >= 8:
        scores[0, 0, 3] = float("nan")
        scores[1] = -0.0
        scores[2, -1] = float("inf")
        scores[3, :, 0] = float("-inf")
    for s, k in ((1, 2), (2, 2), (2, groups)):
        outs = []
        for name in TOPK_SUM:
            base._poison_cache()
            outs.append(_with_kernel(_gating, "_TOPK_SUM_KERNEL", name,
                                     lambda: moe.topk_sum_and_topk_group_idx(scores, s, k)))
        assert_bits_equal(outs[1], outs[0], f"topk_sum tokens={tokens} sum={s} k={k}")
        base._equal(outs[1], ref.topk_sum_and_topk_group_idx(scores.cpu(), s, k), f"topk_sum vs reference {tokens}")


@pytest.mark.parametrize("topk", (1, 2, 6, 8, 9, 16, 17))
@pytest.mark.parametrize("tokens", (1, 4, 16, 64, 128, 4001, 8001))
def test_normalize_weight_candidate_bits(moe, tokens, topk):
    from tilebin.ops.moe import _stats

    w = torch.rand((tokens, topk), device="cuda") + 0.01
    if tokens >= 8:
        w *= torch.exp2(torch.randint(-60, 61, (tokens, 1), device="cuda").float())
        w[1::7, 0] = 0
        w[3] = 0
    outs = []
    for name in NORMALIZE:
        base._poison_cache()
        outs.append(_with_kernel(_stats, "_NORMALIZE_KERNEL", name, lambda: moe.normalize_weight(w)))
    assert_bits_equal(outs[1][0], outs[0][0], f"denominator tokens={tokens} topk={topk}")
    assert_bits_equal(outs[1][1], outs[0][1], f"normalized tokens={tokens} topk={topk}")
