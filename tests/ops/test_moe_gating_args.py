"""Bad-argument paths of the gating ops (``tilebin.ops.moe``: topk_gate, top2_sum_gate,
topk_sum_and_topk_group_idx).  CPU only: every check runs before the device check, so CPU
tensors reach them; a valid call on CPU tensors fails on the device, last."""

from __future__ import annotations

import pytest
import torch

from tilebin.ops.moe import _gating as g
from tilebin.runtime import ArgumentError


def _raises(match: str, fn, *args, **kwargs) -> None:
    with pytest.raises(ArgumentError, match=match) as info:
        fn(*args, **kwargs)
    assert str(info.value).split(":")[0] in ("topk_gate", "top2_sum_gate", "topk_sum_and_topk_group_idx")


# ---------------------------------------------------------------- topk_gate
def test_topk_gate_bad_scores():
    _raises("scores must be a torch.Tensor", g.topk_gate, [[1.0]], 1)
    _raises("dtype bfloat16", g.topk_gate, torch.zeros(4, 8, dtype=torch.bfloat16), 1)
    _raises("must be 2-D", g.topk_gate, torch.zeros(4, 8, 2), 1)
    _raises("contiguous", g.topk_gate, torch.zeros(8, 4).t(), 1)
    _raises("1025 experts", g.topk_gate, torch.zeros(2, 1025), 1)


@pytest.mark.parametrize("k", [9, -1, 2.0, True, None])
def test_topk_gate_bad_topk(k):
    _raises("num_topk", g.topk_gate, torch.zeros(4, 8), k)


def test_topk_gate_device_checked_last():
    _raises("CUDA device", g.topk_gate, torch.zeros(4, 8), 8)
    _raises("CUDA device", g.topk_gate, torch.zeros(0, 1024), 0)


# ---------------------------------------------------------------- topk_sum_and_topk_group_idx
def test_group_idx_bad_args():
    f = g.topk_sum_and_topk_group_idx
    _raises("dtype float16", f, torch.zeros(4, 8, 4, dtype=torch.float16), 2, 2)
    _raises("must be 3-D", f, torch.zeros(4, 32), 2, 2)
    _raises("contiguous", f, torch.zeros(4, 4, 8).transpose(1, 2), 2, 2)
    _raises("33 groups", f, torch.zeros(4, 33, 2), 2, 2)
    _raises("0 groups", f, torch.zeros(4, 0, 2), 1, 0)
    _raises("num_topk_sum", f, torch.zeros(4, 8, 4), 3, 2)
    _raises("num_topk_sum", f, torch.zeros(4, 8, 4), 0, 2)
    _raises("exceeds the 1 experts per group", f, torch.zeros(4, 8, 1), 2, 2)
    _raises("num_topk_groups", f, torch.zeros(4, 8, 4), 2, 9)
    _raises("num_topk_groups", f, torch.zeros(4, 8, 4), 2, -1)
    _raises("CUDA device", f, torch.zeros(4, 8, 4), 2, 4)


# ---------------------------------------------------------------- top2_sum_gate
def _args(tokens=4, experts=64, **over):
    kw = dict(logits=torch.zeros(tokens, experts), bias=torch.zeros(experts), num_topk=6, num_topk_groups=0,
              num_groups=0, use_shared_as_routed=False, num_shared_experts=0, routed_scaling_factor=1.5, ep_rank=0,
              num_ep_ranks=4, tp_rank=0, num_tp_ranks=2, scoring_func="sigmoid")
    kw.update(over)
    return kw


def _shared(tokens=4, experts=64, shared=1, extra=4, **over):
    m = torch.zeros(experts + shared, extra + 1, dtype=torch.int32)
    c = torch.ones(experts + shared, dtype=torch.int32)
    over.setdefault("num_topk", 8)
    return _args(tokens, experts, use_shared_as_routed=True, num_shared_experts=shared, to_physical_map=m,
                 logical_count=c, **over)


BAD_TOP2 = [
    ("dtype float16", dict(logits=torch.zeros(4, 64, dtype=torch.float16))),
    ("logits must be 2-D", dict(logits=torch.zeros(4, 64, 1))),
    ("logits must be contiguous", dict(logits=torch.zeros(64, 4).t())),
    ("bias has dtype float64", dict(bias=torch.zeros(64, dtype=torch.float64))),
    ("bias has 63 elements", dict(bias=torch.zeros(63))),
    ("257 experts", dict(logits=torch.zeros(4, 257), bias=torch.zeros(257))),
    ("num_topk=65", dict(num_topk=65)),
    ("num_topk=0", dict(num_topk=0)),
    ("num_topk=33", dict(logits=torch.zeros(4, 128), bias=torch.zeros(128), num_topk=33)),
    ("num_topk must be an int", dict(num_topk=6.0)),
    ("both must be zero", dict(num_groups=8, num_topk_groups=0)),
    ("num_topk_groups=9", dict(num_groups=8, num_topk_groups=9)),
    ("not divisible by num_groups=7", dict(num_groups=7, num_topk_groups=3)),
    ("1 expert\\(s\\) per group", dict(logits=torch.zeros(4, 32), bias=torch.zeros(32), num_groups=32,
                                       num_topk_groups=4)),
    ("num_groups=64 with a group limit", dict(logits=torch.zeros(4, 128), bias=torch.zeros(128), num_groups=64,
                                             num_topk_groups=4)),
    ("scoring_func='identity'", dict(scoring_func="identity")),
    ("scoring_func='relu'", dict(scoring_func="relu")),
    ("scoring_func=None", dict(scoring_func=None)),
    ("use_shared_as_routed must be a bool", dict(use_shared_as_routed=1)),
    ("num_ep_ranks=0", dict(num_ep_ranks=0)),
    ("ep_rank=4", dict(ep_rank=4)),
    ("tp_rank=2", dict(tp_rank=2)),
    ("num_tp_ranks=0", dict(num_tp_ranks=0)),
    ("no expert per rank", dict(num_ep_ranks=65)),
    ("routed_scaling_factor", dict(routed_scaling_factor="2")),
    ("mask has dtype int32", dict(mask=torch.ones(4, dtype=torch.int32))),
    ("mask has 5 elements", dict(mask=torch.ones(5, dtype=torch.bool))),
    ("mask must be contiguous", dict(mask=torch.ones(8, dtype=torch.bool)[::2])),
    ("fix_routing_mask needs unmapped_topk_idx", dict(fix_routing_mask=torch.ones(4, dtype=torch.bool))),
    ("fix_routing_mask has 3 elements", dict(fix_routing_mask=torch.ones(3, dtype=torch.bool),
                                             unmapped_topk_idx=torch.zeros(4, 6, dtype=torch.int64))),
    ("fix_routing_mask must be 1-D", dict(fix_routing_mask=torch.ones(4, 1, dtype=torch.bool),
                                          unmapped_topk_idx=torch.zeros(4, 6, dtype=torch.int64))),
    ("unmapped_topk_idx has dtype int32", dict(unmapped_topk_idx=torch.zeros(4, 6, dtype=torch.int32))),
    ("unmapped_topk_idx has shape \\(4, 5\\)", dict(unmapped_topk_idx=torch.zeros(4, 5, dtype=torch.int64))),
    ("unit stride", dict(unmapped_topk_idx=torch.zeros(6, 4, dtype=torch.int64).t())),
    ("given together", dict(to_physical_map=torch.zeros(64, 2, dtype=torch.int32))),
    ("given together", dict(logical_count=torch.ones(64, dtype=torch.int32))),
    ("to_physical_map has dtype int64", dict(to_physical_map=torch.zeros(64, 2, dtype=torch.int64),
                                             logical_count=torch.ones(64, dtype=torch.int32))),
    ("must have 64 rows", dict(to_physical_map=torch.zeros(63, 2, dtype=torch.int32),
                               logical_count=torch.ones(64, dtype=torch.int32))),
    ("must have 64 rows", dict(to_physical_map=torch.zeros(64, 2, dtype=torch.int32),
                               logical_count=torch.ones(65, dtype=torch.int32))),
    ("CUDA device", dict()),
]


@pytest.mark.parametrize("match,over", BAD_TOP2, ids=[f"{i}-{m[:24]}" for i, (m, _) in enumerate(BAD_TOP2)])
def test_top2_sum_gate_bad_args(match, over):
    _raises(match, g.top2_sum_gate, **_args(**over))


def test_top2_sum_gate_shared_experts():
    _raises("num_shared_experts=3", g.top2_sum_gate, **_shared(shared=3))
    _raises("num_topk % num_shared_experts", g.top2_sum_gate, **_shared(shared=2, num_topk=5))
    _raises("num_topk % num_shared_experts", g.top2_sum_gate,
            **_shared(experts=60, shared=1, num_topk=8))  # 60 % 8 != 0
    _raises("at least as many extra experts", g.top2_sum_gate, **_shared(shared=2, extra=1))
    _raises("at least as many extra experts", g.top2_sum_gate,
            **_args(use_shared_as_routed=True, num_shared_experts=1, num_topk=8))
    _raises("must have 66 rows", g.top2_sum_gate,
            **_args(use_shared_as_routed=True, num_shared_experts=2, num_topk=8,
                    to_physical_map=torch.zeros(64, 4, dtype=torch.int32), logical_count=torch.ones(64, dtype=torch.int32)))
    _raises("num_topk \\+ num_shared_experts = 33", g.top2_sum_gate,
            **_shared(experts=128, shared=1, num_topk=32))
    _raises("CUDA device", g.top2_sum_gate, **_shared(shared=2))  # valid otherwise
    # not used as routed: num_shared_experts is ignored, whatever it is (as in tile_kernels)
    _raises("CUDA device", g.top2_sum_gate, **_args(num_shared_experts=7))


def test_top2_sum_gate_valid_flag_combinations_reach_the_device_check():
    u = torch.zeros(4, 6, dtype=torch.int64)
    m = torch.ones(4, dtype=torch.bool)
    for kw in (dict(mask=m), dict(mask=m.view(4, 1)), dict(unmapped_topk_idx=u),
               dict(fix_routing_mask=m, unmapped_topk_idx=u), dict(num_groups=8, num_topk_groups=4),
               dict(num_groups=8, num_topk_groups=8), dict(scoring_func="SoftMax"),
               dict(unmapped_topk_idx=torch.zeros(4, 12, dtype=torch.int64)[:, :6])):
        _raises("CUDA device", g.top2_sum_gate, **_args(**kw))
