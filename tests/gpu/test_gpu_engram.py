"""GPU tests of ``tilebin.ops.engram`` and ``tilebin.modeling.engram`` against ``engram_ref``.

tile_kernels' grid: tokens {0, 1, 4001, 8001} x hidden {576, 2048, 2560, 3072, 4096, 6144, 7168}
plus odd multiples of 64 (1088, 1216, 8192), hc 4 (and 1, 3 for the run-time hc; those two cases
take k and v as strided views of one packed buffer).  The hash and
fused weight are bit-exact; the gate forward is within tile_kernels' own bar (calc_diff < 2e-10)
of a float64 reference and elementwise within one bf16 rounding; the backward (fed the
reference's saved statistics, as tile_kernels' test does) within calc_diff < 1e-8 and one bf16
rounding of a float64 closed form (itself checked against autograd in the CPU tests).  The
autograd layer's gradients are checked against float64 autograd, with and without ``main_grad``,
and under CUDA-graph capture.  Before each op call the caching allocator's free memory is filled
with 0xFF (NaN for floats), so an element a kernel forgot to write shows up.
"""

from __future__ import annotations

import pytest
import torch

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


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """tile_kernels' similarity measure: 1 - 2<x, y> / (|x|^2 + |y|^2), in float64."""
    x, y = x.double(), y.double()
    den = float((x * x + y * y).sum())
    return 0.0 if den == 0 else 1.0 - 2.0 * float((x * y).sum()) / den


def assert_near(got: torch.Tensor, want: torch.Tensor, what: str, max_diff: float, rtol: float, scale_atol: float):
    """calc_diff below ``max_diff``; |got - want| <= rtol |want| + scale_atol max|want|; no NaN."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
    if not got.numel():
        return
    g, w = got.double(), want.double()
    nan = int(torch.isnan(g).sum())
    err = (g - w).abs()
    bound = rtol * w.abs() + scale_atol * float(w.abs().max())
    bad = ~(err <= bound)
    diff = calc_diff(torch.nan_to_num(g, nan=1e30), w)
    if nan or int(bad.sum()) or not diff < max_diff:
        i = int(torch.nan_to_num(err - bound, nan=1e300).argmax())
        at = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), err.shape))
        raise AssertionError(f"{what}: {nan} NaN (unwritten poison?), {int(bad.sum())}/{got.numel()} outside "
                             f"rtol={rtol} + {scale_atol} * max; calc_diff {diff:.3e} (limit {max_diff:.0e}); "
                             f"worst at {at}: got {g[at].item()!r}, want {w[at].item()!r}")


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
@pytest.mark.parametrize("case", GATE_CASES, ids=_id)
def test_engram_gate_fwd(eg, case):
    tokens, hc, hidden = case
    seed("fwd", case)
    x, k, v, wh, we = _gate_inputs(tokens, hc, hidden, strided=tokens in (37, 129))
    wf = ref.fused_weight(wh, we)
    want = ref.gate_fwd(x, k, v, wf, EPS, CLAMP)
    poison_cache(x.numel() * 2 + tokens * hc * 16)
    got = eg[0].engram_gate_fwd(x, k, v, wf, EPS, CLAMP, save_for_backward=True)
    what = f"engram_gate_fwd{case}"
    assert got[0].is_contiguous() and got[0].dtype == torch.bfloat16
    assert_near(got[0], want[0], f"{what} output", 2e-10, 2**-7, 1e-6)
    for name, g, w in zip(("dot", "gate_score", "rstd_x", "rstd_k"), got[1:], want[1:]):
        assert g.dtype == torch.float32 and g.shape == (tokens, hc), f"{what} {name}: {g.dtype} {tuple(g.shape)}"
        assert_near(g, w, f"{what} {name}", 2e-10, 1e-5, 1e-5)
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
        want = ref.gate_fwd(x, k, v, wf, 1e-6, clamp)
        got = eg[0].engram_gate_fwd(x, k, v, wf, 1e-6, clamp)
        assert_near(got[0], want[0], f"engram_gate_fwd clamp={clamp} output", 2e-10, 2**-7, 1e-6)
        assert_near(got[2], want[2], f"engram_gate_fwd clamp={clamp} gate_score", 2e-10, 1e-5, 1e-6)


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


@pytest.mark.parametrize("case", [(4001, 4, 7168), (1, 4, 576), (257, 4, 1088)], ids=_id)
@pytest.mark.parametrize("main_grad", [False, True], ids=["grad", "main_grad"])
def test_engram_gate_autograd(eg, case, main_grad):
    tokens, hc, hidden = case
    seed("autograd", case, main_grad)
    x, k, v, wh, we = _gate_inputs(tokens, hc, hidden)
    go = torch.randn(tokens, hc, hidden, device="cuda").bfloat16()
    params = [t.clone().requires_grad_(True) for t in (x, k, v, wh, we)]
    if main_grad:
        for p in params[3:]:
            p.main_grad = torch.full(p.shape, 0.5, device="cuda")
    out = eg[1].engram_gate(params[0], params[1], params[2], params[3], params[4], CLAMP, EPS)
    out.backward(go)
    want = _autograd_ref(x, k, v, wh, we, go)
    for name, p, w in zip(("x", "k", "v"), params, want):  # bf16 gradients vs the bf16-rounded reference
        assert_near(p.grad, w.to(p.grad.dtype), f"engram_gate{case} grad {name}", 1e-7, 2**-6, 1e-4)
    for name, p, w in zip(("weight_hidden", "weight_embed"), params[3:], want[3:]):
        if main_grad:
            assert p.grad is None, f"{name}: the main_grad path must return None"
            assert_near(p.main_grad - 0.5, w, f"engram_gate{case} {name}.main_grad", 1e-7, 1e-3, 1e-4)
        else:
            assert p.grad.dtype == torch.bfloat16
            assert_near(p.grad, w.to(p.grad.dtype), f"engram_gate{case} {name}.grad", 1e-7, 2**-6, 1e-4)


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
