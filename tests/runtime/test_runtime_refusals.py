"""One rule for refusals: every refusal of a call's arguments is an ArgumentError, "no variant
for this dtype" included (NoVariantError is a subclass), raised before any GPU work."""

from __future__ import annotations

import pytest
import rt_fakes as F


def test_wrong_dtype_launch_is_an_argument_error(make_registry, fake_gpu, rt):
    reg = make_registry()
    with pytest.raises(rt.ArgumentError) as info:
        reg.launch("toy.scale", F.tensor((4, 64), dtype="int8"), F.tensor((4, 64), dtype="int8"), 1.0)
    assert isinstance(info.value, rt.NoVariantError)
    assert not fake_gpu.launches


def test_unknown_kernel_is_an_argument_error(make_registry, fake_gpu, rt):
    with pytest.raises(rt.ArgumentError, match="unknown kernel"):
        make_registry().launch("toy.nope", F.tensor((4, 64)), F.tensor((4, 64)))
    assert not fake_gpu.launches
