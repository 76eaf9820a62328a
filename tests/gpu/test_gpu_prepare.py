"""runtime.prepare: a call validated once and re-launched on the same buffers (eager, on another
stream, and captured in a CUDA graph), for every kind of kernel in the wheel."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from _cases import CASE_KERNEL, CASE_KINDS, make_case  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind", CASE_KINDS)
def test_prepared_call_relaunches_on_new_contents(rt, rng, require, kind):
    require(CASE_KERNEL[kind])
    case = make_case(kind, rng, rt)
    call = rt.prepare(case.kernel, *case.args, **case.kwargs)
    for rep in range(3):
        case.refill()
        case.poison()
        call()
        case.check(f"prepared call {rep}")


@pytest.mark.parametrize("kind", CASE_KINDS)
def test_prepared_call_on_a_side_stream_and_in_a_graph(rt, rng, require, kind):
    require(CASE_KERNEL[kind])
    case = make_case(kind, rng, rt)
    call = rt.prepare(case.kernel, *case.args, **case.kwargs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        case.poison()
        call(stream=side)
    side.synchronize()
    case.check("side stream")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    case.refill()
    case.poison()
    g.replay()
    torch.cuda.synchronize()
    case.check("graph replay")


def test_prepare_refuses_bad_calls_before_any_launch(rt):
    x = torch.zeros(2, 8, 16, device="cuda", dtype=torch.bfloat16)
    out = torch.full((2, 16, 8), float("nan"), device="cuda", dtype=torch.bfloat16)
    with pytest.raises(rt.NoVariantError):
        rt.prepare("transpose.batched_transpose", x.float(), out)
    with pytest.raises(rt.ArgumentError):
        rt.prepare("transpose.batched_transpose", x, out[:, :8])  # wrong shape
    torch.cuda.synchronize()
    assert torch.isnan(out).all()
