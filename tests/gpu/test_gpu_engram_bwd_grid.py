"""GPU tests of ``engram.engram_gate_bwd``'s persistent grid against ``engram_ref``, through
``tilebin.ops.engram.engram_gate_bwd``.

The kernel runs ``ng = ceil(hc / rpb)`` head groups (``rpb = 2`` heads per block at hidden <=
4096, 1 above) with ``max(1, num_blocks // ng)`` blocks each, a block walking the token ranges
``bx // ng + k * P`` in order.  Cases: tokens {0, 1, 7, 4001} x hc {4, 2, 8} x hidden {576, 2048,
4096, 4160, 7168, 8192} (both row layouts; k and v strided views of one packed buffer at 2048 and
7168); the flat region (a large clamp, zero rows of x) at hc 4, 3 and 1; SM counts {the
device's, 20 fewer, 114, 78, 7, 5, 2, 1}, which leave ``num_blocks % ng != 0`` or fewer blocks
than head groups.  Tolerances are test_gpu_engram.py's (calc_diff < 1e-8 and one bf16 rounding of
the float64 closed form on the same saved statistics).  Beyond ``grad_w_partial.sum(0)``, every
partial row is compared with the float64 sum over its own range (row ``p``: ``q + (p < r)`` tokens
from ``p * q + min(p, r)``, ``q, r = divmod(tokens, rows)``), the empty ranges' rows must be +0.0 exactly,
and grad_x, grad_k, grad_v must keep their bits across SM counts.  Before each op call the
caching allocator's free memory is filled with 0xFF (NaN), so an element the kernel forgot to
write shows up.
"""

from __future__ import annotations

import pytest
import torch

from _engram_util import assert_near
from _gpu_util import assert_bits_equal
from _moe_util import poison_cache, seed
from engram_ref import gate as ref

EPS, CLAMP = 1e-20, 1e-6
TOKENS = (0, 1, 7, 4001)
HIDDEN = (576, 2048, 4096, 4160, 7168, 8192)
STRIDED = (2048, 7168)  # hidden sizes whose k and v are views into one packed buffer
CASES = [(t, hc, h) for t in TOKENS for hc in (4, 2, 8) for h in HIDDEN]
EXTRA_SMS = (114, 78, 5, 2)  # besides the sm_counts fixture's (device, device - 20, 7, 1)


def _id(case) -> str:
    return "t{}-hc{}-h{}".format(*case)


@pytest.fixture(scope="module")
def eg(require):
    require("engram.engram_gate_bwd")
    from tilebin.ops import engram

    return engram


def _inputs(tokens: int, hc: int, hidden: int, clamp: float, zero_rows: bool = False) -> tuple:
    """go, x, k, v, weight_fused and the four saved statistics (from the float64 reference)."""
    x = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    if zero_rows:
        x[::7] = 0
    if hidden in STRIDED:  # k and v as views into one packed [tokens, hc + 1, 2 * hidden] buffer
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


def _partial_rows(args: tuple, clamp: float, rows: int) -> tuple[torch.Tensor, int]:
    """float64 ``[rows, hc, hidden]``, row ``p`` the reference weight gradient over range ``p``'s
    tokens (``q + (p < r)`` from ``p * q + min(p, r)``, ``q, r = divmod(tokens, rows)``; zeros where
    none), and the number of non-empty ranges."""
    go, x, k, v, wf, stats = args
    tokens, hc, hidden = x.shape
    want = torch.zeros(rows, hc, hidden, dtype=torch.float64, device="cuda")
    q, r = divmod(tokens, rows)
    used = rows if q else r
    for p in range(used):
        a = p * q + min(p, r)
        b = a + q + (p < r)
        want[p] = ref.gate_bwd(go[a:b], x[a:b], k[a:b], v[a:b], wf, *(s[a:b] for s in stats), clamp)[3]
    return want, used


def _check(eg, args: tuple, clamp: float, what: str, want: tuple | None = None) -> tuple:
    """One op call against the reference (``want``: ``ref.gate_bwd``'s result, computed when
    None); returns its grad_x, grad_k, grad_v."""
    from tilebin.ops.config import get_num_sms

    go, x, k, v, wf, stats = args
    _, hc, hidden = x.shape
    if want is None:
        want = ref.gate_bwd(go, x, k, v, wf, *stats, clamp)
    poison_cache(4 * go.numel() * 2 + 132 * hc * hidden * 4)
    gx, gk, gv, gwp = eg.engram_gate_bwd(go, x, k, v, wf, *stats, clamp)
    for name, g, w in (("grad_x", gx, want[0]), ("grad_k", gk, want[1]), ("grad_v", gv, want[2])):
        assert g.is_contiguous() and g.dtype == torch.bfloat16, f"{what} {name}: {g.dtype} {g.stride()}"
        assert_near(g, w, f"{what} {name}", 1e-8, 2**-7, 1e-5)
    rows = get_num_sms()
    assert gwp.shape == (rows, hc, hidden) and gwp.dtype == torch.float32, (
        f"{what} grad_w_partial: {gwp.dtype} {tuple(gwp.shape)}, want float32 {(rows, hc, hidden)}")
    assert_near(gwp.sum(0), want[3], f"{what} grad_w_partial.sum(0)", 1e-8, 1e-3, 1e-5)
    rows_want, used = _partial_rows(args, clamp, rows)
    assert_near(gwp[:used], rows_want[:used], f"{what} grad_w_partial rows 0..{used - 1} (one token range each)",
                1e-8, 1e-3, 1e-5)
    assert_bits_equal(gwp[used:], torch.zeros_like(gwp[used:]), f"{what} grad_w_partial rows {used}.. (empty ranges)")
    return gx, gk, gv


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_engram_gate_bwd_grid(eg, case):
    """Both row layouts at hc 4, 2 (one head group at hidden <= 4096) and 8; 0, 1 and 7 tokens
    leave most ranges empty (all of them at 0 tokens: zero rows only)."""
    tokens, hc, hidden = case
    seed("bwd_grid", case)
    _check(eg, _inputs(tokens, hc, hidden, CLAMP), CLAMP, f"engram_gate_bwd{case}")


@pytest.mark.parametrize("case", [(513, 4, 2048), (301, 4, 7168), (129, 3, 4096), (37, 1, 1088)], ids=_id)
def test_engram_gate_bwd_grid_clamp(eg, case):
    """The flat region (G = 0 for ~40 % of the pairs: clamp 0.5, zero rows of x, s = 0), hc 3 and
    1.  The reference branches in float64 on the same fp32 statistics; a pair whose fp32 s (the
    kernel's rounding) falls on the other side of the clamp gets grad_out 0, as in
    test_gpu_engram.py's clamp test (expected: none)."""
    tokens, hc, hidden = case
    clamp = 0.5
    seed("bwd_grid_clamp", case)
    go, x, k, v, wf, stats = _inputs(tokens, hc, hidden, clamp, zero_rows=True)
    dot, _, rx, rk = stats
    s32 = ((dot * rx) * rk) * torch.tensor(hidden ** -0.5, dtype=torch.float32, device="cuda")
    flat = (dot.double() * rx.double() * rk.double() * hidden ** -0.5).abs() < clamp
    split = flat != (s32.abs() < clamp)
    assert 0 < int(flat.sum()) < flat.numel() and int(split.sum()) <= 1, (int(flat.sum()), int(split.sum()))
    go = go.masked_fill(split.unsqueeze(-1), 0)
    _check(eg, (go, x, k, v, wf, stats), clamp, f"engram_gate_bwd{case} clamp={clamp}")


@pytest.mark.parametrize("case", [(4001, 4, 4096), (4001, 4, 7168), (1001, 8, 7168), (7, 3, 576)], ids=_id)
def test_engram_gate_bwd_grid_sm_counts(eg, sm_counts, case):
    """Other partial-row counts: the grid ``max(1, num_blocks // ng) * ng`` then covers each head
    group's ranges with other strides (fewer rows than head groups too: 2 or 1 rows at hc 3 and
    8); grad_x, grad_k and grad_v keep their bits."""
    tokens, hc, hidden = case
    counts, set_num_sms = sm_counts
    seed("bwd_grid_sms", case)
    args = _inputs(tokens, hc, hidden, CLAMP)
    want = ref.gate_bwd(*args[:5], *args[5], CLAMP)
    base = None
    for sms in dict.fromkeys(c for c in counts + list(EXTRA_SMS) if c <= counts[0]):
        set_num_sms(sms)
        what = f"engram_gate_bwd{case} num_sms={sms}"
        got = _check(eg, args, CLAMP, what, want)
        if base is None:
            base = (sms, got)
            continue
        for name, a, b in zip(("grad_x", "grad_k", "grad_v"), got, base[1]):
            assert_bits_equal(a, b, f"{what} {name} vs num_sms={base[0]}")
    set_num_sms(0)
