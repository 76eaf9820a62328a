"""ops._common.alloc_device: the index-less ``cuda`` device only for the current CUDA device."""

from __future__ import annotations

import torch

from tilebin.ops import _common


def test_current_cuda_device_allocates_index_less(monkeypatch):
    monkeypatch.setattr(_common, "_CURRENT_DEVICE", lambda: 1)
    assert _common.alloc_device(torch.device("cuda", 1)) == torch.device("cuda")
    assert _common.alloc_device(torch.device("cuda", 1)).index is None


def test_other_devices_keep_their_index(monkeypatch):
    monkeypatch.setattr(_common, "_CURRENT_DEVICE", lambda: 1)
    assert _common.alloc_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert _common.alloc_device(torch.device("cpu")) == torch.device("cpu")


def test_read_per_call(monkeypatch):
    """The current device is read at every call (a caller may switch it between calls)."""
    current = [0]
    monkeypatch.setattr(_common, "_CURRENT_DEVICE", lambda: current[0])
    dev = torch.device("cuda", 0)
    assert _common.alloc_device(dev).index is None
    current[0] = 1
    assert _common.alloc_device(dev) == dev


def test_no_cuda_in_torch_or_tracing(monkeypatch):
    monkeypatch.setattr(_common, "_CURRENT_DEVICE", None)
    assert _common.alloc_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    monkeypatch.setattr(_common, "_CURRENT_DEVICE", lambda: 0)
    monkeypatch.setattr(_common.TRACING, "on", True)
    assert _common.alloc_device(torch.device("cuda", 0)) == torch.device("cuda", 0)  # fake tensors keep theirs
