"""runtime.prepare: validated once, re-launched exactly; the same errors as launch, raised at prepare."""

from __future__ import annotations

import struct

import pytest
import rt_fakes as F


def u64(raw):
    return struct.unpack_from("<Q", raw)[0]


def bf16(*shape, **kw):
    return F.tensor(shape, dtype="bfloat16", **kw)


def test_prepared_call_launches_what_launch_launches(make_registry, fake_gpu):
    reg = make_registry()
    x, out = bf16(300, 64), bf16(300, 64)
    reg.launch("toy.scale", x, out, 2.5)
    expected = fake_gpu.launches[-1]
    call = reg.prepare("toy.scale", x, out, 2.5)
    assert len(fake_gpu.launches) == 1  # prepare launches nothing
    for _ in range(3):
        call()
    assert len(fake_gpu.launches) == 4
    for ln in fake_gpu.launches[1:]:
        assert ln["dims"] == expected["dims"] and ln["args"] == expected["args"] and ln["stream"] == 0


def test_prepared_call_repatches_after_other_launches_share_its_plan(make_registry, fake_gpu):
    reg = make_registry()
    x, out = bf16(300, 64), bf16(300, 64)
    call = reg.prepare("toy.scale", x, out, 1.0)
    y, out2 = bf16(300, 64), bf16(300, 64)
    reg.launch("toy.scale", y, out2, 3.0)  # same signature: same plan, other pointers and scalar
    call(stream=0x55)
    a = fake_gpu.launches[-1]["args"]
    assert (u64(a[0]), u64(a[1])) == (x.ptr, out.ptr)
    assert struct.unpack_from("<f", a[4])[0] == 1.0 and fake_gpu.launches[-1]["stream"] == 0x55


def test_prepare_raises_what_launch_raises(make_registry, fake_gpu, rt):
    reg = make_registry()
    with pytest.raises(rt.NoVariantError):
        reg.prepare("toy.scale", F.tensor((300, 64), dtype="float32"), F.tensor((300, 64), dtype="float32"), 1.0)
    with pytest.raises(rt.ArgumentError, match="align"):
        reg.prepare("toy.scale", bf16(300, 64, ptr=0x7F0000000002), bf16(300, 64), 1.0)
    x = bf16(300, 64)
    with pytest.raises(rt.ArgumentError):
        reg.prepare("toy.scale", x, F.FakeTensor((300, 64), dtype="bfloat16", ptr=x.ptr + 64), 1.0)  # overlap
    with pytest.raises(rt.NoVariantError):
        reg.prepare("toy.nope")
    assert fake_gpu.launches == []


def test_prepared_empty_problem_launches_nothing(make_registry, fake_gpu):
    call = make_registry().prepare("toy.scale", bf16(0, 64), bf16(0, 64), 1.0)
    call()
    assert fake_gpu.launches == []


def test_module_level_prepare_uses_the_default_registry(rt, monkeypatch, tmp_path, fake_gpu):
    folder = F.write_artifacts(tmp_path / "a", F.standard_manifest())
    monkeypatch.setenv("TILEBIN_ARTIFACTS_DIR", str(folder))
    from tilebin.runtime import _registry

    monkeypatch.setattr(_registry, "_DEFAULT", [None])
    monkeypatch.setattr(rt, "_DEFAULT", _registry._DEFAULT)
    call = rt.prepare("toy.scale", bf16(300, 64), bf16(300, 64), 1.0)
    assert isinstance(call, rt.PreparedCall)
    call()
    assert len(fake_gpu.launches) == 1
