"""GPU tests of ``moe.aux_fi``'s grid path and its zeroed state (``ops._common.ZeroedState``).

The grid's blocks add their counts to totals in a state buffer and the last arrival (per bin,
or by a ticket: both modes run here, forced) converts them and zeroes the buffer again, so the op keeps one state per stream
and gives a CUDA-graph capture its own.  These tests run the grid path (more than
``SINGLE_BLOCK_ENTRIES`` indices) bit-exact against ``moe_ref``:
- repeated calls of different sizes and SM counts, and the state all zero after each;
- four streams at once with no sync between them (each stream its own state);
- CUDA graphs: replays with new indices, eager calls in between, two graphs replayed at once on
  two streams.
"""

from __future__ import annotations

import pytest
import torch

from _gpu_util import assert_bits_equal
from _moe_util import load_moe_ops, seed, topk_idx
from moe_ref import stats as stats_ref

EXPERTS = 32


@pytest.fixture(scope="module")
def moe(require):
    return load_moe_ops(require, ("aux_fi",), "ops/moe/_stats.py")


@pytest.fixture
def states(moe, monkeypatch):
    """Every ZeroedState the op makes from now on (its memo emptied, so plans are made afresh)."""
    from tilebin.ops import _common
    from tilebin.ops.moe import _stats

    made = []

    class Recorded(_common.ZeroedState):
        __slots__ = ()

        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(_stats, "ZeroedState", Recorded)
    monkeypatch.setattr(_stats.AUX_FI, "memo", {})
    return made


@pytest.fixture(params=("arrivals", "ticket"))
def mode(request, monkeypatch):
    """The grid mode, forced for every expert count (the op picks by ``arrivals_max_experts``)."""
    from tilebin.ops.moe import _stats

    real = _stats.kernel_meta
    bound = (1 << 30) if request.param == "arrivals" else 0
    monkeypatch.setattr(_stats, "kernel_meta", lambda k, key: bound if key == "arrivals_max_experts" else real(k, key))
    monkeypatch.setattr(_stats.AUX_FI, "memo", {})
    return request.param


def _indices(tokens: int, topk: int) -> torch.Tensor:
    return topk_idx(tokens, topk, EXPERTS, 8)


@pytest.mark.parametrize("experts", (1, 32, 257, 4096))
def test_state_is_zero_after_every_call(moe, states, mode, sm_counts, experts):
    seed("aux_fi_state", experts)
    counts, set_num_sms = sm_counts
    for tokens, topk in ((700, 8), (4001, 2), (4001, 9), (20000, 8)):  # all past SINGLE_BLOCK_ENTRIES
        idx = torch.randint(-1, experts, (tokens, topk), dtype=torch.int64, device="cuda")
        want = stats_ref.aux_fi(idx, experts, topk)
        for sms in counts:
            set_num_sms(sms)
            assert_bits_equal(moe.aux_fi(idx, experts, topk), want,
                              f"aux_fi({tuple(idx.shape)}, E={experts}, {mode}, {sms} SMs)")
            torch.cuda.synchronize()
            buffers = [b for s in states for b in s.by_stream.values()]
            assert buffers, "the grid path made no state (did the call take the grid path?)"
            assert all(not b.any() for b in buffers), f"state left non-zero: {[b.tolist() for b in buffers]}"
    set_num_sms(0)


def test_streams_at_once(moe, states, mode):
    seed("aux_fi_streams")
    streams = [torch.cuda.Stream() for _ in range(4)]
    inputs = [_indices(1000 + 700 * i, 2 + 2 * i) for i in range(4)]
    wants = [stats_ref.aux_fi(idx, EXPERTS, idx.shape[1]) for idx in inputs]
    torch.cuda.synchronize()
    results = [[] for _ in streams]
    for _ in range(30):
        for i, (stream, idx) in enumerate(zip(streams, inputs)):
            with torch.cuda.stream(stream):
                results[i].append(moe.aux_fi(idx, EXPERTS, idx.shape[1]))
    torch.cuda.synchronize()
    for i, got in enumerate(results):
        for n, g in enumerate(got):
            assert_bits_equal(g, wants[i], f"stream {i}, call {n}")
    handles = {s.cuda_stream for s in streams}
    owned = {k for s in states for k in s.by_stream}
    assert handles <= owned, "each stream has its own state"


def _fixed(rows: int, topk: int) -> torch.Tensor:
    """Indices of a fixed shape (a graph's static input): experts and -1 (not counted)."""
    return torch.randint(-1, EXPERTS, (rows, topk), dtype=torch.int64, device="cuda")


def test_cuda_graphs(moe, states, mode):
    seed("aux_fi_graphs")
    static = [_fixed(3000, 6), _fixed(3000, 6)]
    graphs, outs = [], []
    moe.aux_fi(static[0], EXPERTS, 6)  # warm: the plan and the cubin load outside capture
    torch.cuda.synchronize()
    for idx in static:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append(moe.aux_fi(idx, EXPERTS, 6))
        graphs.append(graph)
    side = [torch.cuda.Stream(), torch.cuda.Stream()]
    for round_ in range(5):
        fresh = [_fixed(3000, 6), _fixed(3000, 6)]
        for idx, new in zip(static, fresh):
            idx.copy_(new)
        torch.cuda.synchronize()
        wants = [stats_ref.aux_fi(idx, EXPERTS, 6) for idx in fresh]
        for graph, stream in zip(graphs, side):  # both graphs at once, on two streams
            with torch.cuda.stream(stream):
                graph.replay()
        eager = moe.aux_fi(fresh[0], EXPERTS, 6)  # and an eager call on the current stream meanwhile
        torch.cuda.synchronize()
        for i, (out, want) in enumerate(zip(outs, wants)):
            assert_bits_equal(out, want, f"graph {i}, replay {round_}")
        assert_bits_equal(eager, wants[0], f"eager call during replay {round_}")
