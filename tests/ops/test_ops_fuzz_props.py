"""Property-based fuzz of every public op and of the mHC ops' OpSpec ops (hypothesis; CPU, launch
stubbed, fixed seed).

Per example: a valid call ``V`` of a random op (random sizes, formats, flags; it warms the
op's memo), then ``C``: ``V`` with one or two arguments corrupted (a wrong type, dtype, rank,
shape, stride, alignment, an out-of-range number, NaN data, out-of-range indices).  Then:

1. ``C`` raises a :class:`TilebinError` subclass, or every launch it makes keeps the kernel's
   manifest contract (``manifest_check.check_launch``): no untyped exception, no launch the
   unchecked path would run out of bounds;
2. ``C`` behaves exactly as it does in a fresh process (memos emptied): same error and message,
   or the same launches and outputs (dtype, shape, strides).  A memo entry cannot change a call;
3. ``V`` run again behaves exactly as it did before ``C``: no bad call breaks a good one.

Outputs of a stubbed launch are zero-filled (what ops read back, e.g. get_fused_mapping's
counts, is then deterministic).
"""

from __future__ import annotations

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis", reason="pip install hypothesis (.ci/run and build.sh install it)")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import fuzz_cases as F  # noqa: E402
from manifest_check import built_manifest, check_launch, output_names  # noqa: E402
from ops_stub import StubbedOps, describe, describe_launches  # noqa: E402
from tilebin.runtime import TilebinError  # noqa: E402

pytestmark = pytest.mark.usefixtures("key_path")  # the Python memo key, then the compiled one

OPS = sorted(F.BUILDERS)
OPTIONAL = {op: F.optional_params(op) for op in OPS}
EXAMPLES = 1000


@pytest.fixture(scope="module")
def harness(request):
    manifest = built_manifest(request)
    mp = pytest.MonkeyPatch()
    stub = StubbedOps(mp)
    stub.manifest = manifest

    def launcher(name, **key):
        spec = manifest.kernels[name]
        outs = output_names(spec, key)

        def launch(*args):
            check_launch(spec, key, args)  # before anything is recorded: a broken contract fails here
            for p, a in zip(spec.params, args):
                if p.name in outs:
                    a.zero_()
            stub.launches.append((name, dict(key), args))

        return launch

    for mod in stub.modules:
        if hasattr(mod, "launcher"):
            mp.setattr(mod, "launcher", launcher)
    yield stub
    mp.undo()


def outcome(stub: StubbedOps, call: F.Call):
    """What a call did: ``("error", type, message)`` or ``("ok", outputs, launches)``."""
    stub.launches.clear()
    result, error = F.run(call)
    if error is not None:
        if not isinstance(error, TilebinError):
            raise AssertionError(f"untyped {type(error).__name__} from {call.describe()}: {error}") from error
        return ("error", type(error).__name__, str(error))
    return ("ok", describe(result), describe_launches(stub.launches))


def fresh_outcome(stub: StubbedOps, call: F.Call):
    """:func:`outcome` with every memo emptied, then the memos put back as they were."""
    saved = [(table, dict(table)) for mod in stub.modules for table in _memos(mod)]
    stub.fresh()
    try:
        return outcome(stub, call)
    finally:
        for table, content in saved:
            table.clear()
            table.update(content)


def _memos(mod):
    """The module's memo tables and the memo of every OpSpec it declares."""
    from ops_stub import MEMO_NAMES, _specs

    return ([getattr(mod, n) for n in MEMO_NAMES if isinstance(getattr(mod, n, None), dict)]
            + [spec.memo for spec in _specs(mod)])


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(op=st.sampled_from(OPS), rng=st.randoms(use_true_random=False))
def test_bad_calls_are_typed_and_never_change_good_ones(harness, op, rng):
    check_properties(harness, op, rng, OPTIONAL[op])


def check_properties(harness, op: str, rng, optional) -> None:
    """The three properties of the module docstring for one valid call of ``op`` and its corruption."""
    valid = F.build(op, rng, "cpu")
    first = outcome(harness, valid)
    assert first[0] == "ok", f"the catalogue's valid call was refused: {valid.describe()}: {first}"
    bad = F.corrupt(valid, rng, optional)
    warm = outcome(harness, bad)
    assert warm == fresh_outcome(harness, bad), f"a memo changed how {bad.describe()} ran"
    assert outcome(harness, valid) == first, f"{valid.describe()} changed after {bad.describe()}"


def test_every_public_op_is_fuzzed():
    from tilebin.ops import engram, moe, quant, transpose

    public = {f"{m.__name__.rsplit('.', 1)[1]}.{n}" for m in (quant, moe, engram, transpose) for n in m.__all__}
    assert public == set(OPS), f"ops without a fuzz builder: {sorted(public - set(OPS))}"


def test_the_contract_check_can_fail(harness):
    """The launch check rejects launches that break the manifest (it is not vacuous)."""
    from tilebin.ops import moe

    moe.topk_gate(torch.randn(4, 64), 2)
    name, key, (scores, idx) = harness.launches[-1]
    spec = harness.manifest.kernels[name]
    with pytest.raises(AssertionError, match="dtype"):
        check_launch(spec, key, (scores.double(), idx))
    with pytest.raises(AssertionError, match="rank"):
        check_launch(spec, key, (scores[None], idx))
    with pytest.raises(AssertionError, match="shape"):
        check_launch(spec, key, (scores, idx[:3]))
    with pytest.raises(AssertionError, match="overlaps"):
        check_launch(spec, key, (scores, scores.view(torch.int64).flatten()[:8].view(4, 2)))


MHC_OPS = sorted(F.MHC_BUILDERS)
MHC_OPTIONAL = {op: F.optional_params(op) for op in MHC_OPS}


@settings(max_examples=400, derandomize=True, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(op=st.sampled_from(MHC_OPS), rng=st.randoms(use_true_random=False))
def test_mhc_bad_calls_are_typed_and_never_change_good_ones(harness, op, rng):
    """The same three properties for the mHC ops' OpSpec ops (``tilebin.modeling.mhc.ops``)."""
    check_properties(harness, op, rng, MHC_OPTIONAL[op])
