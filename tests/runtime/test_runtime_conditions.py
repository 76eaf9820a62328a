"""Variant conditions and optional tensors: the manifest says when a variant may serve a call.

A variant whose conditions fail (``n % 128 == 0`` with n = 192) is never launched: the runtime
takes the next variant that serves the call, or raises ``NoVariantError`` naming the condition,
the values and where they came from, before any GPU work.  An optional tensor may be ``None``:
its pointer argument is then null.  Every launch goes to the fake driver (``fake_gpu``), once
through the compiled hot path and once through the Python twin.
"""

from __future__ import annotations

import copy

import pytest
import rt_fakes as F

MOD_128 = {"expr": ["eq", ["floormod", "n", 128], 0], "source": "assume"}


def _scale(conditions_by_block: dict[int, list]) -> dict:
    """toy.scale with its bf16 variants (block 128 first, then 256) carrying the given conditions."""
    kernel = F.scale_kernel()
    kernel["variants"] = [v for v in kernel["variants"] if v["key"]["dtype"] == "bfloat16"]
    for v in kernel["variants"]:
        v["conditions"] = copy.deepcopy(conditions_by_block.get(v["key"]["block"], []))
    return F.manifest(**{"toy.scale": kernel})


def _args(m=4, n=256):
    return F.tensor((m, n), dtype="bfloat16"), F.tensor((m, n), dtype="bfloat16")


def test_first_variant_whose_conditions_hold_serves(make_registry, fake_gpu):
    reg = make_registry(_scale({128: [MOD_128]}))
    reg.launch("toy.scale", *_args(n=256), 1.0)
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_128"
    reg.launch("toy.scale", *_args(n=192), 1.0)  # 192 % 128 != 0: the next variant serves
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_256"
    reg.launch("toy.scale", *_args(n=384), 1.0)  # and the first again, from a fresh plan
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_128"


def test_no_variant_meets_conditions_names_them(make_registry, fake_gpu, rt):
    both = {128: [MOD_128], 256: [{"expr": ["le", "m", 8], "source": "declared"}]}
    reg = make_registry(_scale(both))
    with pytest.raises(rt.NoVariantError) as info:
        reg.launch("toy.scale", *_args(m=9, n=192), 1.0)
    msg = str(info.value)
    assert "n % 128 == 0 (n = 192 from x.shape[1]; the kernel's T.assume)" in msg
    assert "m <= 8 (m = 9 from x.shape[0]; declared)" in msg
    assert "toy.scale" in msg and "block" in msg
    assert not fake_gpu.launches
    reg.launch("toy.scale", *_args(m=9, n=256), 1.0)  # the refusal left nothing behind
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_128"


def test_refusal_repeats_and_never_launches(make_registry, fake_gpu, rt):
    reg = make_registry(_scale({128: [MOD_128], 256: [MOD_128]}))
    x, out = _args(n=200)
    for _ in range(3):  # a cached miss must not turn into a launch
        with pytest.raises(rt.NoVariantError, match="n % 128 == 0"):
            reg.launch("toy.scale", x, out, 1.0)
    assert not fake_gpu.launches


def test_prepare_checks_conditions(make_registry, fake_gpu, rt):
    reg = make_registry(_scale({128: [MOD_128], 256: [MOD_128]}))
    with pytest.raises(rt.NoVariantError, match="n % 128 == 0"):
        reg.prepare("toy.scale", *_args(n=64), 1.0)
    reg.prepare("toy.scale", *_args(n=128), 1.0)()
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_128"


def test_condition_on_a_scalar_is_checked_every_call(make_registry, fake_gpu, rt):
    positive = {"expr": ["gt", "alpha", 0], "source": "declared"}
    reg = make_registry(_scale({128: [positive], 256: [positive]}))
    x, out = _args()
    reg.launch("toy.scale", x, out, 2.0)
    assert F.unpack(fake_gpu.launches[-1]["args"][4], "<f") == 2.0
    with pytest.raises(rt.NoVariantError, match=r"alpha > 0 \(alpha = -1.0"):
        reg.launch("toy.scale", x, out, -1.0)  # same shapes, so the plan key must carry alpha's value
    assert len(fake_gpu.launches) == 1


def test_manifest_refuses_condition_on_unbound_symbol(make_registry, rt):
    bad = _scale({128: [{"expr": ["eq", "k", 1], "source": "assume"}]})
    reg = make_registry(bad)
    with pytest.raises(rt.ArtifactError, match="unbound symbols"):
        reg.spec("toy.scale")


def test_manifest_refuses_unknown_condition_source(make_registry, rt):
    reg = make_registry(_scale({128: [{"expr": ["eq", "n", 1], "source": "guess"}]}))
    with pytest.raises(rt.ArtifactError, match="condition source"):
        reg.spec("toy.scale")


# ----------------------------------------------------------------------------- optional tensors
def _bias_kernel(optional: bool = True, bias_shape=("n",)) -> dict:
    """toy.bias(x[m, n], bias[n] (optional), out[m, n])."""
    variant = {
        "key": {}, "cubin": "cubins/bias.cubin", "sha256": "0" * 64,
        "tensors": [
            {"name": "x", "dtype": "float32", "shape": ["m", "n"], "strides": ["n", 1]},
            {"name": "bias", "dtype": "float32", "shape": list(bias_shape), "strides": [1]},
            {"name": "out", "dtype": "float32", "shape": ["m", "n"], "strides": ["n", 1], "output": True},
        ],
        "scalars": [],
        "launches": [{"entry": "quant_a", "grid": ["m", 1, 1], "block": [128, 1, 1], "smem": 0,
                      "args": [{"kind": "ptr", "param": "x"}, {"kind": "ptr", "param": "bias"},
                               {"kind": "ptr", "param": "out"}]}],
    }
    params = [{"name": "x", "kind": "tensor", "rank": 2},
              {"name": "bias", "kind": "tensor", "rank": 1, "optional": optional},
              {"name": "out", "kind": "tensor", "rank": 2}]
    return F.manifest(**{"toy.bias": {"name": "toy.bias", "params": params, "variants": [variant]}})


def test_optional_tensor_none_is_a_null_pointer(make_registry, fake_gpu, rt):
    reg = make_registry(_bias_kernel())
    x, out, bias = F.tensor((4, 64)), F.tensor((4, 64)), F.tensor((64,))
    reg.launch("toy.bias", x, None, out)
    args = fake_gpu.launches[-1]["args"]
    assert F.unpack(args[1], "<Q") == 0 and F.unpack(args[0], "<Q") == x.ptr and F.unpack(args[2], "<Q") == out.ptr
    reg.launch("toy.bias", x, bias, out)
    assert F.unpack(fake_gpu.launches[-1]["args"][1], "<Q") == bias.ptr
    reg.launch("toy.bias", x, None, out)  # the cached None plan again
    assert F.unpack(fake_gpu.launches[-1]["args"][1], "<Q") == 0
    assert reg.spec("toy.bias").params[1].optional
    with pytest.raises(rt.ArgumentError, match="bias"):  # a present optional tensor is checked as any other
        reg.launch("toy.bias", x, F.tensor((63,)), out)


def test_required_tensor_refuses_none(make_registry, fake_gpu, rt):
    reg = make_registry(_bias_kernel(optional=False))
    with pytest.raises(rt.ArgumentError, match="bias"):
        reg.launch("toy.bias", F.tensor((4, 64)), None, F.tensor((4, 64)))
    reg2 = make_registry(_bias_kernel())
    with pytest.raises(rt.ArgumentError, match="'x'"):
        reg2.launch("toy.bias", None, None, F.tensor((4, 64)))
    assert not fake_gpu.launches


def test_optional_tensor_may_not_bind_sizes_alone(make_registry, rt):
    reg = make_registry(_bias_kernel(bias_shape=("k",)))
    with pytest.raises(rt.ArtifactError, match="optional tensor 'bias' alone binds the sizes"):
        reg.spec("toy.bias")
