"""GPU tests of the small mHC speed candidates (issue 9) against the shipped kernels, bit for bit.

* ``mhc._head_compute_mix_fwd_candidate_{hoist,vec4}`` (``kernels/mhc/head_compute_mix_candidate.py``)
  vs ``mhc.head_compute_mix_fwd``, both launched directly with the op's arguments
  ``(input_mix [n, m], scale [1], base [m], output_mix [n, m], pre_eps)`` into NaN-poisoned outputs;
  compared as int32 words (NaN results included).  Tokens {0, 1, 13, 4096, 8192, 1111} x mhc
  {1, 2, 3, 4, 5, 8}, inputs with planted values that saturate the sigmoid or leave the reciprocal's
  fast path (+-inf, NaN, +-1e30, -88..-87, denormals, +-0); scales 0.8 and -25; 16-byte aligned
  tensors and 4-byte offset views (``vec4``'s scalar fallback; odd counts its tail).
* ``mhc._post_fwd_candidate_{pdl,pair}`` (``kernels/mhc/post_candidate.py``) vs ``mhc.post_fwd``,
  both launched directly (``runtime.unchecked_launcher(name, mhc=m)``, the op's views) into
  NaN-poisoned outputs, ``torch.equal``: n1 {1, 13, 4096} x hidden {1280, 4096, 4160, 7168} x mhc
  4, 2, 8 (4160: a last chunk of 8 vectors).
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import seed

HEAD = ("mhc._head_compute_mix_fwd_candidate_hoist", "mhc._head_compute_mix_fwd_candidate_vec4")
POST = ("mhc._post_fwd_candidate_pdl", "mhc._post_fwd_candidate_pair")
SPECIAL = [float("inf"), float("-inf"), float("nan"), 1e30, -1e30, -200.0, -88.8, -88.0, -87.5, -87.0, 88.0,
           200.0, 1e-40, -1e-40, 1e-45, 0.0, -0.0, 3.0]
HEAD_CASES = ([(n, m, sc, off) for n in (0, 1, 13, 4096, 8192) for m in (1, 2, 4, 8) for sc in (0.8, -25.0)
               for off in (0, 1)]
              + [(n, m, 0.8, off) for n in (1, 13, 1111) for m in (3, 5, 7) for off in (0, 1)]
              + [(1111, m, 0.8, off) for m in (1, 2, 4, 8) for off in (0, 1)])
HEAD_IDS = [f"n{n}-m{m}-s{sc}-off{off}" for n, m, sc, off in HEAD_CASES]


def _f32_view(numel: int, off: int) -> torch.Tensor:
    """``numel`` fp32 starting ``off`` floats into a fresh (256-byte aligned) NaN-filled buffer."""
    return torch.full((numel + off,), float("nan"), device="cuda")[off:]


def _head_input(n: int, m: int, off: int) -> torch.Tensor:
    x = _f32_view(n * m, off)
    x.copy_(torch.randn(n * m, device="cuda") * 4)
    if n * m:
        vals = torch.tensor(SPECIAL, device="cuda")
        where = torch.randint(0, n * m, (max(n * m // 5, 1),), device="cuda")
        x[where] = vals[torch.randint(0, len(SPECIAL), where.shape, device="cuda")]
    return x.view(n, m)


@pytest.mark.parametrize("kernel", HEAD)
@pytest.mark.parametrize("n, m, sc, off", HEAD_CASES, ids=HEAD_IDS)
def test_head_compute_mix_fwd_candidate(rt, require, kernel, n, m, sc, off):
    require("mhc.head_compute_mix_fwd")
    require(kernel)
    seed("cand_mhc_head_mix", n, m, sc, off)
    inp = _head_input(n, m, off)
    scale = torch.tensor([sc], device="cuda")
    base = torch.randn(m, device="cuda")
    eps = 1e-6
    want = _f32_view(n * m, 0).view(n, m)
    rt.unchecked_launcher("mhc.head_compute_mix_fwd")(inp, scale, base, want, eps)
    got = _f32_view(n * m, off).view(n, m)
    rt.unchecked_launcher(kernel)(inp, scale, base, got, eps)
    if n * m:
        assert inp.data_ptr() % 16 == (4 * off) % 16
    assert torch.equal(got.contiguous().view(torch.int32), want.contiguous().view(torch.int32)), \
        f"{kernel} differs at n{n} m{m} scale {sc} offset {off}"
    # the shipped kernel wrote every element of the poisoned output (NaN only where the input is NaN)
    assert not (want.isnan() & ~inp.isnan()).any(), "the shipped kernel left NaN"


N1 = (1, 13, 4096)
HIDDEN = (1280, 4096, 4160, 7168)
POST_CASES = [(m, n1, h) for m in (4, 2, 8) for n1 in N1 for h in HIDDEN]
POST_IDS = [f"m{m}-n{n1}-h{h}" for m, n1, h in POST_CASES]


@pytest.mark.parametrize("kernel", POST)
@pytest.mark.parametrize("m, n1, h", POST_CASES, ids=POST_IDS)
def test_post_fwd_candidate(rt, require, kernel, m, n1, h):
    require("mhc.post_fwd")
    require(kernel)
    seed("cand_mhc_post_small", m, n1, h)
    x = torch.randn(n1, h, device="cuda").to(torch.bfloat16)
    r = torch.randn(n1, m, h, device="cuda").to(torch.bfloat16)
    post = torch.randn(n1, m, device="cuda") * 2
    comb = torch.randn(n1, m, m, device="cuda")
    want = torch.full((n1, m, h), float("nan"), dtype=torch.bfloat16, device="cuda")
    rt.unchecked_launcher("mhc.post_fwd", mhc=m)(x, r, post, comb, want)
    got = torch.full((n1, m, h), float("nan"), dtype=torch.bfloat16, device="cuda")
    rt.unchecked_launcher(kernel, mhc=m)(x, r, post, comb, got)
    assert not want.isnan().any(), "the shipped kernel left NaN"
    assert torch.equal(got, want), f"{kernel} differs at m{m} n1 {n1} h{h}"
