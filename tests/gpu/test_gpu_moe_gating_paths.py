"""GPU tests of the gating kernels' paths at decode and benchmark sizes, against ``moe_ref.gating`` (torch).

* ``moe.top2_sum_gate``: every scoring function x mask x fixed routing x shared experts (random
  physical map) x TP rank x EP size, grouped (32 experts per group: the register path; other
  sizes: the shared-memory path) and not, on all three variants (``slots`` 2, 4, 8); tokens 0, 1,
  4, 16, 64, 128 (decode), odd and the benchmark sizes 4001 / 8001.  Indices and
  ``unmapped_topk_idx`` must equal the reference's, weights within its tolerance; exact ties too.
  NaN / +-inf / -0.0 logits: every index a distinct routed expert, ``unmapped_topk_idx`` equal to
  the indices, the same bits over two differently poisoned allocators.
* ``moe.topk_sum_and_topk_group_idx``: the register path (<= 8 groups of 32), the staged path
  (9 groups) at decode and benchmark sizes, with exact ties and special values, against the reference.
Outputs are fresh allocations over a poisoned caching allocator, so unwritten elements fail.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import test_gpu_moe_gating as base
from _gpu_util import assert_bits_equal
from moe_ref import gating as ref

DECODE = (1, 4, 16, 64, 128)
# (num_groups, num_topk_groups, routed experts, shared experts, topk)
CONFIGS = ((8, 4, 256, 2, 8), (8, 8, 256, 2, 8), (2, 1, 64, 2, 8), (4, 2, 128, 1, 4), (12, 4, 144, 1, 6),
           (4, 2, 16, 1, 2), (16, 8, 256, 1, 9), (0, 0, 108, 2, 6), (0, 0, 256, 2, 8), (0, 0, 9, 1, 1))


@pytest.fixture(scope="module")
def moe(require):
    for name in ("moe.top2_sum_gate", "moe.topk_sum_and_topk_group_idx"):
        require(name)
    from tilebin.ops import moe

    return moe


@pytest.fixture
def gen():
    g = torch.Generator(device="cuda")
    g.manual_seed(12)
    return g


def _poisoned(byte: int, fn):
    """``fn()`` with the caching allocator's free memory filled with ``byte``."""
    blob = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    blob.fill_(byte)
    del blob
    return fn()


def _top2(moe, args, kw, poison: int = 0xFF):
    """(topk_idx, topk_weights, unmapped_topk_idx) of one call on copies of ``kw``'s tensors."""
    kw_n = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    idx, w = _poisoned(poison, lambda: moe.top2_sum_gate(*args, **kw_n))
    return idx, w, kw_n["unmapped_topk_idx"]


def _check_top2(moe, args, kw, what: str) -> None:
    """Indices and unmapped_topk_idx equal to the reference's, weights within its tolerance."""
    idx, w, unmapped = _top2(moe, args, kw)
    kw_ref = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    ref_idx, ref_w = ref.top2_sum_gate(*args, **kw_ref)
    base._equal(idx, ref_idx, f"{what}: topk_idx vs reference")
    base._equal(unmapped, kw_ref["unmapped_topk_idx"], f"{what}: unmapped_topk_idx vs reference")
    base._close(w, ref_w, f"{what}: topk_weights vs reference")


def _check_top2_specials(moe, args, kw, experts: int, what: str) -> None:
    """NaN / inf logits (no reference): with one rank, no map and no shared experts every index is
    a distinct routed expert and unmapped_topk_idx holds the same; two calls over differently
    poisoned memory give the same bits (every element written, nothing read uninitialised)."""
    first = _top2(moe, args, kw, 0xFF)
    second = _top2(moe, args, kw, 0x00)
    for label, a, b in zip(("topk_idx", "topk_weights", "unmapped_topk_idx"), first, second):
        assert_bits_equal(a, b, f"{what}: {label} over 0xFF vs 0x00 poison")
    idx = first[0]
    assert bool(((idx >= 0) & (idx < experts)).all()), f"{what}: an index outside [0, {experts})"
    ordered = idx.sort(-1).values
    assert bool((ordered[:, 1:] != ordered[:, :-1]).all()), f"{what}: an expert picked twice in a row"
    base._equal(first[2], idx, f"{what}: unmapped_topk_idx vs topk_idx")


def _cases():
    cases = [(cfg, t) for cfg in CONFIGS for t in (0, 1, 37, 4001)]
    cases += [(CONFIGS[0], t) for t in DECODE[1:] + (8001,)]
    return cases + [(CONFIGS[7], 8001)]


@pytest.mark.parametrize("cfg,tokens", _cases(), ids=lambda v: str(v))
def test_top2_sum_gate_paths(moe, gen, cfg, tokens):
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
def test_top2_sum_gate_ties_and_specials(moe, gen, cfg):
    """Exact ties (zero logits, integer biases): the reference's order; NaN / +-inf / -0.0 logits: see
    ``_check_top2_specials``."""
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
            if case < 2:
                _check_top2(moe, args, kw, f"ties {cfg} {scoring} case {case}")
            else:
                _check_top2_specials(moe, args, kw, experts, f"specials {cfg} {scoring}")


@pytest.mark.parametrize("groups", (8, 2, 5, 9))  # 32 experts per group: <= 8 groups is the register path
@pytest.mark.parametrize("tokens", (1, 4, 16, 64, 128, 1001, 4001, 8001))
def test_topk_sum_paths(moe, gen, tokens, groups):
    scores = torch.randn(tokens, groups, 32, device="cuda", generator=gen)
    scores[:, :, ::7] = torch.randint(-1, 2, (tokens, groups, 5), device="cuda", generator=gen).float()
    if tokens >= 8:
        scores[0, 0, 3] = float("nan")
        scores[1] = -0.0
        scores[2, -1] = float("inf")
        scores[3, :, 0] = float("-inf")
    for s, k in ((1, 2), (2, 2), (2, groups)):
        out = _poisoned(0xFF, lambda: moe.topk_sum_and_topk_group_idx(scores, s, k))
        base._equal(out, ref.topk_sum_and_topk_group_idx(scores.cpu(), s, k),
                    f"topk_sum vs reference tokens={tokens} sum={s} k={k}")
