"""tilebin ops inside compiled torch graphs, on the H200 with the installed wheel.

* ``torch.compile(fullgraph=True)`` (inductor) of a small MoE block (top2_sum_gate ->
  get_fused_mapping with ``num_expanded_tokens`` given -> expand_to_fused -> per_token_cast ->
  reduce_fused) and of a quantization round trip (per_token_cast -> cast_back): no graph break,
  outputs bit-identical to eager, also under ``mode="reduce-overhead"`` (CUDA graphs);
* ``torch.export`` of the MoE block: the program records ``tilebin::<op>`` nodes with the fake
  shapes, and running it equals eager bit for bit;
* ``torch.library.opcheck`` of every op on random valid calls (``tests/fuzz_cases.py``):
  schema (declared mutations), fake tensors vs real outputs, AOT dispatch, autograd registration.
"""

from __future__ import annotations

import inspect
import random

import pytest
import torch

import fuzz_cases as F
from _gpu_util import assert_bits_equal

pytestmark = pytest.mark.gpu

E, TOPK, GROUPS, TOPK_GROUPS, HIDDEN = 256, 8, 8, 4, 1024


def _moe_inputs(tokens: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn((tokens, E), device="cuda", generator=g)
    bias = torch.randn((E,), device="cuda", generator=g) * 0.1
    x = torch.randn((tokens, HIDDEN), device="cuda", generator=g).bfloat16()
    return logits, bias, x


def moe_block(logits: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    from tilebin.ops import moe, quant

    topk_idx, topk_weights = moe.top2_sum_gate(logits, bias, TOPK, TOPK_GROUPS, GROUPS, False, 0, 2.5, 0, 1, 0, 1,
                                               "sigmoid")
    slots = x.shape[0] * TOPK + E * 127  # every expert's count rounded up to 128: the most it can take
    mapping = moe.get_fused_mapping(topk_idx, E, slots, 128)
    expanded = moe.expand_to_fused(x, mapping[3], mapping[0])
    data, sf = quant.per_token_cast(expanded, "e4m3", 128)
    expert_out = (data.float() * sf.repeat_interleave(128, dim=1)).bfloat16()  # stands in for the expert GEMMs
    combined = moe.reduce_fused(expert_out, topk_weights, mapping[3])
    return topk_idx, topk_weights, mapping[0], data, sf, combined


def quant_round_trip(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    from tilebin.ops import quant

    data, sf = quant.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True)
    return data, sf, quant.cast_back((data, sf), "bf16", (1, 128))


def _same(a, b) -> None:
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        assert (u.shape, u.dtype, u.stride()) == (v.shape, v.dtype, v.stride()), f"output {i}"
        assert_bits_equal(v, u, f"output {i}")


@pytest.mark.parametrize("tokens, mode", [(1, "default"), (4096, "default"), (77, "reduce-overhead")])
def test_moe_block_compiles_fullgraph_and_equals_eager(tokens, mode):
    torch._dynamo.reset()
    inputs = _moe_inputs(tokens)
    eager = moe_block(*inputs)
    compiled = torch.compile(moe_block, fullgraph=True, mode=mode, dynamic=False)
    for _ in range(3):  # reduce-overhead records its CUDA graph on a later call
        result = compiled(*inputs)
    torch.cuda.synchronize()
    _same(eager, result)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_quant_round_trip_compiles_fullgraph_and_equals_eager(mode):
    torch._dynamo.reset()
    x = torch.randn((1000, 2048), device="cuda").bfloat16()
    eager = quant_round_trip(x)
    compiled = torch.compile(quant_round_trip, fullgraph=True, mode=mode)
    for _ in range(3):
        result = compiled(x)
    torch.cuda.synchronize()
    _same(eager, result)


def test_compiled_graph_with_dynamic_token_count():
    torch._dynamo.reset()
    compiled = torch.compile(quant_round_trip, fullgraph=True, dynamic=True)
    for tokens in (5, 64, 333):
        x = torch.randn((tokens, 2048), device="cuda").bfloat16()
        _same(quant_round_trip(x), compiled(x))


def test_export_of_the_moe_block():
    class Block(torch.nn.Module):
        def forward(self, logits, bias, x):
            return moe_block(logits, bias, x)

    inputs = _moe_inputs(300, seed=1)
    program = torch.export.export(Block(), inputs)
    code = program.graph_module.code
    for name in ("top2_sum_gate", "get_fused_mapping", "expand_to_fused", "per_token_cast", "reduce_fused"):
        assert f"torch.ops.tilebin.{name}.default" in code, code
    vals = [n.meta["val"] for n in program.graph.output_node().args[0]]
    slots = 300 * TOPK + E * 127
    assert [tuple(v.shape) for v in vals] == [(300, TOPK), (300, TOPK), (slots,), (slots, HIDDEN),
                                              (slots, HIDDEN // 128), (300, HIDDEN)]
    print(program)  # the exported program, for the log
    _same(moe_block(*inputs), program.module()(*inputs))


def _positional(call: F.Call) -> tuple:
    bound = inspect.signature(F.op_function(call.op)).bind(*call.args, **call.kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments.values())


@pytest.mark.parametrize("seed", range(1))
@pytest.mark.parametrize("op", sorted(F.BUILDERS))
def test_opcheck_every_op(op, seed):
    from tilebin.ops import _torch

    _torch.register_all()
    call = F.build(op, random.Random(100 + seed), "cuda")
    args = _positional(call)
    name = op.split(".")[1]
    if name == "get_fused_mapping" and args[2] == 0 and not args[4]:  # the sync form is eager-only
        need = max(args[0].numel() + args[1] * (args[3] - 1), args[3])
        args = (args[0], args[1], -(-need // args[3]) * args[3], *args[3:])
    if name == "reduce_fused" and args[-1] is not None:
        name = "reduce_fused_out"
    spec = _torch._OPS[name]
    schema_args = _torch._coerce(spec, spec.to_schema(*args))
    # opcheck's test_schema does arithmetic on the inputs, which torch lacks for float8
    fp8 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in schema_args)
    tests = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")
    torch.library.opcheck(getattr(torch.ops.tilebin, name).default, schema_args,
                          test_utils=tests if fp8 else ("test_schema", *tests))
