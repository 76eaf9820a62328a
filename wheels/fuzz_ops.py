"""GPU fuzz of every public op of the installed ``tilebin.ops`` (and, with ``--families``, the mHC
ops' OpSpec ops behind ``tilebin.modeling.mhc.ops``): mostly bad and edge-case calls.

    python3 wheels/fuzz_ops.py --calls 10000 --seed 1 [--json out.json]
    python3 wheels/fuzz_ops.py --calls 3000 --families mhc       (the mHC ops only)
    compute-sanitizer --tool memcheck python3 wheels/fuzz_ops.py --calls 500 --seed 2

Calls come from ``tests/fuzz_cases.py`` (the CPU property test's catalogue): 20 % valid calls
(some at large token counts), 80 % with one or two corrupted arguments (wrong types, dtypes,
ranks, shapes, strides, alignment, devices; out-of-range numbers; NaN/inf data; out-of-range
index values).  Every call is synchronised.  Counted:

- ``refused``: a typed :class:`TilebinError`;  ``untyped``: any other exception;
- ``mismatch``: a successful call whose outputs differ (bytes; NaN equal to NaN) from the same
  call on contiguous copies of its tensors (valid calls, and calls whose corruption kept every
  value: a strided, column-major or misaligned copy), or, for a valid call of an op with a cheap
  torch reference, from that reference.  Calls with corrupted values (NaN/inf, out-of-range
  indices) only have to end without a fault: their outputs may hold what the math gives;
- ``valid_refused``: an uncorrupted catalogue call refused;  ``fault``: a CUDA error after a
  call (the process stops there: the context is lost).

Exit status 0 only when untyped, mismatch, valid_refused and fault are all 0.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # fuzz_cases and the torch references

import torch  # noqa: E402

import fuzz_cases as F  # noqa: E402
from tilebin.runtime import TilebinError  # noqa: E402


def _references() -> dict:
    from moe_ref import gating, routing, stats
    from quant_ref.cast import unpack_e2m1

    return {
        "moe.topk_gate": gating.topk_gate,
        "moe.topk_sum_and_topk_group_idx": gating.topk_sum_and_topk_group_idx,
        "moe.normalize_weight": stats.normalize_weight,
        "moe.group_count": stats.group_count,
        "moe.aux_fi": stats.aux_fi,
        "moe.mask_indices_by_tp": stats.mask_indices_by_tp,
        "moe.expand_to_fused": routing.expand_to_fused,
        "quant.unpack_from_e2m1fn_x2": unpack_e2m1,
    }


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _same(a, b) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb) or (not ta and a != b):
        return False
    for x, y in zip(ta, tb):
        if x.dtype != y.dtype or x.shape != y.shape:
            return False
        if x.is_floating_point() and x.dtype.itemsize >= 2:
            same = (x == y) | (x.isnan() & y.isnan())
            if not bool(same.all()):
                return False
        elif not torch.equal(x.contiguous().view(torch.uint8) if x.dtype.itemsize == 1 else x,
                             y.contiguous().view(torch.uint8) if y.dtype.itemsize == 1 else y):
            return False
    return True


def _clone_call(call: F.Call) -> F.Call:
    """The call on contiguous copies of its tensors (pairs element-wise)."""
    def copy(v):
        if isinstance(v, torch.Tensor):
            return v.contiguous().clone()
        if isinstance(v, tuple):
            return tuple(copy(e) for e in v)
        return v
    return F.Call(call.op, [copy(a) for a in call.args], {k: copy(v) for k, v in call.kwargs.items()})


def _inputs_after(call: F.Call) -> list:
    """The call's tensors after it ran (in-place ops write some of them)."""
    return _tensors(call.args) + _tensors(list(call.kwargs.values()))


def op_pool(families: str) -> list[str]:
    """The ops fuzzed: ``BUILDERS`` (every tilebin.ops op) and ``MHC_BUILDERS``, of the comma-separated
    ``families`` (``quant,moe,engram,transpose,mhc``; empty: all but mhc, the default run)."""
    ops = {**F.BUILDERS, **F.MHC_BUILDERS}
    wanted = set(families.split(",")) if families else {op.split(".")[0] for op in F.BUILDERS}
    return sorted(op for op in ops if op.split(".")[0] in wanted)


def fuzz_one(rng: random.Random, stats: collections.Counter, refs: dict, examples: dict, big_share: float,
             pool: list[str]) -> None:
    op = rng.choice(pool)
    valid = rng.random() < 0.2
    call = F.build(op, rng, "cuda", big=valid and rng.random() < big_share)
    if not valid:
        call = F.corrupt(call, rng, F.optional_params(op))
    twin = _clone_call(call)
    ref_inputs = _clone_call(call) if valid and op in refs else None
    stats["calls"] += 1
    result, error = F.run(call)
    torch.cuda.synchronize()  # a device fault surfaces here (and ends the run)
    if error is not None:
        kind = "refused" if isinstance(error, TilebinError) else "untyped"
        if valid:
            kind = "valid_refused" if kind == "refused" else kind
        stats[kind] += 1
        if kind != "refused":
            examples.setdefault(kind, []).append(f"{call.describe()}: {type(error).__name__}: {error}"[:600])
        return
    stats["ok"] += 1
    if not call.values_kept:  # values changed (NaN, out-of-range indices...): only "no fault" is asked
        return
    twin_result, twin_error = F.run(twin)
    if twin_error is not None or not _same((result, _inputs_after(call)), (twin_result, _inputs_after(twin))):
        stats["mismatch"] += 1
        examples.setdefault("mismatch", []).append(f"{call.describe()} differs from its contiguous twin "
                                                   f"({twin_error!r})"[:600])
        return
    if ref_inputs is not None:
        stats["reference_checked"] += 1
        want = refs[op](*ref_inputs.args, **ref_inputs.kwargs)
        if not _same(result, want):
            stats["mismatch"] += 1
            examples.setdefault("mismatch", []).append(f"{call.describe()} differs from the torch reference"[:600])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--big-share", type=float, default=0.1, help="share of valid calls at large token counts")
    ap.add_argument("--json", help="write the counts and examples here")
    ap.add_argument("--max-seconds", type=float, default=0, help="stop early (and report) after this long; 0: never")
    ap.add_argument("--families", default="", help="comma-separated op families (quant, moe, engram, transpose, "
                                                   "mhc); default: every tilebin.ops family")
    a = ap.parse_args()
    pool = op_pool(a.families)
    if not pool:
        ap.error(f"no ops in families {a.families!r}")
    rng, stats, examples = random.Random(a.seed), collections.Counter(), {}
    refs, t0 = _references(), time.time()
    try:
        for _ in range(a.calls):
            fuzz_one(rng, stats, refs, examples, a.big_share, pool)
            if a.max_seconds and time.time() - t0 > a.max_seconds:
                stats["stopped_early"] = 1
                break
    except RuntimeError as exc:  # a CUDA error: the context is gone
        stats["fault"] += 1
        examples.setdefault("fault", []).append(repr(exc)[:600])
    report = {"seed": a.seed, "families": a.families or "default", "calls_asked": a.calls, "seconds": round(time.time() - t0, 1), **stats,
              "examples": {k: v[:10] for k, v in examples.items()}}
    for key in ("untyped", "mismatch", "valid_refused", "fault"):
        report.setdefault(key, 0)
    print(json.dumps(report, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if not any(report[k] for k in ("untyped", "mismatch", "valid_refused", "fault")) else 1


if __name__ == "__main__":
    sys.exit(main())
