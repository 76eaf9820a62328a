"""GPU tests of the issue-9 speed candidates of the mHC stream kernels, run over ("current",
"candidate") kernels by patching the op module's kernel constant (what the
``TILEBIN_CANDIDATE_*`` switch sets at import):

* ``expand_to_mhc`` backward: ``mhc.expand_bwd`` / ``mhc._expand_bwd_candidate``
  (``modeling.mhc.ops.expand._BWD_KERNEL``);
* ``mhc_post_fwd``: ``mhc.post_fwd`` / ``mhc._post_fwd_candidate`` (``ops.post._FWD_KERNEL``);
* ``mhc_pre_apply_mix`` forward: ``mhc.pre_apply_mix_fwd`` / ``mhc._pre_apply_mix_fwd_candidate``
  (``ops.pre_apply_mix._FWD_KERNEL``).

Every output is compared bit for bit with the emulated fp32 expressions of ``mhc_ref`` (the same
the shipped kernels' tests use), after filling the allocator's free memory with 0xFF (an element
a kernel forgot to write shows up as NaN).  Sizes: 0 tokens, decode sizes 1-128, odd token
counts, the benchmark shapes (4096 and 8192 tokens x hidden 4096 / 7168), hidden from 8 up to
8192 (multiples of 64 and a few of only 8), mhc_mult 4 and every other value the kernels serve.
"""

from __future__ import annotations

import pytest
import torch

from _moe_util import poison_cache, seed
from mhc_ref import apply_mix as aref
from mhc_ref import expand as eref
from mhc_ref import post as pref
from mhc_ref.close import assert_bitwise

BF16 = torch.bfloat16
# (leading dims, hidden) at mhc_mult 4: decode sizes, odd counts, every hidden up to 8192, the bench
SHAPES = ([((0,), 4096), ((2, 0), 7168)]
          + [((n,), 4096) for n in (1, 2, 3, 7, 16, 31, 64, 100, 128)]
          + [((1, 13), h) for h in (64, 128, 192, 512, 960, 1024, 1088, 2048, 2560, 3072, 5120, 6144, 7168, 8128, 8192)]
          + [((5,), h) for h in (8, 16, 72, 136, 1000, 1032, 4104, 8184)]
          + [((2, 513), 4096), ((1, 1023), 7168), ((4096,), 4096), ((4096,), 7168), ((1, 8192), 4096),
             ((1, 8192), 7168)])
# (mhc_mult, leading dims, hidden) for the other stream counts
OTHER = [(m, lead, h) for m in (2, 8) for lead, h in (((1,), 4096), ((3, 17), 7168), ((129,), 64), ((33,), 8192),
                                                      ((7,), 136), ((2048,), 4096))]
EXPAND_OTHER = OTHER + [(m, lead, h) for m in (1, 3, 5, 6, 7, 9, 16, 33) for lead, h in (((1,), 4096), ((37,), 7168),
                                                                                        ((5,), 72))]


def _cases(other):
    return [(4, lead, h) for lead, h in SHAPES] + list(other)


def _ids(cases):
    return [f"m{m}-{'x'.join(map(str, lead))}-h{h}" for m, lead, h in cases]


def _bf16(*shape):
    return torch.randn(*shape, device="cuda").to(BF16)


def _unit(*shape, lo=0.0, hi=1.0):
    return torch.rand(*shape, device="cuda") * (hi - lo) + lo


def _poison(*like: torch.Tensor) -> None:
    poison_cache(4 * sum(t.numel() * t.element_size() for t in like) + (64 << 20))


def _switch(request, require, monkeypatch, module: str, attr: str):
    """Require the kernel ``request.param`` and make the op module ``module`` launch it."""
    import importlib

    require(request.param)
    mod = importlib.import_module(f"tilebin.modeling.mhc.ops.{module}")
    monkeypatch.setattr(mod, attr, request.param)
    return request.param


@pytest.fixture(params=("mhc.expand_bwd", "mhc._expand_bwd_candidate"), ids=("current", "candidate"))
def expand_bwd_kernel(request, require, monkeypatch):
    return _switch(request, require, monkeypatch, "expand", "_BWD_KERNEL")


@pytest.fixture(params=("mhc.post_fwd", "mhc._post_fwd_candidate"), ids=("current", "candidate"))
def post_fwd_kernel(request, require, monkeypatch):
    return _switch(request, require, monkeypatch, "post", "_FWD_KERNEL")


@pytest.fixture(params=("mhc.pre_apply_mix_fwd", "mhc._pre_apply_mix_fwd_candidate"), ids=("current", "candidate"))
def apply_mix_fwd_kernel(request, require, monkeypatch):
    return _switch(request, require, monkeypatch, "pre_apply_mix", "_FWD_KERNEL")


@pytest.mark.parametrize("m, lead, h", _cases(EXPAND_OTHER), ids=_ids(_cases(EXPAND_OTHER)))
def test_expand_bwd(expand_bwd_kernel, m, lead, h):
    from tilebin.modeling.mhc import ops

    seed("cand_expand_bwd", m, lead, h)
    x = _bf16(*lead, h).requires_grad_()
    out = ops.expand_to_mhc(x, m)
    g = _bf16(*lead, m, h)
    _poison(g, x)
    (gx,) = torch.autograd.grad(out, x, g)
    assert_bitwise(gx, eref.expand_bwd_emulated(g), f"expand bwd {lead} h{h} m{m} ({expand_bwd_kernel})")


@pytest.mark.parametrize("m, h", [(1, 7168), (4, 7168), (4, 4096), (3, 72)])
def test_expand_bwd_candidate_equals_current(require, monkeypatch, m, h):
    """Signed zeros, infinities and NaNs: the candidate's bits are the shipped kernel's (both add
    from +0, so an all -0 column gives +0, where the emulation starting from stream 0 gives -0)."""
    from tilebin.modeling.mhc import ops
    from tilebin.modeling.mhc.ops import expand

    seed("cand_expand_bwd_special", m, h)
    g = _bf16(37, m, h)
    flat = g.view(-1)
    flat[::7] = -0.0
    flat[3::101] = float("inf")
    flat[5::103] = -float("inf")
    flat[11::499] = float("nan")
    got = []
    for name in ("mhc.expand_bwd", "mhc._expand_bwd_candidate"):
        require(name)
        monkeypatch.setattr(expand, "_BWD_KERNEL", name)
        x = _bf16(37, h).requires_grad_()
        _poison(g, x)
        (gx,) = torch.autograd.grad(ops.expand_to_mhc(x, m), x, g)
        got.append(gx)
    assert_bitwise(got[1], got[0], f"expand bwd special values h{h} m{m}")


@pytest.mark.parametrize("m, lead, h", _cases(OTHER), ids=_ids(_cases(OTHER)))
def test_post_fwd(post_fwd_kernel, m, lead, h):
    from tilebin.modeling.mhc import ops

    seed("cand_post_fwd", m, lead, h)
    x, r = _bf16(*lead, h), _bf16(*lead, m, h)
    p, c = _unit(*lead, m, 1, hi=2.0), _unit(*lead, m, m, lo=-1.0)
    _poison(r, r)
    out = ops.mhc_post_fwd(x, r, p, c)
    assert_bitwise(out, pref.post_emulated(x, r, p, c), f"post fwd {lead} h{h} m{m} ({post_fwd_kernel})")


def test_post_fwd_into_out_and_strided_residual(post_fwd_kernel):
    """The checked path (``out`` given, a non-contiguous residual copied first)."""
    from tilebin.modeling.mhc import ops

    seed("cand_post_fwd_out")
    x = _bf16(2, 48, 4096)
    r = _bf16(4, 2, 48, 4096).permute(1, 2, 0, 3)
    p, c = _unit(2, 48, 4, 1), _unit(2, 48, 4, 4)
    out = torch.empty(2, 48, 4, 4096, dtype=BF16, device="cuda").fill_(float("nan"))
    assert ops.mhc_post(x, r, p, c, out=out) is out
    assert_bitwise(out, pref.post_emulated(x, r, p, c), f"post fwd into out ({post_fwd_kernel})")


@pytest.mark.parametrize("m, lead, h", _cases(OTHER), ids=_ids(_cases(OTHER)))
def test_apply_mix_fwd(apply_mix_fwd_kernel, m, lead, h):
    from tilebin.modeling.mhc import ops

    seed("cand_apply_mix_fwd", m, lead, h)
    x = _bf16(*lead, m, h)
    mix = _unit(*lead, m, 1, lo=-1.0)
    _poison(x)
    out = ops.mhc_pre_apply_mix(x, mix)
    assert_bitwise(out, aref.apply_mix_emulated(x, mix), f"apply_mix fwd {lead} h{h} m{m} ({apply_mix_fwd_kernel})")


def test_apply_mix_fwd_into_out(apply_mix_fwd_kernel):
    from tilebin.modeling.mhc import ops

    seed("cand_apply_mix_out")
    x, mix = _bf16(3, 5, 4, 7168), _unit(3, 5, 4, 1)
    out = torch.empty(3, 5, 7168, dtype=BF16, device="cuda").fill_(float("nan"))
    assert ops.mhc_pre_apply_mix(x, mix, out) is out
    assert_bitwise(out, aref.apply_mix_emulated(x, mix), f"apply_mix fwd into out ({apply_mix_fwd_kernel})")
