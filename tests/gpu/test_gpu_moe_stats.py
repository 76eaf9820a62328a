"""GPU tests of ``tilebin.ops.moe``'s statistics ops against ``moe_ref.stats`` (bit-exact).

aux_fi, group_count, normalize_weight, mask_indices_by_tp and inplace_unique_group_indices on
top-k indices made the way tile_kernels' tests make them (random bf16 scores over all experts
of all EP ranks, top-k, non-local experts as -1, rows with no local expert dropped): 0, 1, odd,
4001 and 8001 tokens x EP ranks, experts per rank {4, 9, 16, 32, 64, 72, 128, 144, 256}, top-k
{1, 2, 6, 8, 9}.  aux_fi and group_count run under several SM counts (``set_num_sms``) and must
give the same bits under each.  Every output is compared bit for bit (dtype, shape, strides,
bytes); aux_fi also within tile_kernels' own tolerance (calc_diff < 2e-7) of the literal
``counts.float() * E / (T * A)``.  Before each op call the caching allocator's free memory is
filled with 0xFF, so an element a kernel forgot to write shows up as poison.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, poison_cache, seed, topk_idx
from moe_ref import stats as ref

OPS = ("aux_fi", "group_count", "normalize_weight", "mask_indices_by_tp", "inplace_unique_group_indices")

# (tokens per EP rank, topk, experts per rank, EP ranks); rows = tokens x EP ranks before dropping
CASES = (
    (0, 8, 32, 8),
    (1, 1, 4, 64),
    (1, 9, 256, 1),
    (1, 6, 72, 8),
    (37, 6, 72, 1),
    (128, 8, 16, 16),
    (4001, 1, 128, 2),
    (4001, 2, 9, 8),
    (4001, 6, 32, 8),
    (4001, 8, 4, 64),
    (4001, 9, 144, 1),
    (4001, 8, 64, 4),
    (8001, 8, 32, 8),
    (8001, 9, 4, 64),
    (8001, 6, 256, 1),
)


def _case_id(case) -> str:
    return "t{}-k{}-e{}-ep{}".format(*case)


@pytest.fixture(scope="module")
def moe(require):
    return load_moe_ops(require, OPS, "ops/moe/_stats.py")


def _check_layout(out: torch.Tensor, shape: tuple, dtype: torch.dtype, what: str) -> None:
    assert out.is_cuda, f"{what}: on {out.device}, want a CUDA tensor"
    assert tuple(out.shape) == shape and out.dtype == dtype, (
        f"{what}: {tuple(out.shape)} {out.dtype}, want {shape} {dtype}")
    assert out.is_contiguous(), f"{what}: strides {out.stride()}, want contiguous"


def _same_under_sm_counts(fn, want: torch.Tensor, sm_counts, what: str) -> None:
    counts, set_num_sms = sm_counts
    for sms in counts:
        set_num_sms(sms)
        poison_cache(want.numel() * want.element_size())
        got = fn()
        _check_layout(got, tuple(want.shape), want.dtype, f"{what} num_sms={sms}")
        assert_bits_equal(got, want, f"{what} num_sms={sms}")
    set_num_sms(0)


# ---------------------------------------------------------------- aux_fi
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_aux_fi(moe, sm_counts, case):
    tokens, topk, experts, ep_ranks = case
    seed("aux_fi", case)
    idx = topk_idx(tokens, topk, experts, ep_ranks)
    for num_aux_topk in dict.fromkeys((1, topk)):
        what = f"aux_fi({tuple(idx.shape)} int64, num_experts={experts}, num_aux_topk={num_aux_topk})"
        want = ref.aux_fi(idx, experts, num_aux_topk)
        _same_under_sm_counts(lambda: moe.aux_fi(idx, experts, num_aux_topk), want, sm_counts, what)
        got = moe.aux_fi(idx, experts, num_aux_topk)
        literal = ref.aux_fi_divided(idx, experts, num_aux_topk)
        diff = ref.calc_diff(got, literal)
        assert diff < ref.AUX_FI_CALC_DIFF, f"{what}: calc_diff vs counts.float() * E / (T * A) = {diff:.3e}"


def test_aux_fi_reference_is_torchs_cuda_rounding():
    """The explicit reference equals torch's own CUDA evaluation of the literal formula (which
    multiplies by the float32 reciprocal of a host scalar divisor): the op is then bit-exact with
    tile_kernels' torch reference on CUDA, not only within its tolerance."""
    seed("aux_fi_literal")
    idx = topk_idx(4001, 8, 32, 8)
    for experts, a in ((32, 1), (32, 8), (7, 3)):
        assert_bits_equal(ref.aux_fi(idx, experts, a), ref.aux_fi_divided(idx, experts, a),
                          f"explicit vs literal aux_fi reference on CUDA (E={experts}, A={a}; torch rounding changed?)")


@pytest.mark.parametrize("experts", [4097, 9000])
def test_aux_fi_many_experts(moe, require, sm_counts, experts):
    """More bins than moe.aux_fi's shared histogram holds: the op launches moe.aux_fi_many_experts
    (its global-atomic path); out-of-range entries skipped."""
    require("moe.aux_fi_many_experts")
    seed("aux_fi_many", experts)
    idx = torch.randint(-2, experts + 3, (3001, 8), dtype=torch.int64, device="cuda")
    want = ref.aux_fi(idx, experts, 8)
    _same_under_sm_counts(lambda: moe.aux_fi(idx, experts, 8), want, sm_counts, f"aux_fi E={experts}")


# ---------------------------------------------------------------- group_count
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_group_count(moe, sm_counts, case):
    tokens, topk, experts, ep_ranks = case
    seed("group_count", case)
    idx = topk_idx(tokens, topk, experts, ep_ranks)
    what = f"group_count({tuple(idx.shape)} int64, num_groups={experts})"
    _same_under_sm_counts(lambda: moe.group_count(idx, experts), ref.group_count(idx, experts), sm_counts, what)


@pytest.mark.parametrize("groups", [1, 4, 8, 12, 16, 4096, 4097, 70000])
def test_group_count_any_range(moe, sm_counts, groups):
    """Random ids with -1, other negatives and ids >= num_groups (skipped); both histogram paths."""
    seed("group_count_range", groups)
    idx = torch.randint(-3, groups + 2, (8001, 9), dtype=torch.int64, device="cuda")
    what = f"group_count(8001 x 9 ids in [-3, {groups + 2}), num_groups={groups})"
    _same_under_sm_counts(lambda: moe.group_count(idx, groups), ref.group_count(idx, groups), sm_counts, what)


@pytest.mark.parametrize("single_block", [False, True], ids=["grid", "single"])
@pytest.mark.parametrize("shape", [(0, 8), (1, 1), (37, 6), (4001, 9)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kernel", ["moe.aux_fi_many_experts", "moe.group_count"])
def test_count_variants_on_any_size(rt, require, sm_counts, kernel, shape, single_block):
    """Both variants (cooperative grid, single block) at sizes and expert counts the op would not
    pick them for, through the checked ``runtime.launch`` (an unchecked-path failure then stands out)."""
    require(kernel)
    seed("variants", kernel, shape)
    bins = 72
    idx = torch.randint(-1, bins + 1, shape, dtype=torch.int64, device="cuda")
    aux = kernel == "moe.aux_fi_many_experts"
    want = ref.aux_fi(idx, bins, 3) if aux else ref.group_count(idx, bins)
    counts, set_num_sms = sm_counts
    for sms in (counts[0], counts[-1]):
        out = torch.full((bins,), -7, dtype=want.dtype, device="cuda")  # the kernel zeroes it itself
        args = (idx, out, 3, sms) if aux else (idx, out, sms)
        rt.launch(kernel, *args, single_block=single_block)
        assert_bits_equal(out, want, f"{kernel} single_block={single_block} {shape} num_sms={sms} (runtime.launch)")


# ---------------------------------------------------------------- normalize_weight
def _weights(rows: int, topk: int) -> torch.Tensor:
    w = torch.rand((rows, topk), dtype=torch.float32, device="cuda")
    if rows >= 8:  # magnitudes from 2**-60 to 2**60, exact zeros and an all-zero row
        w *= torch.exp2(torch.randint(-60, 61, (rows, 1), device="cuda").float())
        w[1::7, 0] = 0
        w[3] = 0
    return w


@pytest.mark.parametrize("topk", [1, 2, 6, 8, 9, 16, 17, 33])  # 16/17/33: around nvcc's 16-wide unroll of the row loop
@pytest.mark.parametrize("rows", [0, 1, 4001, 64008])
def test_normalize_weight(moe, rows, topk):
    seed("normalize_weight", rows, topk)
    w = _weights(rows, topk)
    want_den, want_norm = ref.normalize_weight(w)
    poison_cache(w.numel() * 4)
    den, norm = moe.normalize_weight(w)
    _check_layout(den, (rows,), torch.float32, "normalize_weight denominator")
    _check_layout(norm, (rows, topk), torch.float32, "normalize_weight normalized_weights")
    assert_bits_equal(den, want_den, f"normalize_weight({rows} x {topk}) denominator")
    assert_bits_equal(norm, want_norm, f"normalize_weight({rows} x {topk}) normalized_weights")


@pytest.mark.parametrize("case", CASES[6:10], ids=_case_id)
def test_normalize_weight_on_routing_rows(moe, case):
    seed("normalize_weight_rows", case)
    w = torch.rand(topk_idx(*case).shape, dtype=torch.float32, device="cuda")
    den, norm = moe.normalize_weight(w)
    want_den, want_norm = ref.normalize_weight(w)
    assert_bits_equal(den, want_den, f"normalize_weight({tuple(w.shape)}) denominator")
    assert_bits_equal(norm, want_norm, f"normalize_weight({tuple(w.shape)}) normalized_weights")


# ---------------------------------------------------------------- mask_indices_by_tp
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=["int64", "int32"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_mask_indices_by_tp(moe, case, dtype):
    tokens, topk, experts, ep_ranks = case
    seed("mask", case, str(dtype))
    n = experts * ep_ranks
    idx = topk_idx(tokens * ep_ranks, topk, n, 1)  # global ids over all EP ranks
    idx[::3, -1] = -1  # empty slots
    idx = idx.to(dtype)
    for num_tp_ranks in (1, 2, 4, 8):
        for tp_rank in dict.fromkeys((0, num_tp_ranks - 1, (tokens + topk) % num_tp_ranks)):
            what = (f"mask_indices_by_tp({tuple(idx.shape)} {dtype}, n={n}, ep={ep_ranks}, "
                    f"tp_rank={tp_rank}/{num_tp_ranks})")
            poison_cache(idx.numel() * idx.element_size())
            got = moe.mask_indices_by_tp(idx, n, ep_ranks, tp_rank, num_tp_ranks)
            _check_layout(got, tuple(idx.shape), dtype, what)
            assert_bits_equal(got, ref.mask_indices_by_tp(idx, n, ep_ranks, tp_rank, num_tp_ranks), what)


def test_mask_indices_by_tp_negative_and_uneven(moe):
    """-1 and other negatives, n not a multiple of num_ep_ranks (per_gpu = n // ep)."""
    seed("mask_uneven")
    idx = torch.randint(-5, 300, (4001, 9), dtype=torch.int64, device="cuda")
    for n, ep, tp, tpr in ((300, 7, 2, 3), (300, 64, 5, 8), (288, 8, 1, 2)):
        what = f"mask_indices_by_tp(n={n}, ep={ep}, tp_rank={tp}/{tpr})"
        got = moe.mask_indices_by_tp(idx, n, ep, tp, tpr)
        assert_bits_equal(got, ref.mask_indices_by_tp(idx, n, ep, tp, tpr), what)


# ---------------------------------------------------------------- inplace_unique_group_indices
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_inplace_unique_group_indices(moe, sm_counts, case):
    tokens, topk, experts, ep_ranks = case
    seed("unique", case)
    idx = topk_idx(tokens, topk, experts, ep_ranks)
    counts, set_num_sms = sm_counts
    for groups in (4, 8, 12, 16, 72):
        if (experts * ep_ranks) % groups:
            continue
        group_idx = torch.where(idx >= 0, idx // (experts * ep_ranks // groups), -1)
        want = group_idx.clone()
        ref.inplace_unique_group_indices(want, groups)
        for sms in (counts[0], counts[-1]):
            set_num_sms(sms)
            got = group_idx.clone()
            ptr = got.data_ptr()
            assert moe.inplace_unique_group_indices(got, groups) is None
            assert got.data_ptr() == ptr
            assert_bits_equal(got, want, f"inplace_unique_group_indices({tuple(got.shape)}, groups={groups}, "
                                         f"num_sms={sms})")
        set_num_sms(0)


@pytest.mark.parametrize("topk", [1, 2, 6, 8, 9, 16])
def test_inplace_unique_group_indices_repeats(moe, topk):
    """Many repeats, -1 and other negatives (a repeated -2 becomes -1, as in the reference)."""
    seed("unique_repeats", topk)
    group_idx = torch.randint(-3, 5, (4001, topk), dtype=torch.int64, device="cuda")
    want = group_idx.clone()
    ref.inplace_unique_group_indices(want, 5)
    moe.inplace_unique_group_indices(group_idx, 5)
    assert_bits_equal(group_idx, want, f"inplace_unique_group_indices(4001 x {topk} ids in [-3, 5))")
