"""GPU tests of ``tilebin.ops.engram`` and ``tilebin.modeling.engram`` against ``engram_ref``.

tile_kernels' grid: tokens {0, 1, 4001, 8001} x hidden {576, 2048, 2560, 3072, 4096, 6144, 7168}
plus odd multiples of 64 (1088, 1216, 8192), hc 4 (and 1, 3 for the run-time hc; those two cases
take k and v as strided views of one packed buffer).  The hash and
fused weight are bit-exact.  The gate forward's output is bit-exact given the kernel's own fp32
gate (``bf16(x + gate * v)``, fp32 product and sum), its gate equals the formula evaluated on its
own statistics within a few fp32 roundings, and its statistics and gate are within fp32
summation error of a float64 reference (the gate within the interval the dot product's error
allows: gate(s) is monotone and ill-conditioned near s = 0, so no fixed tolerance is right there);
the output is within tile_kernels' own bar (calc_diff < 2e-10) of the float64 reference.  The backward (fed the
reference's saved statistics, as tile_kernels' test does) within calc_diff < 1e-8 and one bf16
rounding of a float64 closed form (itself checked against autograd in the CPU tests).  The
autograd layer's gradients are checked against float64 autograd, with and without ``main_grad``,
and under CUDA-graph capture; there grad_out is zero on the few (token, head) pairs whose
pre-activation s the fp32 dot product cannot resolve to 1e-3 (|s| ~ 0, or |s| at the clamp's
step), see ``_ill_conditioned``: the gradient is ~ |s|**-0.5 there, so the fp32 forward's
rounding of s, not the kernels, decides it (those pairs are checked against the closed form on
the same statistics by test_engram_gate_bwd).  Before each op call the caching allocator's free memory is filled
with 0xFF (NaN for floats), so an element a kernel forgot to write shows up.
"""

from __future__ import annotations

import pytest
import torch

from _engram_util import assert_near, calc_diff
from _gpu_util import assert_bits_equal
from _moe_util import poison_cache, seed
from engram_ref import gate as ref
from engram_ref import hash as href

KERNELS = ("engram_hash", "fused_weight", "engram_gate_fwd", "engram_gate_bwd", "grad_w_reduce")
HIDDEN = (576, 2048, 2560, 3072, 4096, 6144, 7168)
ODD_HIDDEN = (1088, 1216, 8192)
EPS, CLAMP = 1e-20, 1e-6
# (tokens, hc, hidden): every hidden at 4001 tokens, the production sizes at 8001, edges at 0 and 1
GATE_CASES = ([(4001, 4, h) for h in HIDDEN + ODD_HIDDEN] + [(8001, 4, h) for h in (4096, 7168)]
              + [(0, 4, 7168), (1, 4, 576), (1, 4, 8192), (37, 1, 1088), (129, 3, 2048)])


def _id(case) -> str:
    return "t{}-hc{}-h{}".format(*case)


@pytest.fixture(scope="module")
def eg(require):
    for name in KERNELS:
        require(f"engram.{name}")
    from tilebin.modeling import engram as modeling
    from tilebin.ops import engram

    return engram, modeling


def _gate_inputs(tokens, hc, hidden, strided=False):
    x = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    if strided:  # k and v as views into one packed [tokens, hc + 1, 2 * hidden] buffer
        kv = torch.randn(tokens, hc + 1, 2 * hidden, device="cuda").bfloat16()
        k, v = kv[:, :hc, hidden:], kv[:, hc, :hidden]
    else:
        k = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
        v = torch.randn(tokens, hidden, device="cuda").bfloat16()
    wh = torch.randn(hc, hidden, device="cuda").bfloat16()
    we = torch.randn(hc, hidden, device="cuda").bfloat16()
    return x, k, v, wh, we


# ---------------------------------------------------------------- hash, fused weight
@pytest.mark.parametrize("tokens", [0, 1, 4001, 8001])
def test_engram_hash(eg, tokens):
    seed("hash", tokens)
    ids = torch.randint(0, 100000, (tokens, 3), dtype=torch.int32, device="cuda")
    mul = torch.randint(0, 100000, (2, 3), dtype=torch.int64, device="cuda")
    sizes = torch.randint(100000, 1000000, (2, 2, 8), dtype=torch.int32, device="cuda")
    offs = href.make_offsets(sizes)
    poison_cache(2 * tokens * 16 * 4)
    got = eg[0].engram_hash(ids, mul, sizes, offs)
    assert got.is_contiguous() and got.dtype == torch.int32
    assert_bits_equal(got, href.engram_hash(ids, mul, sizes, offs), f"engram_hash({tokens} tokens)")


@pytest.mark.parametrize("shape", [(4001, 2, 3, 8), (777, 5, 2, 1), (64, 4, 3, 3)])
def test_engram_hash_wraparound_and_negatives(eg, shape):
    """Any n, layers and tables; int64 products that wrap, negative hashes (floored remainder)."""
    tokens, n, layers, tables = shape
    seed("hash_wrap", shape)
    ids = torch.randint(-2**31, 2**31, (tokens, n), dtype=torch.int32, device="cuda")
    mul = torch.randint(-2**62, 2**62, (layers, n), dtype=torch.int64, device="cuda")
    sizes = torch.randint(1, 2**31 - 1, (layers, n - 1, tables), dtype=torch.int32, device="cuda")
    offs = torch.randint(-2**31, 2**31, (layers, (n - 1) * tables), dtype=torch.int32, device="cuda")
    poison_cache(layers * tokens * (n - 1) * tables * 4)
    assert_bits_equal(eg[0].engram_hash(ids, mul, sizes, offs), href.engram_hash(ids, mul, sizes, offs),
                      f"engram_hash{shape} with wrap-around")


@pytest.mark.parametrize("hidden", HIDDEN + ODD_HIDDEN + (8, 10000))
def test_fused_weight(eg, hidden):
    seed("fused", hidden)
    wh, we = (torch.randn(4, hidden, device="cuda").bfloat16() for _ in range(2))
    poison_cache(4 * hidden * 4)
    got = eg[0].fused_weight(wh, we)
    assert got.is_contiguous()
    assert_bits_equal(got, wh.float() * we.float(), f"fused_weight(4 x {hidden})")


# ---------------------------------------------------------------- gate forward
DOT_ERR = 2.0 ** -18  # fp32 sum of products in any order of depth <= 64: |error| <= 64 * 2**-24 * sum|terms|
DOT_ERR_TYPICAL = 2.0 ** -23  # 8x the largest |error| / sum|terms| of the kernel's order at 16k rows (CPU emulation)
GATE_ULPS = 2.0 ** -20  # sqrt, sigmoid and the casts of the gate in fp32, relative


def _gate_of(s: torch.Tensor, clamp: float) -> torch.Tensor:
    """``sigmoid(copysign(sqrt(max(|s|, clamp)), s))`` in s's dtype: nondecreasing in s."""
    return torch.sigmoid(torch.copysign(s.abs().clamp_min(clamp).sqrt(), s))


def _s_and_error(x, k, wf, eps, err):
    """float64 ``s`` per (token, head) and a bound on the error of an fp32 evaluation of it:
    ``err * sum|x w k|`` for the dot product (the cancellation that makes s ~ 0 ill-conditioned)
    and ``err * |s|`` for the two rstds."""
    hidden = x.shape[-1]
    _, dot, _, rstd_x, rstd_k = ref.gate_fwd(x, k, x[:, 0], wf, eps, 0.0)
    scale = rstd_x * rstd_k * hidden ** -0.5
    s = dot * scale
    terms = (x.double() * wf.double().unsqueeze(0) * k.double()).abs().sum(-1)
    return s, err * (terms * scale + s.abs())


def calc_diff_below(got, want, max_diff: float, what: str) -> None:
    diff = calc_diff(torch.nan_to_num(got.double(), nan=1e30), want)
    assert diff < max_diff, f"{what}: calc_diff {diff:.3e} vs the float64 reference (limit {max_diff:.0e})"


def _check_gate_fwd(got, x, k, v, wf, eps, clamp, what):
    """``got = engram_gate_fwd(..., save_for_backward=True)`` against ``engram_ref``, see the module docstring."""
    tokens, hc, hidden = x.shape
    out, dot, gate, rstd_x, rstd_k = got
    assert out.is_contiguous() and out.dtype == torch.bfloat16, f"{what} output: {out.dtype} {out.stride()}"
    for name, t in (("dot", dot), ("gate_score", gate), ("rstd_x", rstd_x), ("rstd_k", rstd_k)):
        assert t.dtype == torch.float32 and t.shape == (tokens, hc), f"{what} {name}: {t.dtype} {tuple(t.shape)}"
    want = ref.gate_fwd(x, k, v, wf, eps, clamp)
    # the output's own arithmetic, given the kernel's gate: exact
    assert_bits_equal(out, (x.float() + gate.unsqueeze(-1) * v.float().unsqueeze(-2)).bfloat16(), f"{what} output")
    calc_diff_below(out, want[0], 2e-10, f"{what} output")  # tile_kernels' bar, end to end
    for name, g, w in (("dot", dot, want[1]), ("rstd_x", rstd_x, want[3]), ("rstd_k", rstd_k, want[4])):
        assert_near(g, w, f"{what} {name}", 2e-10, 1e-5, 1e-5)
    # the gate formula on the kernel's own statistics (s as the kernel rounds it): a few roundings
    s32 = ((dot * rstd_x) * rstd_k) * torch.tensor(hidden ** -0.5, dtype=torch.float32, device=dot.device)
    assert_near(gate, _gate_of(s32.double(), clamp), f"{what} gate_score from its own dot and rstds",
                2e-10, GATE_ULPS, 0.0)
    # the gate vs float64: inside [gate(s - ds), gate(s + ds)], ds the fp32 error bound of s
    s, ds = _s_and_error(x, k, wf, eps, DOT_ERR)
    lo, hi = _gate_of(s - ds, clamp) * (1 - GATE_ULPS), _gate_of(s + ds, clamp) * (1 + GATE_ULPS)
    g = gate.double()
    bad = ~((lo <= g) & (g <= hi))
    if int(bad.sum()):
        at = tuple(int(j) for j in torch.nonzero(bad)[0])
        raise AssertionError(f"{what} gate_score: {int(bad.sum())}/{g.numel()} outside the interval that the fp32 "
                             f"error of s allows; first at {at}: got {g[at].item()!r}, want [{lo[at].item()!r}, "
                             f"{hi[at].item()!r}] (float64 {want[2][at].item()!r}, s {s[at].item()!r} +- {ds[at].item():.2e})")
    calc_diff_below(gate, want[2], 2e-10, f"{what} gate_score")


@pytest.mark.parametrize("case", GATE_CASES, ids=_id)
def test_engram_gate_fwd(eg, case):
    tokens, hc, hidden = case
    seed("fwd", case)
    x, k, v, wh, we = _gate_inputs(tokens, hc, hidden, strided=tokens in (37, 129))
    wf = ref.fused_weight(wh, we)
    poison_cache(x.numel() * 2 + tokens * hc * 16)
    got = eg[0].engram_gate_fwd(x, k, v, wf, EPS, CLAMP, save_for_backward=True)
    what = f"engram_gate_fwd{case}"
    _check_gate_fwd(got, x, k, v, wf, EPS, CLAMP, what)
    poison_cache(x.numel() * 2)
    plain = eg[0].engram_gate_fwd(x, k, v, wf, EPS, CLAMP, save_for_backward=False)
    assert plain[1:] == (None, None, None, None)
    assert_bits_equal(plain[0], got[0], f"{what} output without save_for_backward")


def test_engram_gate_fwd_clamp_and_zero_rows(eg):
    """A large clamp (many gates at the clamp), zero rows of x (rstd = rsqrt(eps)) and a zero dot."""
    seed("fwd_edges")
    x, k, v, wh, we = _gate_inputs(513, 4, 2048)
    x[::7] = 0
    wh[1] = 0
    wf = ref.fused_weight(wh, we)
    for clamp in (0.5, 0.0):
        got = eg[0].engram_gate_fwd(x, k, v, wf, 1e-6, clamp)
        _check_gate_fwd(got, x, k, v, wf, 1e-6, clamp, f"engram_gate_fwd clamp={clamp}")


# ---------------------------------------------------------------- gate backward, grad_w_reduce
@pytest.mark.parametrize("case", GATE_CASES, ids=_id)
def test_engram_gate_bwd(eg, case):
    tokens, hc, hidden = case
    seed("bwd", case)
    x, k, v, wh, we = _gate_inputs(tokens, hc, hidden, strided=tokens in (37, 129))
    wf = ref.fused_weight(wh, we)
    go = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    stats = [s.float() for s in ref.gate_fwd(x, k, v, wf, EPS, CLAMP)[1:]]
    want = ref.gate_bwd(go, x, k, v, wf, *stats, CLAMP)
    poison_cache(3 * x.numel() * 2)
    gx, gk, gv, gwp = eg[0].engram_gate_bwd(go, x, k, v, wf, *stats, CLAMP)
    what = f"engram_gate_bwd{case}"
    for name, g, w in (("grad_x", gx, want[0]), ("grad_k", gk, want[1]), ("grad_v", gv, want[2])):
        assert g.is_contiguous() and g.dtype == torch.bfloat16, f"{what} {name}: {g.dtype} {g.stride()}"
        assert_near(g, w, f"{what} {name}", 1e-8, 2**-7, 1e-5)
    from tilebin.ops.config import get_num_sms
    assert gwp.shape == (get_num_sms(), hc, hidden) and gwp.dtype == torch.float32
    assert_near(gwp.sum(0), want[3], f"{what} grad_w_partial.sum(0)", 1e-8, 1e-3, 1e-5)


def test_engram_gate_bwd_clamp(eg):
    """A large clamp: about 40% of the pairs in the flat region (G = 0), zero rows of x (s = 0).
    The reference branches in float64 on the same fp32 statistics; a pair whose fp32 s (the
    kernel's rounding) falls on the other side of the clamp gets grad_out 0 (expected: none)."""
    seed("bwd_clamp")
    x, k, v, wh, we = _gate_inputs(513, 4, 2048)
    x[::7] = 0
    wf = ref.fused_weight(wh, we)
    go = torch.randn(x.shape, device="cuda").bfloat16()
    clamp = 0.5
    dot, gate, rx, rk = (t.float() for t in ref.gate_fwd(x, k, v, wf, EPS, clamp)[1:])
    s32 = ((dot * rx) * rk) * torch.tensor(2048 ** -0.5, dtype=torch.float32, device="cuda")
    flat = (dot.double() * rx.double() * rk.double() * 2048 ** -0.5).abs() < clamp
    split = flat != (s32.abs() < clamp)
    assert 0.2 < float(flat.float().mean()) < 0.8 and int(split.sum()) <= 1, (float(flat.float().mean()), int(split.sum()))
    go = go.masked_fill(split.unsqueeze(-1), 0)
    want = ref.gate_bwd(go, x, k, v, wf, dot, gate, rx, rk, clamp)
    got = eg[0].engram_gate_bwd(go, x, k, v, wf, dot, gate, rx, rk, clamp)
    for name, g, w in zip(("grad_x", "grad_k", "grad_v"), got, want):
        assert_near(g, w, f"engram_gate_bwd clamp={clamp} {name}", 1e-8, 2**-7, 1e-5)
    assert_near(got[3].sum(0), want[3], f"engram_gate_bwd clamp={clamp} grad_w_partial.sum(0)", 1e-8, 1e-3, 1e-5)


@pytest.mark.parametrize("hidden", (576, 4096, 7168, 1088))
def test_grad_w_reduce(eg, sm_counts, hidden):
    """Any row count (the SM counts of 132-, 114- and 78-SM parts, 7, 1); in place, fp32."""
    seed("reduce", hidden)
    counts, _ = sm_counts
    wh, we = (torch.randn(4, hidden, device="cuda").bfloat16() for _ in range(2))
    for rows in dict.fromkeys(counts + [132, 114, 78]):
        part = torch.randn(rows, 4, hidden, device="cuda")
        gh, ge = torch.randn(4, hidden, device="cuda"), torch.randn(4, hidden, device="cuda")
        want_h, want_e = gh.clone(), ge.clone()
        ref.grad_w_reduce(part, wh, we, want_h, want_e)
        assert eg[0].grad_w_reduce(part, wh, we, gh, ge) is None
        assert_near(gh, want_h, f"grad_w_reduce({rows} rows, {hidden}) grad_weight_hidden", 1e-10, 1e-4, 1e-5)
        assert_near(ge, want_e, f"grad_w_reduce({rows} rows, {hidden}) grad_weight_embed", 1e-10, 1e-4, 1e-5)


def test_bwd_weight_gradient_does_not_depend_on_sm_count(eg, sm_counts):
    seed("bwd_sms")
    x, k, v, wh, we = _gate_inputs(4001, 4, 4096)
    wf = ref.fused_weight(wh, we)
    go = torch.randn_like(x)
    stats = eg[0].engram_gate_fwd(x, k, v, wf, EPS, CLAMP)[1:]
    counts, set_num_sms = sm_counts
    base = None
    for sms in counts:
        set_num_sms(sms)
        gx, gk, gv, gwp = eg[0].engram_gate_bwd(go, x, k, v, wf, *stats, CLAMP)
        assert gwp.shape[0] == sms
        if base is None:
            base = (gx, gk, gv, gwp.sum(0))
            continue
        for name, a, b in zip(("grad_x", "grad_k", "grad_v"), (gx, gk, gv), base):
            assert_bits_equal(a, b, f"{name} with num_sms={sms} vs {counts[0]}")
        assert_near(gwp.sum(0), base[3], f"grad_w with num_sms={sms}", 1e-12, 1e-4, 1e-6)
    set_num_sms(0)


# ---------------------------------------------------------------- the autograd layer
def _autograd_ref(x, k, v, wh, we, go):
    leaves = [t.double().requires_grad_(True) for t in (x, k, v, wh, we)]
    ref.gate_autograd(*leaves, CLAMP, EPS).backward(go.double())
    return [t.grad for t in leaves]


def _ill_conditioned(x, k, wf, clamp: float, rel: float = 1e-3) -> torch.Tensor:
    """bool ``[tokens, hc]``: pairs whose s an fp32 forward may get wrong by more than ``rel``
    relative (|s| ~ 0: dot is a cancellation of terms ~ 1e5 times larger) or on the other side
    of the clamp's step.  From float64 inputs only, so no kernel result can widen it."""
    s, ds = _s_and_error(x, k, wf, EPS, DOT_ERR_TYPICAL)
    return (ds > rel * s.abs()) | ((s.abs() - clamp).abs() <= ds)


@pytest.mark.parametrize("case", [(4001, 4, 7168), (1, 4, 576), (257, 4, 1088)], ids=_id)
@pytest.mark.parametrize("main_grad", [False, True], ids=["grad", "main_grad"])
def test_engram_gate_autograd(eg, case, main_grad):
    tokens, hc, hidden = case
    seed("autograd", case, main_grad)
    x, k, v, wh, we = _gate_inputs(tokens, hc, hidden)
    go = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    ill = _ill_conditioned(x, k, ref.fused_weight(wh, we), CLAMP)
    n_ill = int(ill.sum())
    assert n_ill <= 0.01 * ill.numel() + 1, f"{n_ill}/{ill.numel()} ill-conditioned pairs: inputs not as intended"
    go = go.masked_fill(ill.unsqueeze(-1), 0)  # those pairs take no part: not in grad_v, grad_w either
    params = [t.clone().requires_grad_(True) for t in (x, k, v, wh, we)]
    if main_grad:
        for p in params[3:]:
            p.main_grad = torch.full(p.shape, 0.5, device="cuda")
    out = eg[1].engram_gate(params[0], params[1], params[2], params[3], params[4], CLAMP, EPS)
    out.backward(go)
    want = _autograd_ref(x, k, v, wh, we, go)
    what = f"engram_gate{case} ({n_ill}/{ill.numel()} ill-conditioned pairs with grad_out 0)"
    for name, p, w in zip(("x", "k", "v"), params, want):  # bf16 gradients vs the bf16-rounded reference
        assert_near(p.grad, w.to(p.grad.dtype), f"{what} grad {name}", 1e-7, 2**-6, 1e-4)
    for name, p, w in zip(("weight_hidden", "weight_embed"), params[3:], want[3:]):
        if main_grad:
            assert p.grad is None, f"{name}: the main_grad path must return None"
            assert_near(p.main_grad - 0.5, w, f"{what} {name}.main_grad", 1e-7, 1e-3, 1e-4)
        else:
            assert p.grad.dtype == torch.bfloat16
            assert_near(p.grad, w.to(p.grad.dtype), f"{what} {name}.grad", 1e-7, 2**-6, 1e-4)


def test_engram_gate_in_cuda_graph(eg):
    """fwd + bwd captured after a warm-up; replays on new inputs equal eager calls (bit for bit)."""
    seed("graph")
    x, k, v, wh, we = (t.requires_grad_(True) for t in _gate_inputs(1001, 4, 4096))
    we.main_grad = torch.zeros(we.shape, device="cuda")
    go = torch.randn(x.shape, device="cuda").bfloat16()

    def step():
        out = eg[1].engram_gate(x, k, v, wh, we, CLAMP, EPS)
        out.backward(go)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in (x, k, v, wh):
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    with torch.no_grad():
        for t in (x, k, v, wh, we, go):
            t.copy_(torch.randn(t.shape, device="cuda"))
        we.main_grad.zero_()
    graph.replay()
    torch.cuda.synchronize()
    got = [out.clone(), x.grad.clone(), k.grad.clone(), v.grad.clone(), wh.grad.clone(), we.main_grad.clone()]
    for t in (x, k, v, wh):
        t.grad = None
    we.main_grad.zero_()
    eager = step()
    want = [eager, x.grad, k.grad, v.grad, wh.grad, we.main_grad]
    for name, a, b in zip(("out", "grad x", "grad k", "grad v", "grad weight_hidden", "weight_embed.main_grad"),
                          got, want):
        assert_bits_equal(a, b, f"engram_gate graph replay vs eager: {name}")
