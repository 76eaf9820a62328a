"""``tilebin.ops.config``: the SM count ops size their grids by (``tile_kernels.config``'s API).

Kernels take the SM count as a run-time value, so one wheel serves every Hopper part (132, 114
and 78 SMs) and a caller may confine an op to fewer SMs (e.g. to leave room for a concurrent
communication kernel).  Results never depend on it.  Thread-safe (a plain module global).
"""

from __future__ import annotations

import functools

import torch

from tilebin.runtime import ArgumentError

_override = [0]
# [torch.device -> get_num_sms(device)]: the ops' per-call lookup.  set_num_sms sets the override, then
# puts a new dict here: a call that read the old dict stores into the old dict, never a stale count into the new
_BY_DEVICE: list = [{}]


@functools.lru_cache(maxsize=None)
def _device_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def get_device_num_sms(device: torch.device | int | None = None) -> int:
    """SM count of ``device`` (a ``torch.device`` or an index; None: the current CUDA device)."""
    if device is None or type(device) is int:
        return _device_sms(torch.cuda.current_device() if device is None else device)
    return _device_sms(torch.cuda.current_device() if device.index is None else device.index)


def set_num_sms(num_sms: int) -> None:
    """Use ``num_sms`` SMs (``1 <= num_sms <=`` the device's count); ``0`` restores the default."""
    if not isinstance(num_sms, int) or isinstance(num_sms, bool) or num_sms < 0:
        raise ArgumentError(f"set_num_sms: expected an int >= 0, got {num_sms!r}")
    if num_sms and num_sms > get_device_num_sms():
        raise ArgumentError(f"set_num_sms: {num_sms} SMs requested but the device has {get_device_num_sms()}; "
                            "pass at most that (or 0 for all)")
    _override[0] = num_sms
    _BY_DEVICE[0] = {}


def get_num_sms(device: torch.device | int | None = None) -> int:
    """The SM count ops use on ``device`` (None: the current device): :func:`set_num_sms`'s value
    (at most the device's own count), else the device's.  Ops pass their tensors' device, so a
    call on ``cuda:1`` is sized by ``cuda:1`` whatever the current device.  An indexed
    ``torch.device``'s count is remembered until the next :func:`set_num_sms` (the ops ask per call)."""
    known = _BY_DEVICE[0]
    sms = known.get(device) if type(device) is torch.device else None
    if sms is None:
        sms = get_device_num_sms(device)
        sms = min(_override[0], sms) if _override[0] else sms
        if type(device) is torch.device and device.index is not None:
            known[device] = sms
    return sms
