"""What the OpSpec replay tests share (``test_*_replay.py``): a recorder of launches and of the
checked path, the comparison of a replayed call with the checked one, refusal checks, and inputs
at awkward addresses."""

from __future__ import annotations

import math

import pytest
import torch

from ops_stub import StubbedOps
from tilebin.ops import _spec
from tilebin.runtime import ArgumentError

E4M3 = torch.float8_e4m3fn


class Recorder:
    """The stubbed ops (launches recorded: ``calls``) and the specs whose checked path ran (``checked``)."""

    def __init__(self, monkeypatch):
        self.stub = StubbedOps(monkeypatch)  # launcher, device check, kernel meta, SM count stubbed; memos emptied
        self.checked: list[str] = []
        real = _spec.OpSpec.checked
        monkeypatch.setattr(_spec.OpSpec, "checked",
                            lambda spec, args, key: self.checked.append(spec.name) or real(spec, args, key))

    @property
    def calls(self) -> list:
        return self.stub.launches

    def run(self, call, *, fast: bool):
        """``(result, launches)`` of ``call()``; asserts whether the checked path ran."""
        before, start = len(self.checked), len(self.calls)
        result = call()
        assert (len(self.checked) == before) == fast, f"expected the {'replayed' if fast else 'checked'} path"
        return result, self.calls[start:]

    def checked_run(self, spec, call):
        """``call()`` through the checked path (the spec's memo emptied for it, then restored;
        what the call stored stays)."""
        saved = dict(spec.memo)
        spec.memo.clear()
        try:
            return self.run(call, fast=False)
        finally:
            spec.memo.update(saved)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t)


def _shares(t: torch.Tensor, k: torch.Tensor) -> bool:
    return t.numel() > 0 and k.numel() > 0 and _storage(t) == _storage(k)


def _sig(value, known: list, args: tuple = ()):
    """Comparable description: tensors by dtype/shape/strides/offset, which known tensor they are
    (inputs, stand-ins) and which launch argument they share memory with (outputs)."""
    if isinstance(value, (tuple, list)):
        return tuple(_sig(v, known, args) for v in value)
    if isinstance(value, torch.Tensor):
        same = next((i for i, k in enumerate(known) if value is k), None)
        shares = next((i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.numel() and value.numel()
                       and _storage(a) == _storage(value)), None)
        return ("tensor", value.dtype, tuple(value.shape), value.stride(), value.storage_offset(), value.device,
                same, shares)
    return (type(value), value)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == E4M3 else t


def assert_same(slow, fast, known: list):
    """Two ``(result, launches)`` describe the same work."""
    (r_slow, l_slow), (r_fast, l_fast) = slow, fast
    assert len(l_slow) == len(l_fast) <= 1
    args_slow = l_slow[0][2] if l_slow else ()
    args_fast = l_fast[0][2] if l_fast else ()
    if l_slow:
        (n1, k1, a1), (n2, k2, a2) = l_slow[0], l_fast[0]
        assert n1 == n2 and k1 == k2
        assert _sig(a1, known) == _sig(a2, known)
        for x1, x2 in zip(a1, a2):  # inputs (or their copies) hold the same values
            if isinstance(x1, torch.Tensor) and x1.device.type != "meta" and any(
                    x1 is k or _shares(x1, k) for k in known):
                assert torch.equal(_bits(x1), _bits(x2))
    assert _sig(r_slow, known, args_slow) == _sig(r_fast, known, args_fast)


def raises(rec, spec, match: str, fn, *args, replayed: bool = False, **kwargs):
    """``fn`` raises ArgumentError matching ``match`` with a warm memo, launching and storing
    nothing, and the same message with an empty one.  ``replayed``: the warm call found its
    configuration (a per-call check refused it, not the checked path)."""
    saved, start, checked = dict(spec.memo), len(rec.calls), len(rec.checked)
    with pytest.raises(ArgumentError, match=match) as warm:
        fn(*args, **kwargs)
    assert spec.memo == saved and len(rec.calls) == start
    assert not replayed or len(rec.checked) == checked, "the configuration was not found"
    spec.memo.clear()
    try:
        with pytest.raises(ArgumentError) as cold:
            fn(*args, **kwargs)
        assert not spec.memo and len(rec.calls) == start
    finally:
        spec.memo.update(saved)
    assert str(cold.value) == str(warm.value)


def misaligned(shape, dtype, by: int = 1):
    """A contiguous tensor whose data pointer is ``by`` elements past a 16-byte boundary."""
    flat = torch.randn(math.prod(shape) + by).to(dtype)
    return flat[by:].view(shape)


def odd_address(shape, dtype):
    """A contiguous tensor whose data pointer is odd (one byte into its storage)."""
    storage = torch.zeros(math.prod(shape) * torch.empty((), dtype=dtype).element_size() + 1,
                          dtype=torch.uint8).untyped_storage()[1:]
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)
