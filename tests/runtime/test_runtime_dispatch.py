"""Variant dispatch and argument binding: which variant a call gets, and what a refusal says.

Every launch here goes to the fake driver (``fake_gpu``): nothing can reach a real GPU.
"""

from __future__ import annotations

import pytest
import rt_fakes as F


def _scale_args(dtype="bfloat16", m=100, n=64):
    return F.tensor((m, n), dtype=dtype), F.tensor((m, n), dtype=dtype)


def test_first_matching_variant_wins(make_registry, fake_gpu):
    reg = make_registry()
    reg.launch("toy.scale", *_scale_args(), 1.0)
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_128"  # not the later bf16/256 variant
    reg.launch("toy.scale", *_scale_args("float16"), 1.0)
    assert fake_gpu.launches[-1]["fn"] == "scale_float16_128"


def test_key_keyword_pins_variant(make_registry, fake_gpu):
    reg = make_registry()
    reg.launch("toy.scale", *_scale_args(), 1.0, block=256)
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_256"
    assert fake_gpu.launches[-1]["dims"] == ((1, 1, 1), (256, 1, 1))
    reg.launch("toy.scale", *_scale_args(), alpha=1.0, dtype="bfloat16", block=128)
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_128"


def test_torch_dtype_as_key_value(make_registry, fake_gpu):
    torch = pytest.importorskip("torch")
    reg = make_registry()
    reg.launch("toy.scale", *_scale_args("float16"), 1.0, dtype=torch.float16)
    assert fake_gpu.launches[-1]["fn"] == "scale_float16_128"


def test_pinned_key_mismatch(make_registry, fake_gpu, rt):
    reg = make_registry()
    with pytest.raises(rt.NoVariantError) as info:
        reg.launch("toy.scale", *_scale_args(), 1.0, dtype="float16")
    msg = str(info.value)
    assert "toy.scale" in msg and "dtype='float16'" in msg and "dtype='bfloat16'" in msg
    with pytest.raises(rt.NoVariantError, match="block=128"):
        reg.launch("toy.scale", *_scale_args(), 1.0, block=512)
    assert not fake_gpu.launches


def test_unsupported_dtype_lists_served_dtypes(make_registry, fake_gpu, rt):
    reg = make_registry()
    with pytest.raises(rt.NoVariantError) as info:
        reg.launch("toy.scale", *_scale_args("float32", m=4, n=8), 1.0)
    msg = str(info.value)
    for part in ("toy.scale", "x: float32[4, 8]", "out: float32[4, 8]", "bfloat16 / float16",
                 "{dtype='bfloat16', block=128}", "{dtype='float16', block=128}", "{dtype='bfloat16', block=256}"):
        assert part in msg, (part, msg)


def test_mixed_dtypes_no_variant(make_registry, fake_gpu, rt):
    reg = make_registry()
    x, _ = _scale_args("bfloat16")
    _, out = _scale_args("float16")
    with pytest.raises(rt.NoVariantError, match="out: bfloat16"):
        reg.launch("toy.scale", x, out, 1.0)


def test_static_dim_mismatch_lists_nearest_first(make_registry, fake_gpu, rt):
    reg = make_registry()
    a, b, c = (F.tensor(s, dtype="bfloat16") for s in ((16, 2048), (1024, 2048), (16, 1024)))
    with pytest.raises(rt.NoVariantError) as info:
        reg.launch("toy.gemm", a, b, c)
    msg = str(info.value)
    first, second = msg.index("{n=1024, k=1024}"), msg.index("{n=4096, k=7168}")
    assert first < second, msg  # (1024, 1024) differs in k only: nearer
    assert "a.shape[1] == 1024" in msg and "c.shape[1] == 4096" in msg


def test_unknown_kernel_suggests_close_names(make_registry, rt):
    reg = make_registry()
    with pytest.raises(rt.NoVariantError, match=r"unknown kernel 'toy.scal'; did you mean 'toy.scale'"):
        reg.launch("toy.scal", *_scale_args(), 1.0)
    with pytest.raises(rt.NoVariantError, match="known kernels: toy.gemm, toy.quant, toy.scale"):
        reg.launch("zzz", 1)


def test_unknown_keyword_names_valid_ones(make_registry, rt):
    reg = make_registry()
    with pytest.raises(rt.ArgumentError) as info:
        reg.launch("toy.scale", *_scale_args(), 1.0, blok=128)
    msg = str(info.value)
    assert "'blok'" in msg and "did you mean 'block'" in msg
    assert "scalar parameters: alpha" in msg and "compile-time keys: dtype, block" in msg


def test_wrong_argument_count(make_registry, rt):
    reg = make_registry()
    x, out = _scale_args()
    with pytest.raises(rt.ArgumentError, match=r"takes 3 positional argument\(s\) \(x, out, alpha\), got 4"):
        reg.launch("toy.scale", x, out, 1.0, 2.0)
    with pytest.raises(rt.ArgumentError, match=r"missing argument\(s\) alpha"):
        reg.launch("toy.scale", x, out)
    with pytest.raises(rt.ArgumentError, match="both by position and by keyword"):
        reg.launch("toy.scale", x, out, 1.0, alpha=2.0)


def test_wrong_argument_kind(make_registry, fake_gpu, rt):
    reg = make_registry()
    x, out = _scale_args()
    with pytest.raises(rt.ArgumentError, match=r"parameter 'out': expected a CUDA tensor .* got float"):
        reg.launch("toy.scale", x, 1.0, 1.0)
    with pytest.raises(rt.ArgumentError, match="'alpha' is a scalar; got a tensor"):
        reg.launch("toy.scale", x, out, F.tensor((1,), dtype="float32"))
    with pytest.raises(rt.ArgumentError, match="expected a Python float"):
        reg.launch("toy.scale", x, out, "1.0")
    with pytest.raises(rt.NoVariantError, match=r"(?s)with block='\[128\]'.*needs block=128"):  # keyed by its repr
        reg.launch("toy.scale", x, out, 1.0, block=[128])
    assert not fake_gpu.launches


def test_config_object_key_matches_its_repr(make_registry, fake_gpu):
    """``KernelDecl.from_jit`` keys a config-object variant value by its repr; passing the object
    itself as the key keyword picks that variant."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Tile:
        block: int

    kernel = F.scale_kernel()
    for v in kernel["variants"]:
        v["key"]["block"] = repr(Tile(v["key"]["block"]))
    reg = make_registry(F.manifest(**{"toy.scale": kernel}))
    reg.launch("toy.scale", *_scale_args(), 1.0, block=Tile(256))
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_256"


def test_also_dtypes_take_other_dtypes_of_the_item_size(make_registry, fake_gpu, rt):
    """``also_dtypes`` (KernelDecl.also_dtypes): a float16 tensor fits the bf16 variant's ``x`` as its
    bits, the variant's own dtype still does, and a dtype it does not list is refused, naming both."""
    data = F.standard_manifest()
    for v in data["kernels"]["toy.scale"]["variants"]:
        if v["key"]["dtype"] == "bfloat16":
            v["tensors"][0]["also_dtypes"] = ["float16"]
    data["kernels"]["toy.scale"]["variants"] = [v for v in data["kernels"]["toy.scale"]["variants"]
                                                if v["key"]["dtype"] == "bfloat16"]
    reg = make_registry(data)
    reg.launch("toy.scale", F.tensor((4, 8), dtype="float16"), F.tensor((4, 8), dtype="bfloat16"), 1.0)
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_128"
    reg.launch("toy.scale", *_scale_args(m=4, n=8), 1.0)
    assert fake_gpu.launches[-1]["fn"] == "scale_bfloat16_128"
    with pytest.raises(rt.NoVariantError) as info:
        reg.launch("toy.scale", F.tensor((4, 8), dtype="float32"), F.tensor((4, 8), dtype="bfloat16"), 1.0)
    assert "x: bfloat16 / float16" in str(info.value)
    with pytest.raises(rt.NoVariantError, match=r"out: bfloat16\.\n"):  # only x takes float16
        reg.launch("toy.scale", F.tensor((4, 8), dtype="bfloat16"), F.tensor((4, 8), dtype="float16"), 1.0)
    assert reg.spec("toy.scale").variants[0].tensors[0].also_dtypes == ("float16",)
