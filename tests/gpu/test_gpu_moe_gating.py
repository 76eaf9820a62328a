"""GPU tests of the gating ops of ``tilebin.ops.moe`` against ``moe_ref.gating`` (torch).

* topk_gate, topk_sum_and_topk_group_idx: indices bit-exact (dtype, shape, strides, values)
  against ``torch.sort(descending=True, stable=True)``, on random scores, on scores with many
  exact ties, and on NaN / +-inf / -0.0 (those against the CPU reference).
* top2_sum_gate: every scoring function x mask x fixed routing x shared experts (with a random
  physical map with duplicates) x TP rank, several EP sizes; indices and ``unmapped_topk_idx``
  bit-exact, weights within ``torch.allclose``'s defaults (tile_kernels' own tolerance: the
  reference sums and normalises in another order).  Logits are drawn so that the top-k and the
  kept groups are separated by 2e-6 / 1e-6 (as tile_kernels' test does); tie cases use exact
  scores (zero logits, integer biases) and are compared bit-exactly too.
* Token counts 0, 1, odd, 4001 and 8001; results identical under ``set_num_sms(fewer)``.
Outputs are fresh allocations over a poisoned caching allocator, so unwritten elements fail.
"""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

from moe_ref import gating as ref

SCORING = ("sigmoid", "sqrtsoftplus", "softmax")
TOPK_CONFIGS = ((72, 6), (32, 6), (64, 6), (96, 6), (16, 6), (36, 6), (108, 6), (128, 6), (144, 6), (256, 8),
                (4, 1), (9, 2), (9, 9), (256, 9), (300, 6), (1024, 8))
# (num_groups, num_topk_groups, routed experts, shared experts, topk): tile_kernels' test configs + the grid's
TOP2_CONFIGS = ((0, 0, 72, 1, 6), (0, 0, 32, 2, 6), (0, 0, 64, 2, 6), (0, 0, 96, 2, 6), (0, 0, 16, 2, 6),
                (0, 0, 36, 2, 6), (0, 0, 108, 2, 6), (0, 0, 128, 2, 6), (0, 0, 144, 2, 6), (8, 8, 256, 2, 8),
                (8, 4, 256, 2, 8), (4, 2, 16, 1, 2), (0, 0, 9, 1, 1), (12, 4, 144, 1, 6), (16, 8, 256, 1, 9),
                (4, 2, 64, 2, 8))


@pytest.fixture(scope="module")
def moe(require):
    for name in ("moe.topk_gate", "moe.top2_sum_gate", "moe.topk_sum_and_topk_group_idx"):
        require(name)
    from tilebin.ops import moe

    return moe


@pytest.fixture
def gen(request):
    g = torch.Generator(device="cuda")
    g.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g


def _poison_cache() -> None:
    blob = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    blob.fill_(0xFF)
    del blob


def _equal(out: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit-exact (dtype, shape, strides, values); the message names the first differing rows."""
    want = want.to(out.device)
    assert out.dtype == want.dtype, f"{what}: dtype {out.dtype}, want {want.dtype}"
    assert out.shape == want.shape, f"{what}: shape {tuple(out.shape)}, want {tuple(want.shape)}"
    assert out.is_contiguous(), f"{what}: strides {out.stride()} are not contiguous"
    if out.numel() == 0:
        return
    bad = (out != want).reshape(out.shape[0], -1).any(-1) if out.dim() else out != want
    n_bad = int(bad.sum())
    if n_bad:
        rows = bad.nonzero().flatten()[:4].tolist()
        detail = "\n".join(f"  row {r}: got {out[r].tolist()}, want {want[r].tolist()}" for r in rows)
        raise AssertionError(f"{what}: {n_bad}/{out.shape[0]} rows differ; first:\n{detail}")


def _close(out: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert out.dtype == want.dtype and out.shape == want.shape, \
        f"{what}: {out.dtype} {tuple(out.shape)}, want {want.dtype} {tuple(want.shape)}"
    if out.numel() == 0 or torch.allclose(out, want):
        return
    bad = ~torch.isclose(out, want)
    rows = bad.any(-1).nonzero().flatten()[:4].tolist()
    detail = "\n".join(f"  row {r}: got {out[r].tolist()}, want {want[r].tolist()}" for r in rows)
    raise AssertionError(f"{what}: {int(bad.sum())}/{out.numel()} weights outside allclose (rtol 1e-5, atol 1e-8);"
                         f" first rows:\n{detail}")


# ---------------------------------------------------------------- topk_gate
def _topk_cases():
    cases = [(t, e, k) for e, k in TOPK_CONFIGS for t in (1, 4001)]
    cases += [(8001, e, k) for e, k in ((256, 8), (72, 6), (9, 9), (1024, 8))]
    cases += [(0, 72, 6), (0, 1024, 8), (5, 16, 0)]
    return cases


@pytest.mark.parametrize("tokens,experts,topk", _topk_cases(), ids=lambda v: str(v))
def test_topk_gate(moe, gen, tokens, experts, topk):
    scores = torch.randn(tokens, experts, device="cuda", generator=gen)
    _poison_cache()
    _equal(moe.topk_gate(scores, topk), ref.topk_gate(scores, topk), f"topk_gate {tokens}x{experts} k={topk}")


@pytest.mark.parametrize("experts,topk", ((72, 6), (256, 8), (9, 9), (33, 32), (1024, 8)))
def test_topk_gate_ties_and_specials(moe, gen, experts, topk):
    scores = torch.randint(-2, 3, (257, experts), device="cuda", generator=gen).float()
    _equal(moe.topk_gate(scores, topk), ref.topk_gate(scores.cpu(), topk), "topk_gate ties")
    scores[0, ::3] = float("nan")
    scores[1, ::2] = -0.0
    scores[2] = float("-inf")
    scores[3, 1::4] = float("inf")
    scores[4, ::5] = -float("nan")
    scores[5] = 0.0
    _equal(moe.topk_gate(scores, topk), ref.topk_gate(scores.cpu(), topk), "topk_gate NaN/inf/-0")


# ---------------------------------------------------------------- topk_sum_and_topk_group_idx
def _group_cases():
    combos = [(e, g, s, k) for e in (72, 256) for g in (4, 8, 12, 16) if e % g == 0 for s in (1, 2) for k in (2, 4)]
    cases = [(1, *c) for c in combos] + [(4001, *c) for c in combos]
    cases += [(8001, 256, 8, 2, 4), (8001, 72, 12, 1, 2), (0, 256, 8, 2, 4), (33, 64, 32, 2, 32), (33, 7, 1, 1, 1)]
    cases += [(65, 1024, 8, 2, 4), (65, 520, 8, 1, 3), (65, 513, 1, 2, 1)]  # rows over the kernel's 512-float stage
    return cases


@pytest.mark.parametrize("tokens,experts,groups,topk_sum,topk_groups", _group_cases(), ids=lambda v: str(v))
def test_topk_sum_and_topk_group_idx(moe, gen, tokens, experts, groups, topk_sum, topk_groups):
    scores = torch.randn(tokens, groups, experts // groups, device="cuda", generator=gen)
    _poison_cache()
    out = moe.topk_sum_and_topk_group_idx(scores, topk_sum, topk_groups)
    _equal(out, ref.topk_sum_and_topk_group_idx(scores, topk_sum, topk_groups), "group idx")


def test_topk_sum_and_topk_group_idx_ties_and_specials(moe, gen):
    scores = torch.randint(-1, 2, (513, 8, 32), device="cuda", generator=gen).float()
    scores[0, 3, 5] = float("nan")
    scores[1] = -0.0
    scores[2, 6] = float("inf")
    scores[3, :, 0] = float("-inf")
    for s, k in ((1, 4), (2, 4), (2, 8)):
        _equal(moe.topk_sum_and_topk_group_idx(scores, s, k), ref.topk_sum_and_topk_group_idx(scores.cpu(), s, k),
               f"group idx ties sum={s} k={k}")


# ---------------------------------------------------------------- top2_sum_gate
def _routing_kwargs(gen, tokens, pad, experts, topk, shared, fix, extra=8):
    total = tokens + pad
    kw = dict(mask=None, fix_routing_mask=None, to_physical_map=None, logical_count=None,
              unmapped_topk_idx=torch.zeros(total, topk, dtype=torch.int64, device="cuda"))
    if pad:
        kw["mask"] = torch.ones(total, dtype=torch.bool, device="cuda")
        kw["mask"][tokens:] = False
    if shared:
        logical = experts + shared
        kw["to_physical_map"] = torch.randint(0, experts + extra, (logical, extra + 1), dtype=torch.int32,
                                              device="cuda", generator=gen)
        kw["logical_count"] = torch.randint(1, extra + 2, (logical,), dtype=torch.int32, device="cuda", generator=gen)
    if fix:
        kw["fix_routing_mask"] = torch.rand(total, device="cuda", generator=gen) < 0.5
        kw["unmapped_topk_idx"] = torch.randint(0, experts, (total, topk), device="cuda", generator=gen)
    return kw


def _run_top2(moe, args, kw, what):
    kw_ref = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    _poison_cache()
    idx, weights = moe.top2_sum_gate(*args, **kw)
    ref_idx, ref_weights = ref.top2_sum_gate(*args, **kw_ref)
    _equal(idx, ref_idx, f"{what}: topk_idx")
    _equal(kw["unmapped_topk_idx"], kw_ref["unmapped_topk_idx"], f"{what}: unmapped_topk_idx")
    _close(weights, ref_weights, f"{what}: topk_weights")
    return idx, weights


def _top2_cases():
    cases = []
    for i, cfg in enumerate(TOP2_CONFIGS):
        cases += [(cfg, t) for t in (1, 4001)]
        if i % 4 == 0:
            cases.append((cfg, 8001))
    return cases + [(TOP2_CONFIGS[0], 0)]


@pytest.mark.parametrize("cfg,tokens", _top2_cases(), ids=lambda v: str(v))
def test_top2_sum_gate(moe, gen, cfg, tokens):
    groups, topk_groups, experts, num_shared, topk = cfg
    shared_ok = topk % num_shared == 0 and experts % (topk // num_shared) == 0
    flag_sets = list(itertools.product((0, 10), (False, True), (False, True) if shared_ok else (False,), (0, 1)))
    if tokens >= 8001:  # the big size on a rotating subset of the flag combinations
        flag_sets = flag_sets[::3]
    for n, (pad, fix, shared, tp_rank) in enumerate(flag_sets):
        for scoring in SCORING:
            num_ep = (1, 4, 8)[(n + len(scoring)) % 3]
            if (experts + (8 if shared else 0)) // num_ep < 1:
                num_ep = 1
            bias = torch.randn(experts, device="cuda", generator=gen)
            logits = ref.separated_logits(tokens + pad, experts, bias, scoring, topk, groups, topk_groups, gen)
            args = (logits, bias, topk, topk_groups, groups, shared, num_shared, 1.5, n % num_ep, num_ep, tp_rank,
                    2, scoring)
            kw = _routing_kwargs(gen, tokens, pad, experts, topk, num_shared if shared else 0, fix)
            _run_top2(moe, args, kw, f"top2_sum_gate {cfg} tokens={tokens} pad={pad} fix={fix} shared={shared} "
                                     f"tp={tp_rank} ep={n % num_ep}/{num_ep} {scoring}")


@pytest.mark.parametrize("cfg", TOP2_CONFIGS, ids=lambda v: str(v))
def test_top2_sum_gate_ties(moe, gen, cfg):
    """Exact scores with many ties (zero logits, integer biases): bit-exact order, as torch's stable sort."""
    groups, topk_groups, experts, num_shared, topk = cfg
    for scoring in ("sigmoid", "softmax"):
        logits = torch.zeros(37, experts, device="cuda")
        for bias in (torch.zeros(experts, device="cuda"),
                     torch.randint(0, 3, (experts,), device="cuda", generator=gen).float()):
            args = (logits, bias, topk, topk_groups, groups, False, num_shared, 1.0, 0, 1, 0, 1, scoring)
            kw = _routing_kwargs(gen, 37, 0, experts, topk, 0, False)
            idx, _ = _run_top2(moe, args, kw, f"top2 ties {cfg} {scoring}")
            if not bias.any() and groups == topk_groups:  # all equal: experts 0..topk-1 in order
                want = torch.arange(topk, device="cuda").expand(37, topk)
                _equal(idx, want.contiguous(), "top2 all-equal scores")


def test_top2_sum_gate_unmapped_row_stride(moe, gen):
    """unmapped_topk_idx may be a column slice of a wider tensor (row stride != topk)."""
    bias = torch.randn(72, device="cuda", generator=gen)
    logits = ref.separated_logits(129, 72, bias, "sigmoid", 6, 0, 0, gen)
    wide = torch.randint(0, 72, (129, 10), device="cuda", generator=gen)
    wide_ref = wide.clone()
    fix = torch.rand(129, device="cuda", generator=gen) < 0.5
    args = (logits, bias, 6, 0, 0, False, 1, 2.5, 0, 1, 0, 1, "sigmoid")
    moe.top2_sum_gate(*args, fix_routing_mask=fix, unmapped_topk_idx=wide[:, 2:8])
    ref.top2_sum_gate(*args, fix_routing_mask=fix, unmapped_topk_idx=wide_ref[:, 2:8])
    _equal(wide, wide_ref, "unmapped_topk_idx slice and the columns around it")


# ---------------------------------------------------------------- SM count
def test_results_do_not_depend_on_num_sms(moe, gen):
    from tilebin.ops import config

    scores = torch.randn(4001, 256, device="cuda", generator=gen)
    bias = torch.randn(256, device="cuda", generator=gen)
    args = (scores, bias, 8, 4, 8, False, 1, 1.5, 0, 4, 1, 2, "sqrtsoftplus")
    full = (moe.topk_gate(scores, 8), moe.topk_sum_and_topk_group_idx(scores.view(4001, 8, 32), 2, 4),
            *moe.top2_sum_gate(*args))
    try:
        config.set_num_sms(8)
        few = (moe.topk_gate(scores, 8), moe.topk_sum_and_topk_group_idx(scores.view(4001, 8, 32), 2, 4),
               *moe.top2_sum_gate(*args))
    finally:
        config.set_num_sms(0)
    for name, a, b in zip(("topk_gate", "group_idx", "top2 idx", "top2 weights"), full, few):
        assert torch.equal(a, b), f"{name} changed with set_num_sms(8)"
