"""The SwiGLU replay tests' view of ``replay_util`` (``test_swiglu_replay*.py``): the forward's
stand-in tensors (``_swiglu._DUMMIES``) count as known inputs, and ``Recorder.both`` compares a
checked call with its replay."""

from __future__ import annotations

import replay_util
from replay_util import misaligned, odd_address, raises  # noqa: F401  (re-exported)
from tilebin.ops.quant import _swiglu as sw


class Recorder(replay_util.Recorder):
    def both(self, spec, call, known: list):
        """The checked call, then the replayed one, on the same arguments: the same work."""
        assert_same(self.checked_run(spec, call), self.run(call, fast=True), known)


def assert_same(slow, fast, known: list):
    """:func:`replay_util.assert_same`, the forward's stand-ins known too."""
    replay_util.assert_same(slow, fast, known + list(sw._DUMMIES.values()))
