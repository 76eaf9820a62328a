"""The ``torch.library`` registration of every op (``tilebin::<op>``), on CPU with the launch stubbed.

For random valid calls of every public op (``tests/fuzz_cases.py``'s builders):

* the fake implementation (the op's own code on fake tensors) gives outputs with the dtypes,
  shapes and strides of the eager op's, and launches nothing;
* the custom op's real implementation launches exactly what the eager op launches;
* ``torch.compile(fullgraph=True)`` of the op compiles with no graph break and launches the same;
* ``torch.library.opcheck`` passes its schema and fake-tensor tests (the value-comparing ones
  run on the GPU: stubbed launches leave outputs unwritten).

The GPU twin (``tests/gpu/test_gpu_torch_compile.py``) runs the kernels for real on the H200.
"""

from __future__ import annotations

import inspect
import random
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import fuzz_cases as F  # noqa: E402
from ops_stub import StubbedOps, describe, describe_launches  # noqa: E402

from tilebin.ops._torch import register_all, traced  # noqa: E402
from tilebin.runtime import ArgumentError  # noqa: E402

OPS = sorted(F.BUILDERS) + sorted(F.MHC_BUILDERS)
SEEDS = range(4)


@pytest.fixture()
def stub(monkeypatch):
    register_all()
    return StubbedOps(monkeypatch)


def _positional(call: F.Call) -> tuple:
    """The call's arguments as the public op's parameters in order (defaults filled)."""
    bound = inspect.signature(F.op_function(call.op)).bind(*call.args, **call.kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments.values())


def _name(call: F.Call) -> str:
    return call.op.split(".")[1]


def _meta(value):
    """dtype, shape and strides of every tensor in a result (values are not compared)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), tuple(value.stride()))
    if isinstance(value, (tuple, list)):
        return type(value).__name__, tuple(_meta(v) for v in value)
    return value


def _valid_call(op: str, seed: int) -> F.Call:
    call = F.build(op, random.Random(seed), "cpu")
    if op == "moe.get_fused_mapping":  # a given size: the sync form is eager-only (tested below)
        args = _positional(call)
        if args[2] == 0:
            n = args[0].numel() + args[1] * (args[3] - 1)
            call = F.Call(op, [args[0], args[1], max(-(-n // args[3]) * args[3], args[3]), args[3], args[4]])
    return call


def _fake_copy(mode: FakeTensorMode, args: tuple) -> tuple:
    def conv(v):
        if isinstance(v, torch.Tensor):
            return mode.from_tensor(v)
        if isinstance(v, (tuple, list)):  # a pair, or a Tensor[] (mhc_multilayer_recompute)
            return type(v)(conv(x) for x in v)
        return v
    return tuple(conv(a) for a in args)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("op", OPS)
def test_fake_outputs_match_eager_and_launch_nothing(stub, op, seed):
    call = _valid_call(op, seed)
    args = _positional(call)
    eager, err = F.run(F.Call(op, list(args)))
    assert err is None, f"{call.describe()}: {err!r}"
    stub.launches.clear()
    mode = FakeTensorMode()
    with mode:
        fake = traced(_name(call), *_fake_copy(mode, args))
    assert stub.launches == []
    if op == "moe.reduce_fused" and args[-1] is not None:  # the out= form returns out itself
        return
    assert _meta(fake) == _meta(eager), call.describe()


@pytest.mark.parametrize("op", OPS)
def test_custom_op_launches_what_eager_launches(stub, op):
    call = _valid_call(op, 1)
    args = _positional(call)
    stub.fresh()
    eager, err = F.run(F.Call(op, list(args)))
    assert err is None, f"{call.describe()}: {err!r}"
    expected = describe_launches(stub.launches)
    stub.launches.clear()
    stub.fresh()
    via_op = traced(_name(call), *args)  # outside a trace: runs torch.ops.tilebin.<op> for real
    assert describe_launches(stub.launches) == expected, call.describe()
    assert _meta(via_op) == _meta(eager)


@pytest.mark.parametrize("op", ["quant.per_token_cast", "quant.per_block_cast", "moe.topk_gate",
                                "moe.get_fused_mapping", "moe.expand_to_fused", "moe.reduce_fused",
                                "quant.swiglu_backward_and_per_token_cast", "engram.engram_gate_fwd",
                                "mhc.mhc_pre_norm_fn", "mhc.mhc_multilayer_recompute"])
def test_fullgraph_compile_records_the_custom_op(stub, op):
    torch._dynamo.reset()
    call = _valid_call(op, 2)
    args = _positional(call)
    fn = F.op_function(op)
    stub.fresh()
    eager = fn(*args)
    expected = describe_launches(stub.launches)
    stub.launches.clear()
    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True, backend="aot_eager")
    result = compiled(*args)
    assert describe_launches(stub.launches) == expected
    assert _meta(result) == _meta(eager)


def test_get_fused_mapping_sync_form_breaks_the_graph_on_purpose(stub):
    from tilebin.ops import moe

    torch._dynamo.reset()
    topk_idx = torch.randint(0, 8, (6, 2), dtype=torch.int64)
    compiled = torch.compile(lambda t: moe.get_fused_mapping(t, 8, 0, 4)[0], fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="disable|skip|graph break|Unsupported"):
        compiled(topk_idx)


def test_bad_scalar_under_compile_is_an_argument_error(stub):
    from tilebin.ops import quant

    torch._dynamo.reset()
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    compiled = torch.compile(lambda t: quant.per_token_cast(t, "e4m3", 128, round_sf=2)[0], backend="aot_eager")
    with pytest.raises(ArgumentError, match="round_sf must be a bool"):
        compiled(x)


def test_export_records_the_custom_ops(stub):
    from tilebin.ops import moe, quant

    class Block(torch.nn.Module):
        def forward(self, x, topk_idx):
            mapping = moe.get_fused_mapping(topk_idx, 8, 64, 4)
            expanded = moe.expand_to_fused(x, mapping[3], mapping[0])
            return quant.per_token_cast(expanded, "e4m3", 128)

    x, topk_idx = torch.randn(5, 256, dtype=torch.bfloat16), torch.randint(0, 8, (5, 2), dtype=torch.int64)
    program = torch.export.export(Block(), (x, topk_idx))
    code = program.graph_module.code
    for name in ("get_fused_mapping", "expand_to_fused", "per_token_cast"):
        assert f"torch.ops.tilebin.{name}.default" in code
    out, sf = (n.meta["val"] for n in program.graph.output_node().args[0])
    assert (tuple(out.shape), out.dtype, tuple(sf.shape)) == ((64, 256), torch.float8_e4m3fn, (64, 2))


@pytest.mark.parametrize("op", OPS)
def test_opcheck(stub, op):
    call = _valid_call(op, 3)
    name = _name(call)
    register_all()[name]  # noqa: B018 - registered
    from tilebin.ops import _torch

    spec = _torch._OPS[name]
    schema_args = _torch._coerce(spec, spec.to_schema(*_positional(call)))
    if _positional(call)[-1] is not None and name + "_out" in _torch._OPS:  # out= given: the <op>_out op
        name, spec = name + "_out", _torch._OPS[name + "_out"]
        schema_args = _torch._coerce(spec, spec.to_schema(*_positional(call)))
    # values are compared on the GPU only (launch stubbed here); test_schema compares inputs before
    # and after with arithmetic CPU torch lacks for float8
    fp8 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in schema_args)
    tests = ("test_faketensor",) if fp8 else ("test_schema", "test_faketensor")
    torch.library.opcheck(getattr(torch.ops.tilebin, name).default, schema_args, test_utils=tests)


def test_every_public_op_is_registered():
    from tilebin.ops import engram, moe, quant

    ops = register_all()
    public = {n for m in (quant, moe, engram) for n in m.__all__}
    assert public <= set(ops), sorted(public - set(ops))
    from tilebin.modeling.mhc.ops._torch_ops import MODULES  # mHC: the ops behind its autograd Functions

    specs = {spec.name for m in MODULES for spec in m.SPECS}
    assert specs <= set(ops) and {f"mhc.{n}" for n in specs} == set(F.MHC_BUILDERS), sorted(specs)


def test_tracing_flag_is_per_thread():
    """A fake run on one thread (TRACING on) must not turn another thread's real launches into no-ops."""
    import threading

    from tilebin.ops._common import TRACING, _no_launch, launcher

    seen = []
    TRACING.on = True
    try:
        assert launcher("moe.topk_gate", slots=2) is _no_launch
        worker = threading.Thread(target=lambda: seen.append(TRACING.on))
        worker.start()
        worker.join()
    finally:
        TRACING.on = False
    assert seen == [False]


@pytest.mark.parametrize("op", ["moe.aux_fi", "moe.group_count", "moe.reduce_fused", "transpose.transpose",
                                "transpose.batched_transpose"])
def test_plans_trace_under_dynamic_shapes(stub, op):
    """The ops whose plans pick a kernel by the token count trace with symbolic sizes (opcheck's
    aot_dispatch_dynamic; found on the H200: aux_fi, then the transpose ops, keyed a dict by a SymBool).  The launch is
    stubbed here, so the eager outputs are uninitialized and the value comparison may differ:
    only a tracing failure fails this test (the GPU opcheck compares the values)."""
    call = _valid_call(op, 3)
    name = _name(call)
    register_all()[name]  # noqa: B018 - registered
    from tilebin.ops import _torch

    spec = _torch._OPS[name]
    schema_args = _torch._coerce(spec, spec.to_schema(*_positional(call)))
    try:
        torch.library.opcheck(getattr(torch.ops.tilebin, name).default, schema_args,
                              test_utils=("test_aot_dispatch_dynamic",))
    except Exception as exc:  # noqa: BLE001 - only "outputs differ" is expected with the stubbed launch
        assert "Outputs of the operator are different" in str(exc), str(exc)[:400]
