"""my_kernels from its installed wheel (or a built checkout): the manifest it ships, and, on a
GPU, both kernels against torch, with TileLang and TVM blocked from import (tests/conftest.py)."""

import json
import sys
from importlib.resources import files

import pytest

import my_kernels
from tilebin import runtime


def _manifest() -> dict:
    return json.loads((files("my_kernels") / "_artifacts" / "manifest.json").read_text())


def test_the_package_ships_its_own_kernels():
    assert my_kernels.registry().kernel_names() == ["my_kernels.add_bias", "my_kernels.scale_rows"]
    assert my_kernels.registry() is runtime.Registry.for_package("my_kernels")
    assert not any(m.split(".")[0] in ("tilelang", "tvm") for m in sys.modules)


def test_the_kernels_assume_reached_the_manifest():
    for v in _manifest()["kernels"]["my_kernels.scale_rows"]["variants"]:
        assert {"expr": ["eq", ["floormod", "n", 8], 0], "source": "assume"} in v["conditions"]


def test_bias_is_optional():
    params = {p["name"]: p for p in _manifest()["kernels"]["my_kernels.add_bias"]["params"]}
    assert params["bias"]["optional"] and not params["x"]["optional"]


# ----------------------------------------------------------------------------- on a GPU
torch = pytest.importorskip("torch")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (sm_90a: H100/H200)")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m, n", [(0, 8), (1, 8), (3, 64), (5, 1000), (257, 4104)])
def test_scale_rows_matches_torch(dtype, m, n):
    x = torch.randn(m, n, device="cuda").to(dtype)
    want = (x.float() * 1.75).to(dtype)
    got = my_kernels.scale_rows(x, 1.75)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@gpu
def test_scale_rows_writes_over_poison():
    x = torch.randn(7, 96, device="cuda")
    y = torch.full_like(x, float("nan"))
    my_kernels.registry().launch("my_kernels.scale_rows", x, y, 2.0)
    torch.testing.assert_close(y, x * 2.0, rtol=0, atol=0)


@gpu
def test_a_call_that_breaks_the_assume_is_refused_before_gpu_work():
    x = torch.randn(4, 12, device="cuda")
    y = torch.full_like(x, 7.0)
    with pytest.raises(runtime.NoVariantError, match=r"n % 8 == 0 \(n = 12 from x.shape\[1\]"):
        my_kernels.registry().launch("my_kernels.scale_rows", x, y, 2.0)
    torch.cuda.synchronize()
    assert bool((y == 7.0).all())  # nothing ran
    my_kernels.scale_rows(torch.randn(4, 16, device="cuda"), 2.0)  # and good calls still work


@gpu
@pytest.mark.parametrize("with_bias", [True, False])
def test_add_bias(with_bias):
    x = torch.randn(33, 300, device="cuda")
    bias = torch.randn(300, device="cuda") if with_bias else None
    got = my_kernels.add_bias(x, bias)
    torch.testing.assert_close(got, x + bias if with_bias else x, rtol=0, atol=0)


@gpu
def test_add_bias_flag_condition():
    x = torch.randn(2, 8, device="cuda")
    with pytest.raises(runtime.NoVariantError, match="use_bias == 0 or use_bias == 1"):
        my_kernels.registry().launch("my_kernels.add_bias", x, None, 2, torch.empty_like(x))
