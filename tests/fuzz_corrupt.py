"""Bad arguments for the fuzzers: :func:`corrupt` a :class:`fuzz_cases.Call` in one or two places.

A bad tensor is wrong in one way (dtype, rank, shape, device, a non-tensor) or holds the same
values in another layout (column-major, strided, misaligned: ``Call.values_kept`` stays True, so
the GPU fuzz can compare the result with the contiguous call), or holds NaN/inf data or
out-of-range index values; a bad scalar has the wrong type or an out-of-range value.
"""

from __future__ import annotations

import math
import random
from typing import Any

import torch

BF16, FP32, E4M3 = torch.bfloat16, torch.float32, torch.float8_e4m3fn
I8, I32, I64 = torch.int8, torch.int32, torch.int64

_DTYPES = (BF16, FP32, torch.float16, E4M3, I8, I32, I64, torch.uint8, torch.bool)


def bad_tensor(t: torch.Tensor, rng: random.Random) -> Any:
    """A tensor like ``t`` but wrong in one way (or a non-tensor); some are still valid calls."""
    dev = t.device
    kind = rng.randrange(14)
    if kind == 0:
        return torch.zeros(t.shape, dtype=rng.choice([d for d in _DTYPES if d != t.dtype]), device=dev)
    if kind == 1 and t.dim() == 2 and t.numel():
        return t.t().contiguous().t()  # the same values, column-major
    if kind == 2 and t.dim() >= 1 and t.shape[-1] > 1:
        wide = torch.empty(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=dev)
        wide[..., ::2] = t
        return wide[..., ::2]  # the same values, strided
    if kind == 3 and t.numel():
        flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=dev)
        view = flat[1:].view(t.shape)
        view.copy_(t)
        return view  # the same values, misaligned data pointer
    if kind == 4:
        return t.unsqueeze(0)
    if kind == 5:
        return t.flatten()
    if kind == 6 and t.dim() and t.shape[0]:
        return t[:-1]  # one row short
    if kind == 7:
        return t[:0] if t.dim() else t
    if kind == 8:
        return t.cpu() if t.is_cuda else torch.empty(0)
    if kind == 9:
        return torch.tensor(3, device=dev)
    if kind == 10 and t.is_floating_point() and t.dtype != E4M3 and t.numel():
        v = t.contiguous().clone()
        v.view(-1)[rng.randrange(v.numel())] = rng.choice((math.nan, math.inf, -math.inf))
        return v  # NaN/inf data: a valid call
    if kind == 11 and not t.is_floating_point() and t.dtype != torch.bool and t.numel():
        v = t.contiguous().clone()
        info = torch.iinfo(v.dtype)
        v.view(-1)[rng.randrange(v.numel())] = rng.choice((-7, 10**6, 2**31 - 1, -(2**31), info.max, info.min)) \
            if v.dtype in (I32, I64) else rng.choice((info.max, info.min))
        return v  # out-of-range index values: refused or ignored, never a fault
    if kind == 12 and t.dim() >= 1:
        return torch.cat([t, t], dim=-1)
    return rng.choice((None, 0, "tensor", [1, 2], 1.5))


def bad_scalar(v: Any, rng: random.Random) -> Any:
    if isinstance(v, bool):
        return rng.choice(("yes", 2, None, 1.0, 1, 0, -1))
    if isinstance(v, int):
        return rng.choice((-1, 0, 1, v + 1, 2 * v, v - 1, 2**31, 2**40, float(v), True, str(v), None,
                           torch.tensor(max(min(v, 2**62), -(2**62))), 10**6))
    if isinstance(v, float):
        return rng.choice((math.nan, math.inf, -math.inf, -v, 0.0, str(v), None, True, 10**40, torch.tensor(1.5)))
    if isinstance(v, str):
        return rng.choice(("", "E4M3", "bogus", None, 1, v + " ", "e5m2", "fp16", "sigmoid", "e4m3"))
    if isinstance(v, tuple):
        if all(isinstance(e, int) for e in v):
            return rng.choice((tuple(float(e) for e in v), list(v), v + (1,), v[:1], (0, 0), (-1, -1),
                               tuple(reversed(v)), (True, 128), None))
        i = rng.randrange(len(v))  # a pair: corrupt one element
        return v[:i] + (bad_value(v[i], rng),) + v[i + 1:] if rng.random() < 0.8 else v[:1]
    if isinstance(v, torch.dtype):
        return rng.choice((torch.int32, "float32", None, torch.float64, torch.float8_e4m3fn))
    if v is None:
        return rng.choice((0, "x", 1.0, torch.zeros(4), torch.zeros(4, dtype=I32), True))
    return None


def bad_value(v: Any, rng: random.Random) -> Any:
    return bad_tensor(v, rng) if isinstance(v, torch.Tensor) else bad_scalar(v, rng)


def corrupt(call: Any, rng: random.Random, optional: tuple[tuple[int, str], ...] = ()) -> Any:
    """``call`` with one or two arguments replaced by :func:`bad_value`; ``optional`` lists
    ``(position, name)`` of the parameters with defaults, which the call may gain (with a bad
    value) unless it passes them already."""
    args, kwargs = list(call.args), dict(call.kwargs)
    kept = True
    for _ in range(rng.choice((1, 1, 2))):
        extra = [("k", k) for i, k in optional if i >= len(args) and k not in kwargs]
        slots = [("a", i) for i in range(len(args))] + [("k", k) for k in kwargs] + extra
        where, key = rng.choice(slots)
        old = args[key] if where == "a" else kwargs.get(key)
        new = bad_value(old, rng)
        kept = kept and _same_values(old, new)
        if where == "a":
            args[key] = new
        else:
            kwargs[key] = new
    return type(call)(call.op, args, kwargs, kept)


def _same_values(old: Any, new: Any) -> bool:
    """``new`` is ``old`` in another memory layout (same dtype, shape and values)."""
    if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
        return False
    if old.dtype != new.dtype or old.shape != new.shape or old.device != new.device:
        return False
    a, b = old.contiguous().view(-1), new.contiguous().view(-1)
    if a.dtype.itemsize == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return bool(torch.equal(a, b))


def optional_params(op: str) -> tuple[tuple[int, str], ...]:
    """``(position, name)`` of each parameter of ``op`` that has a default."""
    import inspect

    from fuzz_cases import op_function

    params = inspect.signature(op_function(op)).parameters.values()
    return tuple((i, p.name) for i, p in enumerate(params) if p.default is not inspect.Parameter.empty)
