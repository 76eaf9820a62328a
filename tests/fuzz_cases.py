"""Random calls of every public ``tilebin.ops`` op, valid and corrupted, for the fuzzers.

One catalogue serves the CPU property test (``tests/ops/test_ops_fuzz_props.py``, launch
stubbed) and the GPU fuzz (``wheels/fuzz_ops.py``, on the H200):

- ``BUILDERS[op](rng, device, big)`` returns a :class:`Call` the op should accept: random token
  counts (0, 1, odd, and large ones when ``big``), hidden sizes, formats and flags;
- :func:`corrupt` (``fuzz_corrupt.py``) replaces one or two of its arguments with a bad value (a wrong type, dtype,
  rank, shape, stride, alignment or device, an out-of-range number, NaN/inf data, out-of-range
  index values);
- :func:`run` calls the op and returns ``(result, error)``.

Values come from a ``random.Random``, so a seed replays a sequence exactly.
"""

from __future__ import annotations

import inspect
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

BF16, FP32, E4M3 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
I8, I32, I64 = torch.int8, torch.int32, torch.int64


@dataclass
class Call:
    op: str  # "quant.per_token_cast"
    args: list
    kwargs: dict = field(default_factory=dict)
    values_kept: bool = True  # every tensor holds the values the builder gave it (layout changes only)

    def describe(self) -> str:
        parts = [_short(a) for a in self.args] + [f"{k}={_short(v)}" for k, v in self.kwargs.items()]
        return f"{self.op}({', '.join(parts)})"


def _short(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        s = f"T{tuple(v.shape)}:{str(v.dtype).removeprefix('torch.')}"
        return s + ("" if v.is_contiguous() else f"@{tuple(v.stride())}") + ("" if v.is_cuda else ":cpu")
    if isinstance(v, (tuple, list)):
        inner = ", ".join(_short(x) for x in v)
        return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
    return repr(v)[:40]


def op_function(op: str) -> Callable:
    from tilebin.ops import engram, moe, quant, transpose

    family, name = op.split(".")
    if family == "mhc":  # the OpSpec ops behind tilebin.modeling.mhc.ops' autograd Functions
        from tilebin.modeling.mhc.ops._torch_ops import TORCH_OPS

        spec = {o.name: o.public for o in TORCH_OPS}[name]

        def op_call(*args: Any) -> Any:
            return spec(*args)

        op_call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  (its parameters, for binding)
            [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in spec.params])
        return op_call
    return getattr({"quant": quant, "moe": moe, "engram": engram, "transpose": transpose}[family], name)


def run(call: Call) -> tuple[Any, BaseException | None]:
    """``(result, None)`` or ``(None, the exception)``."""
    try:
        return op_function(call.op)(*call.args, **call.kwargs), None
    except Exception as exc:  # noqa: BLE001 - the fuzzers classify it
        return None, exc


# ------------------------------------------------------------------ sizes and tensors
def tokens(rng: random.Random, big: bool) -> int:
    return rng.choice((0, 1, 2, 3, 5, 17, 64, 129) + ((1000, 4001) if big else ()))


def hidden(rng: random.Random) -> int:
    return rng.choice((128, 576, 1024, 2048))


def rand(shape, dtype, device, rng: random.Random) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    return torch.randn(shape, generator=g).to(dtype).to(device)


def e4m3(shape, device, rng) -> torch.Tensor:
    return rand(shape, FP32, device, rng).clamp(-400, 400).to(E4M3)


def positive(shape, device, rng) -> torch.Tensor:
    return rand(shape, FP32, device, rng).abs().add(0.01)


def pow2(shape, device, rng) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    return torch.exp2(torch.randint(-8, 8, shape, generator=g).float()).to(device)


def ints(shape, lo, hi, dtype, device, rng) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    return torch.randint(lo, hi, shape, generator=g).to(dtype).to(device)


def topk_indices(t, k, experts, device, rng) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    rows = [torch.randperm(experts, generator=g)[:k] for _ in range(t)]
    idx = torch.stack(rows) if rows else torch.empty(0, k, dtype=I64)
    return idx.to(I64).to(device)


def mapping(idx: torch.Tensor, experts: int, alignment: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_topk_to_pos int32 [t, k], pos_to_expert int32 [slots]) of a valid expert-major layout."""
    t, k = idx.shape
    flat = idx.flatten().cpu()
    counts = torch.bincount(flat[flat >= 0], minlength=experts)
    aligned = (counts + alignment - 1) // alignment * alignment
    start = torch.cumsum(aligned, 0) - aligned
    ttp = torch.full((t * k,), -1, dtype=I32)
    pte = torch.full((int(aligned.sum()),), -1, dtype=I32)
    fill = start.clone()
    for i, e in enumerate(flat.tolist()):
        if e >= 0:
            ttp[i] = int(fill[e])
            pte[int(fill[e])] = e
            fill[e] += 1
    return ttp.reshape(t, k).to(idx.device), pte.to(idx.device)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------ quant builders
_TOKEN_SF = ((False, False, False), (False, True, False), (True, False, False), (True, True, True))


def _per_token(rng, dev, big, op):
    t, h = tokens(rng, big), hidden(rng)
    x = rand((t, h), rng.choice((BF16, FP32)), dev, rng)
    fmt = rng.choice(("e4m3", "e4m3", "e2m1", "e5m6"))
    if fmt == "e5m6" and op == "quant.per_token_cast":
        return Call(op, [x, fmt, h])
    fmt = "e4m3" if fmt == "e5m6" else fmt
    npc = rng.choice((32, 64, 128, h) if fmt == "e4m3" else (16, 32))
    col, rnd, packed = rng.choice(_TOKEN_SF) if npc in (32, 128) else (False, rng.random() < 0.5, False)
    kw = dict(use_tma_aligned_col_major_sf=col, round_sf=rnd, use_packed_ue8m0=packed)
    if op == "quant.per_token_cast_with_precomputed_sf":
        return Call(op, [x, fmt, npc, positive((t, _cdiv(h, npc)), dev, rng)])
    return Call(op, [x, fmt, npc], kw)


def _cast_back(rng, dev, big, op):
    t, h = tokens(rng, big), hidden(rng)
    out = rng.choice(("bf16", "fp32"))
    if op == "quant.per_token_cast_back":
        npc = rng.choice((32, 128))
        return Call(op, [(e4m3((t, h), dev, rng), positive((t, _cdiv(h, npc)), dev, rng)), out, npc])
    block = rng.choice(((1, 128), (128, 128), (32, 32)))
    sf = positive((_cdiv(t, block[0]), _cdiv(h, block[1])), dev, rng)
    return Call(op, [(e4m3((t, h), dev, rng), sf), out, block])


def _unpack(rng, dev, big, op):
    t, h = tokens(rng, big), hidden(rng)
    return Call(op, [ints((t, h // 2), -128, 128, I8, dev, rng), rng.choice((FP32, BF16))])


def _per_block(rng, dev, big, op):
    t, h = tokens(rng, big), hidden(rng)
    x = rand((t, h), rng.choice((BF16, FP32)), dev, rng)
    fmt, block = rng.choice(("e4m3", "e2m1")), rng.choice(((128, 128), (32, 32)))
    if op == "quant.per_block_cast_with_precomputed_sf":
        return Call(op, [x, fmt, block, positive((_cdiv(t, block[0]), _cdiv(h, block[1])), dev, rng)])
    col, rnd, packed = rng.choice(_TOKEN_SF)
    return Call(op, [x, fmt, block], dict(use_tma_aligned_col_major_sf=col, round_sf=rnd, use_packed_ue8m0=packed))


def _lossless(rng, dev, big, op):
    t, h = tokens(rng, big), hidden(rng)
    data = ints((t, h // 2), -128, 128, I8, dev, rng)
    return Call(op, [(data, pow2((t, h // 32), dev, rng)), "e4m3", (1, 32),
                     rng.choice(((1, 128), (32, 32), (128, 128)))], dict(round_sf=True))


def _per_channel(rng, dev, big, op):
    t, h = rng.choice((0, 128, 256) + ((1024,) if big else ())), hidden(rng)
    x = rand((t, h), BF16 if op == "quant.per_channel_cast_and_transpose" else rng.choice((BF16, FP32)), dev, rng)
    kw = dict(round_sf=rng.random() < 0.5)
    if op == "quant.per_channel_cast_fused" and rng.random() < 0.5:
        kw["pos_to_token"] = ints((rng.choice((0, 128, 256)),), -1, max(t, 1), I32, dev, rng) if t else None
        if kw["pos_to_token"] is None:
            del kw["pos_to_token"]
    return Call(op, [x, "e4m3", 128], kw)


def _swiglu_fwd(rng, dev, big, op):
    t, h = tokens(rng, big), hidden(rng)
    x = rand((t, 2 * h), rng.choice((BF16, FP32)), dev, rng)
    kw: dict = {}
    if rng.random() < 0.5:
        kw["swiglu_clamp_value"] = rng.choice((1.0, 7.0, 100.0))
        if rng.random() < 0.5:
            kw["clamped_count"] = torch.zeros(3, dtype=I64, device=dev)
    if rng.random() < 0.3:
        n, k = max(t, 1), rng.choice((1, 2, 8))
        kw["pos_to_token_topk"] = ints((t,), 0, n * k, I32, dev, rng)
        kw["topk_weights"] = rand((n, k), FP32, dev, rng)
    if rng.random() < 0.3:
        kw["pos_to_expert"] = ints((t,), -1, 8, I32, dev, rng)
    npc = rng.choice((128, h))
    if npc == 128:
        col, rnd, packed = rng.choice(_TOKEN_SF)
        kw.update(use_tma_aligned_col_major_sf=col, round_sf=rnd, use_packed_ue8m0=packed)
    return Call(op, [x, "e4m3", npc], kw)


def _swiglu_channel(rng, dev, big, op):
    t, h = rng.choice((0, 128, 256)), hidden(rng)
    kw = dict(round_sf=rng.random() < 0.5, without_transpose=rng.random() < 0.5)
    if rng.random() < 0.5:
        kw["swiglu_clamp_value"] = 7.0
    return Call(op, [rand((t, 2 * h), BF16, dev, rng), "e4m3", 128], kw)


def _swiglu_bwd(rng, dev, big, op):
    tok, k, h = rng.choice((0, 1, 3, 17)), rng.choice((1, 2, 8)), rng.choice((128, 1024, 2048))
    idx = topk_indices(tok, k, 16, dev, rng)
    ttp, _ = mapping(idx, 16, 1)
    rows = tok * k
    p2t = torch.full((rows,), -1, dtype=I32)
    flat = ttp.flatten().cpu()
    for i, pos in enumerate(flat.tolist()):
        p2t[pos] = i
    npc = rng.choice((32, 128))
    x = (e4m3((rows, 2 * h), dev, rng), positive((rows, 2 * h // npc), dev, rng))
    kw = {"swiglu_clamp_value": 7.0} if rng.random() < 0.5 else {}
    return Call(op, [x, rand((rows, h), BF16, dev, rng), positive((tok, k), dev, rng), p2t.to(dev), ttp, npc,
                     rng.random() < 0.5], kw)


# ------------------------------------------------------------------ moe builders
_GATES = ((256, 8, 8, 4), (72, 6, 4, 2), (64, 4, 0, 0), (16, 2, 1, 1))  # experts, topk, groups, topk_groups


def _top2(rng, dev, big, op):
    t = tokens(rng, big)
    experts, k, groups, topk_groups = rng.choice(_GATES)
    logits = rand((t, experts), FP32, dev, rng)
    shared = False  # shared experts used as routed need a physical map: the GPU suite covers them
    args = [logits, rand((experts,), FP32, dev, rng), k, topk_groups, groups, shared, 2 if shared else 0,
            rng.choice((1.0, 2.5)), 0, 1, 0, 1, rng.choice(("sigmoid", "sqrtsoftplus", "softmax"))]
    kw: dict = {}
    if rng.random() < 0.3:
        kw["mask"] = ints((t,), 0, 2, torch.bool, dev, rng)
    return Call(op, args, kw)


def _topk(rng, dev, big, op):
    t, experts = tokens(rng, big), rng.choice((8, 64, 256, 1000))
    return Call(op, [rand((t, experts), FP32, dev, rng), rng.choice((0, 1, 2, 8) if experts >= 8 else (1,))])


def _topk_sum(rng, dev, big, op):
    t, groups, per = tokens(rng, big), rng.choice((1, 4, 8, 32)), rng.choice((2, 8, 32))
    return Call(op, [rand((t, groups, per), FP32, dev, rng), rng.choice((1, 2)), rng.randint(0, groups)])


def _stats(rng, dev, big, op):
    t, k, experts = tokens(rng, big), rng.choice((1, 2, 6, 8)), rng.choice((8, 64, 256))
    idx = topk_indices(t, k, experts, dev, rng)
    if op == "moe.aux_fi":
        return Call(op, [idx, experts, k])
    if op == "moe.group_count":
        return Call(op, [idx, experts])
    if op == "moe.inplace_unique_group_indices":
        return Call(op, [ints((t, k), -1, 8, I64, dev, rng), 8])
    if op == "moe.mask_indices_by_tp":
        return Call(op, [idx, experts, rng.choice((1, 2, 4, 8)), rng.choice((0, 1)), 2])
    return Call(op, [positive((t, k), dev, rng)])  # normalize_weight


def _fused_mapping(rng, dev, big, op):
    t, k, experts = tokens(rng, big), rng.choice((1, 2, 8)), rng.choice((8, 64, 256))
    idx = topk_indices(t, k, experts, dev, rng)
    alignment = rng.choice((1, 16, 128))
    if op == "moe.get_fused_mapping":
        slots = 0 if rng.random() < 0.5 else t * k + experts * (alignment - 1)
        return Call(op, [idx, experts, slots, alignment], dict(force_no_sync=rng.random() < 0.3))
    ttp, pte = mapping(idx, experts, alignment)
    h = hidden(rng)
    if op == "moe.expand_to_fused":
        x = e4m3((t, h), dev, rng) if rng.random() < 0.2 else rand((t, h), rng.choice((BF16, FP32)), dev, rng)
        return Call(op, [x, ttp, pte])
    if op == "moe.expand_to_fused_with_sf":
        npc = rng.choice((32, 128))
        return Call(op, [(e4m3((t, h), dev, rng), positive((t, _cdiv(h, npc)), dev, rng)), npc, ttp, pte])
    slots = pte.shape[0]  # reduce_fused
    weights = rand((t, k), FP32, dev, rng) if rng.random() < 0.7 else None
    if rng.random() < 0.3:
        return Call(op, [rand((slots, h), BF16, dev, rng), weights, ttp, "e4m3", positive((1,), dev, rng)])
    kw = {"out": torch.empty((t, h), dtype=BF16, device=dev)} if rng.random() < 0.3 else {}
    return Call(op, [rand((slots, h), BF16, dev, rng), weights, ttp], kw)


# ------------------------------------------------------------------ engram builders
def _engram(rng, dev, big, op):
    t, hc, h = tokens(rng, big), 4, rng.choice((576, 1024, 2048, 4096))
    bf = lambda *shape: rand(shape, BF16, dev, rng)  # noqa: E731
    if op == "engram.engram_hash":
        n, layers, tables = rng.choice((2, 3)), rng.choice((1, 2)), rng.randint(1, 8)
        ids = ints((t, n), 0, 100_000, I32, dev, rng)
        mult = ints((layers, n), 1, 2**31 - 1, I64, dev, rng) * 2 + 1
        vocab = ints((layers, n - 1, tables), 1, 200_000, I32, dev, rng)
        offsets = ints((layers, (n - 1) * tables), 0, 10**6, I32, dev, rng)
        return Call(op, [ids, mult, vocab, offsets])
    if op == "engram.fused_weight":
        return Call(op, [bf(hc, h), bf(hc, h)])
    if op == "engram.grad_w_reduce":
        return Call(op, [rand((rng.choice((1, 78, 132)), hc, h), FP32, dev, rng), bf(hc, h), bf(hc, h),
                         rand((hc, h), FP32, dev, rng), rand((hc, h), FP32, dev, rng)])
    x, k, v, wf = bf(t, hc, h), bf(t, hc, h), bf(t, h), rand((hc, h), FP32, dev, rng)
    if op == "engram.engram_gate_fwd":
        return Call(op, [x, k, v, wf, 1e-6, rng.choice((0.0, 1e-6, 1.0))], dict(save_for_backward=rng.random() < 0.7))
    stats = [rand((t, hc), FP32, dev, rng), rand((t, hc), FP32, dev, rng).sigmoid(), positive((t, hc), dev, rng),
             positive((t, hc), dev, rng)]
    return Call(op, [bf(t, hc, h), x, k, v, wf, *stats, 1e-6])


# ------------------------------------------------------------------ transpose builders
def _transpose(rng, dev, big, op):
    rows, cols = (rng.choice((0, 1, 3, 64, 129, 256) + ((1000, 4001) if big else ())) for _ in range(2))
    shape = (rows, cols) if op == "transpose.transpose" else (rng.choice((0, 1, 2, 5)), rows, cols)
    return Call(op, [rand(shape, rng.choice((BF16, FP32, E4M3, torch.float16, I8)), dev, rng)])


BUILDERS: dict[str, Callable[..., Call]] = {
    **{f"quant.{n}": _per_token for n in ("per_token_cast", "per_token_cast_with_sf_only",
                                         "per_token_cast_with_precomputed_sf")},
    "quant.cast_back": _cast_back, "quant.per_token_cast_back": _cast_back,
    "quant.unpack_from_e2m1fn_x2": _unpack,
    **{f"quant.{n}": _per_block for n in ("per_block_cast", "per_block_cast_with_sf_only",
                                         "per_block_cast_with_precomputed_sf")},
    "quant.per_block_cast_lossless": _lossless,
    **{f"quant.{n}": _per_channel for n in ("per_channel_cast", "per_channel_cast_and_transpose",
                                           "per_channel_cast_fused")},
    "quant.swiglu_forward_and_per_token_cast": _swiglu_fwd,
    "quant.swiglu_forward_and_per_channel_cast_and_transpose": _swiglu_channel,
    "quant.swiglu_backward_and_per_token_cast": _swiglu_bwd,
    "moe.top2_sum_gate": _top2, "moe.topk_gate": _topk, "moe.topk_sum_and_topk_group_idx": _topk_sum,
    **{f"moe.{n}": _stats for n in ("aux_fi", "group_count", "inplace_unique_group_indices", "mask_indices_by_tp",
                                   "normalize_weight")},
    **{f"moe.{n}": _fused_mapping for n in ("get_fused_mapping", "expand_to_fused", "expand_to_fused_with_sf",
                                           "reduce_fused")},
    **{f"engram.{n}": _engram for n in ("engram_hash", "fused_weight", "engram_gate_fwd", "engram_gate_bwd",
                                       "grad_w_reduce")},
    "transpose.transpose": _transpose, "transpose.batched_transpose": _transpose,
}


# ------------------------------------------------------------------ mHC builders (the spec'd forward and backward ops)
def _mhc(rng, dev, big, op):
    name, lead = op.split(".")[1], rng.choice(((0,), (3,), (2, 5), (1, 1)))
    m, h = rng.choice((2, 4, 8)), rng.choice((64, 128))
    bf = lambda *s: rand(s, BF16, dev, rng)  # noqa: E731
    f = lambda *s: rand(s, FP32, dev, rng)  # noqa: E731
    out = lambda *s: torch.empty(s, dtype=BF16, device=dev) if rng.random() < 0.3 else None  # noqa: E731
    x, r, p, c = bf(*lead, h), bf(*lead, m, h), f(*lead, m, 1), f(*lead, m, m)
    k, t = m * (m + 2), math.prod(lead)
    fn, w = f(k, m * h), f(m * h) if rng.random() < 0.5 else None
    flag = rng.random() < 0.5
    args = {
        "expand_to_mhc": lambda: [x, m, out(*lead, m, h)], "expand_to_mhc_bwd": lambda: [r],
        "mhc_post_fwd": lambda: [x, r, p, c, out(*lead, m, h)],
        "mhc_post_bwd": lambda: [x, r, p, c, bf(*lead, m, h), flag],
        "mhc_pre_apply_mix": lambda: [r, p, out(*lead, h)],
        "mhc_pre_apply_mix_bwd": lambda: [x, r, p, torch.empty_like(r), flag],
        "mhc_head_compute_mix": lambda: [f(*lead, m), f(1), f(m), 1e-6],
        "mhc_head_compute_mix_bwd": lambda: [f(*lead, m), f(*lead, m), f(1), f(m)],
        "sinkhorn_normalize": lambda: [c, rng.choice((1, 3, 10)), 1e-6, flag],
        "sinkhorn_normalize_bwd": lambda: [f(*lead, m, m), c, 3, 1e-6],
        "mhc_pre_split_mixes": lambda: [f(*lead, k), f(3), f(k), m, 2.0, 1e-6],
        "mhc_pre_split_mixes_bwd": lambda: [p, f(*lead, m, 1), c, f(*lead, k), f(3), f(k), m, 2.0],
        "mhc_pre_norm_fn": lambda: [r, fn, w, 1e-6, flag, rng.choice((1, 16))],
        "mhc_pre_norm_fn_bwd": lambda: [f(*lead, k), r, fn, f(k, m * h), w, f(t, k), f(t), 1e-6, torch.empty_like(r),
                                        flag, f(k, m * h), None if w is None else f(m * h), flag],
        "mhc_pre_big_fuse": lambda: [r, fn, f(3), f(k), 1e-6, 1e-6, 1e-6, 2.0, 3, 16],
        "mhc_multilayer_recompute": lambda: _recompute(rng, lead, m, h, bf, f),
    }[name]()
    return Call(op, args)


def _recompute(rng, lead, m, h, bf, f):
    layers = rng.choice((1, 2, 3))
    post = rng.choice((layers - 1, layers)) if layers > 1 else layers
    return [bf(*lead, m, h), [f(*lead, m, 1) for _ in range(layers)], [bf(*lead, h) for _ in range(post)],
            [f(*lead, m, 1) for _ in range(post)], [f(*lead, m, m) for _ in range(post)],
            [bf(*lead, h) for _ in range(layers)], [bf(*lead, m, h) for _ in range(post)]]


# apart from BUILDERS (tilebin.ops): the property test and the GPU fuzz (--families mhc) run them on their own,
# tests/ops/test_torch_library.py registers and traces them
MHC_BUILDERS: dict[str, Callable[..., Call]] = {f"mhc.{n}": _mhc for n in (
    "expand_to_mhc", "expand_to_mhc_bwd", "mhc_post_fwd", "mhc_post_bwd", "mhc_pre_apply_mix", "mhc_pre_apply_mix_bwd",
    "mhc_head_compute_mix", "mhc_head_compute_mix_bwd", "sinkhorn_normalize", "sinkhorn_normalize_bwd",
    "mhc_pre_split_mixes", "mhc_pre_split_mixes_bwd", "mhc_pre_norm_fn", "mhc_pre_norm_fn_bwd", "mhc_pre_big_fuse",
    "mhc_multilayer_recompute")}


def build(op: str, rng: random.Random, device: str, big: bool = False) -> Call:
    return (BUILDERS.get(op) or MHC_BUILDERS[op])(rng, device, big, op)


from fuzz_corrupt import bad_value, corrupt, optional_params  # noqa: E402  (re-exported)

__all__ = ["BUILDERS", "MHC_BUILDERS", "Call", "bad_value", "build", "corrupt", "op_function", "optional_params", "run"]
