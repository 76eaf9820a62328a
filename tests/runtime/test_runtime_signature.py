"""The fast plan-cache key: what it distinguishes, and when it hands the call to the general path."""

from __future__ import annotations

import pytest

import rt_fakes as F


@pytest.fixture
def sig(monkeypatch):
    from tilebin.runtime import _signature, _tensors

    monkeypatch.setattr(_tensors, "TORCH_TENSOR", [F.FakeTorchTensor])
    monkeypatch.setattr(_signature, "TORCH_TENSOR", _tensors.TORCH_TENSOR)
    return _signature.fast_signature


@pytest.mark.parametrize("tensor_pos", [(0, 1), (0, 1, 2), (0,), (0, 1, 2, 3)])
def test_keys_tell_apart_dtype_shape_and_device(sig, tensor_pos):
    f = sig(len(tensor_pos), tensor_pos, (), ())
    args = [F.FakeTorchTensor((4, 8)) for _ in tensor_pos]
    base = f(tuple(args))
    assert base is not None and base == f(tuple(F.FakeTorchTensor((4, 8)) for _ in tensor_pos))
    for change in ({"shape": (4, 9)}, {"dtype": "float32"}, {"device": ("cuda", 1)}):
        other = list(args)
        other[-1] = F.FakeTorchTensor(change.get("shape", (4, 8)), dtype=change.get("dtype", "bfloat16"),
                                      device=change.get("device", ("cuda", 0)))
        assert f(tuple(other)) != base, change


def test_strides_are_part_of_the_key(sig):
    f = sig(2, (0, 1), (), ())
    x, y = F.FakeTorchTensor((4, 8)), F.FakeTorchTensor((4, 8))
    before = f((x, y))
    y._strides = (1, 4)  # same shape, transposed layout
    assert f((x, y)) != before


def test_scalars_keyed_by_value_or_by_type(sig):
    f = sig(4, (0, 1), (2,), (3,))
    x, y = F.FakeTorchTensor((4, 8)), F.FakeTorchTensor((4, 8))
    assert f((x, y, 128, 1.0)) == f((x, y, 128, 2.0))  # pass-through scalar: its type only
    assert f((x, y, 128, 1.0)) != f((x, y, 64, 1.0))  # keyed scalar: its value
    assert f((x, y, 128, 1)) != f((x, y, 128, 1.0))


@pytest.mark.parametrize("tensor_pos", [(0, 1), (0, 1, 2), (0,)])
def test_anything_unusual_takes_the_general_path(sig, tensor_pos):
    f = sig(len(tensor_pos) + 1, tensor_pos, (len(tensor_pos),), ())
    good = [F.FakeTorchTensor((4, 8)) for _ in tensor_pos]

    class Sub(F.FakeTorchTensor):
        pass

    assert f((*good, 3)) is not None
    assert f(tuple(good)) is None  # too few arguments
    assert f((*good, 3, 4)) is None  # too many
    assert f((*good, "3")) is None  # an odd scalar type
    assert f((*good[:-1], Sub((4, 8)), 3)) is None  # a tensor subclass
    assert f((*good[:-1], F.FakeTensor((4, 8)), 3)) is None  # a CUDA-array-interface object


def test_before_torch_is_imported_every_call_is_general(monkeypatch):
    from tilebin.runtime import _signature

    monkeypatch.setattr(_signature, "TORCH_TENSOR", [None])
    f = _signature.fast_signature(2, (0, 1), (), ())
    assert f((F.FakeTorchTensor((1,)), F.FakeTorchTensor((1,)))) is None
