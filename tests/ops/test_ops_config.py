"""``tilebin.ops.config`` (tile_kernels.config's API) on CPU, with the CUDA device queries stubbed:
two devices of different SM counts, so an op on ``cuda:1`` is sized by ``cuda:1`` (issue 15)."""

from __future__ import annotations

import pytest
import torch

from tilebin.ops import config
from tilebin.runtime import ArgumentError

SMS = {0: 132, 1: 114}


@pytest.fixture()
def two_devices(monkeypatch):
    class Props:
        def __init__(self, index: int) -> None:
            self.multi_processor_count = SMS[index]

    config._device_sms.cache_clear()
    config._BY_DEVICE[0] = {}
    monkeypatch.setattr(torch.cuda, "get_device_properties", Props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    yield
    config.set_num_sms(0)
    config._device_sms.cache_clear()


def test_each_device_has_its_own_count(two_devices):
    assert config.get_num_sms() == 132  # the current device
    assert config.get_num_sms(torch.device("cuda", 1)) == 114
    assert config.get_num_sms(1) == 114
    assert config.get_num_sms(torch.device("cuda")) == 132  # no index: the current device
    assert config.get_device_num_sms(torch.device("cuda", 1)) == 114


def test_an_override_never_exceeds_a_devices_count(two_devices):
    config.set_num_sms(120)
    assert config.get_num_sms() == 120
    assert config.get_num_sms(torch.device("cuda", 1)) == 114
    config.set_num_sms(0)
    assert config.get_num_sms(1) == 114


def test_a_remembered_count_follows_set_num_sms(two_devices):
    dev1 = torch.device("cuda", 1)
    assert config.get_num_sms(dev1) == 114
    assert config._BY_DEVICE[0] == {dev1: 114}  # remembered: the ops ask on every call
    config.set_num_sms(100)
    assert config.get_num_sms(dev1) == 100
    assert config.get_num_sms(dev1) == 100
    config.set_num_sms(0)
    assert config.get_num_sms(dev1) == 114


@pytest.mark.parametrize("bad", [-1, True, 1.0, "8", 133])
def test_bad_counts_are_refused(two_devices, bad):
    with pytest.raises(ArgumentError, match="set_num_sms"):
        config.set_num_sms(bad)
    assert config.get_num_sms() == 132
