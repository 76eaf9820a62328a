"""Driver-facing pieces that can be judged without a GPU: no-driver errors, device support checks,
``check()``, cubin integrity and per-device module loading (against a fake driver)."""

from __future__ import annotations

import hashlib
import sys

import pytest
import rt_fakes as F

from tilebin.runtime import _driver, _loader
from tilebin.runtime._manifest import parse_manifest
from tilebin.runtime._tensors import key_text


def _real_driver_works() -> bool:
    try:
        from cuda.bindings import driver

        return not driver.cuInit(0)[0]
    except Exception:
        return False


def _valid_call(reg):
    reg.launch("toy.scale", F.tensor((100, 64), dtype="bfloat16"), F.tensor((100, 64), dtype="bfloat16"), 1.0)


@pytest.mark.skipif(_real_driver_works(), reason="a CUDA driver is present: the no-driver path cannot be seen here")
def test_no_driver_on_this_machine(make_registry, rt, monkeypatch):
    monkeypatch.setattr(_driver, "_STATE", {})
    with pytest.raises(rt.DeviceError) as info:
        _valid_call(make_registry())
    msg = str(info.value)
    assert "no NVIDIA driver found" in msg and "driver >= 580" in msg and "CUDA 13.0" in msg, msg


def test_no_driver_simulated_cuinit_failure(make_registry, rt, monkeypatch):
    from cuda.bindings import driver

    class DynamicLibNotFoundError(RuntimeError):
        pass

    def cuinit(flags):
        raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via system search')

    monkeypatch.setattr(_driver, "_STATE", {})
    monkeypatch.setenv("TILEBIN_DRIVER", "cuda-python")  # the bindings' cuInit, not the ctypes one
    monkeypatch.setattr(driver, "cuInit", cuinit)
    with pytest.raises(rt.DeviceError, match=r"no NVIDIA driver found \(DynamicLibNotFoundError: .*driver >= 580"):
        _valid_call(make_registry())


def test_no_cuda_python(make_registry, rt, monkeypatch):
    import cuda.bindings

    monkeypatch.setattr(_driver, "_STATE", {})
    monkeypatch.setenv("TILEBIN_DRIVER", "cuda-python")  # else the ctypes driver serves where libcuda.so.1 opens
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", None)
    monkeypatch.delattr(cuda.bindings, "driver", raising=False)
    with pytest.raises(rt.DeviceError, match="no NVIDIA driver found .cannot import cuda.bindings.driver"):
        _valid_call(make_registry())


def _info(cc=(9, 0), name="NVIDIA H200", version=13000, optin=232448):
    return _driver.DeviceInfo(0, 0, name, cc, None, 1, optin, version)


def test_wrong_architecture(rt):
    with pytest.raises(rt.DeviceError) as info:
        _driver._check_support(_info(cc=(8, 0), name="NVIDIA A100-SXM4-80GB"), "sm_90a", 13000)
    msg = str(info.value)
    for part in ("NVIDIA A100-SXM4-80GB", "compute capability 8.0", "sm_90a", "H100/H200/H20/H800"):
        assert part in msg, (part, msg)
    with pytest.raises(rt.DeviceError, match="compute capability 10.0"):
        _driver._check_support(_info(cc=(10, 0), name="NVIDIA B200"), "sm_90a", 13000)
    _driver._check_support(_info(), "sm_90a", 13000)


def test_driver_too_old(rt):
    with pytest.raises(rt.DeviceError) as info:
        _driver._check_support(_info(version=12080), "sm_90a", 13000)
    msg = str(info.value)
    assert "supports CUDA 12.8" in msg and "need CUDA 13.0" in msg
    assert "upgrade the NVIDIA driver to >= 580 for CUDA 13 cubins" in msg


def test_required_cc(rt):
    assert _driver.required_cc("sm_90a") == ((9, 0), True)
    assert _driver.required_cc("sm_100") == ((10, 0), False)
    with pytest.raises(rt.DeviceError, match="expected like 'sm_90a'"):
        _driver.required_cc("hopper")


def test_check_names_the_result(rt):
    from cuda.bindings import driver

    ok = driver.CUresult.CUDA_SUCCESS
    assert _driver.check((ok,), "x") is None
    assert _driver.check((ok, 5), "x") == 5
    assert _driver.check((ok, 5, 6), "x") == (5, 6)
    with pytest.raises(rt.DeviceError) as info:
        _driver.check((driver.CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU,), "cuModuleLoadData", "kernel 'k' variant {}")
    msg = str(info.value)
    assert "cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU" in msg
    assert "kernel 'k' variant {}" in msg and "built for sm_90a" in msg


def test_dynamic_smem_above_device_limit(rt):
    fn = _loader.LoadedFunction("f", static_smem=1024)
    with pytest.raises(rt.DeviceError) as info:
        _loader.Loader(None)._opt_in(fn, 232000, _info(), "kernel 'k' variant {}")
    msg = str(info.value)
    assert "232000 bytes of dynamic + 1024 static" in msg and "at most 232448" in msg


# ---------------------------------------------------------------- cubins
def test_verify_cubin(rt):
    data = b"\x7fELF fake cubin"
    _loader.verify_cubin(data, hashlib.sha256(data).hexdigest(), kernel="k", key="{}", path="c.cubin")
    with pytest.raises(rt.ArtifactError) as info:
        _loader.verify_cubin(data, "ab" * 32, kernel="toy.scale", key="{dtype='bfloat16'}", path="cubins/x.cubin")
    msg = str(info.value)
    for part in ("toy.scale", "{dtype='bfloat16'}", "cubins/x.cubin", "ab" * 32, hashlib.sha256(data).hexdigest(),
                 "reinstall the wheel"):
        assert part in msg, (part, msg)


@pytest.mark.parametrize("bad", ["../x.cubin", "/etc/x.cubin", "a/../../x", "", "c:/x"])
def test_cubin_path_stays_inside(rt, tmp_path, bad):
    with pytest.raises(rt.ArtifactError, match="must be relative"):
        _loader.cubin_path(tmp_path, bad, "k")


def _artifacts_with_cubins(tmp_path, corrupt=False):
    data = F.manifest(**{"toy.scale": F.scale_kernel()})
    for v in data["kernels"]["toy.scale"]["variants"]:
        blob = f"cubin for {v['cubin']}".encode()
        v["sha256"] = hashlib.sha256(blob).hexdigest()
        path = tmp_path / "artifacts" / v["cubin"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob + (b"!" if corrupt else b""))
    return F.write_artifacts(tmp_path / "artifacts", data)


@pytest.fixture
def real_loader_fake_driver(fake_gpu, monkeypatch):
    """fake_gpu, but with the real Loader.function (module loading goes to the fake driver)."""
    from tilebin.runtime import _launcher

    hot = _launcher._HOT[:]
    monkeypatch.undo()
    from cuda.bindings import driver as real

    monkeypatch.setattr(_launcher, "_HOT", hot)
    monkeypatch.setattr(_driver, "_STATE", {"driver": fake_gpu, "mod": fake_gpu, "bindings": fake_gpu, "version": 13000})
    info = _driver.DeviceInfo(0, 0, "NVIDIA H200 (fake)", (9, 0), real.CUcontext(0x1234), 0x1234, 232448, 13000)
    monkeypatch.setattr(_driver, "_DEVICES", {0: info})
    monkeypatch.setattr(_driver, "_SUPPORTED", set())
    monkeypatch.setattr(_driver.THREAD, "dev", None, raising=False)
    return fake_gpu


def test_modules_load_once_per_cubin(rt, tmp_path, real_loader_fake_driver):
    fake = real_loader_fake_driver
    reg = rt.Registry(_artifacts_with_cubins(tmp_path))
    for m in (10, 20, 30):
        _scale = (F.tensor((m, 64), dtype="bfloat16"), F.tensor((m, 64), dtype="bfloat16"), 1.0)
        reg.launch("toy.scale", *_scale)
    reg.launch("toy.scale", F.tensor((5, 64), dtype="float16"), F.tensor((5, 64), dtype="float16"), 1.0)
    assert [b[:9] for b in fake.loaded] == [b"cubin for"] * 2  # bf16/128 once, f16/128 once
    assert getattr(fake, "smem_set", []) == []  # no launch asks for more than 48 KiB
    assert [ln["fn"] for ln in fake.launches] == ["scale_bfloat16_128"] * 3 + ["scale_float16_128"]


def test_corrupt_cubin_refused_before_loading(rt, tmp_path, real_loader_fake_driver):
    reg = rt.Registry(_artifacts_with_cubins(tmp_path, corrupt=True))
    with pytest.raises(rt.ArtifactError, match="fails its checksum"):
        _valid_call(reg)
    assert not getattr(real_loader_fake_driver, "loaded", [])


def test_missing_cubin(rt, tmp_path, real_loader_fake_driver):
    folder = _artifacts_with_cubins(tmp_path)
    (folder / "cubins" / "scale_bfloat16_128.cubin").unlink()
    with pytest.raises(rt.ArtifactError, match="cannot read cubin cubins/scale_bfloat16_128.cubin"):
        _valid_call(rt.Registry(folder))


def test_large_smem_opts_in_once(rt, tmp_path, real_loader_fake_driver, monkeypatch):
    data = F.manifest(**{"toy.gemm": F.gemm_kernel()})
    blob = b"gemm cubin"
    for v in data["kernels"]["toy.gemm"]["variants"]:
        v["sha256"] = hashlib.sha256(blob).hexdigest()
        (tmp_path / "artifacts" / "cubins").mkdir(parents=True, exist_ok=True)
        (tmp_path / "artifacts" / v["cubin"]).write_bytes(blob)
    reg = rt.Registry(F.write_artifacts(tmp_path / "artifacts", data))
    from tilebin.runtime import _tma

    monkeypatch.setattr(_tma, "_STATE", {"raw": lambda *a: 0})  # a fake encoder: leaves the descriptor
    for m in (64, 128):
        bf = [F.tensor(s, dtype="bfloat16") for s in ((m, 1024), (1024, 1024), (m, 1024))]
        reg.launch("toy.gemm", *bf)
    attr = int(real_loader_fake_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
    assert real_loader_fake_driver.smem_set == [("gemm_1024_1024", attr, 98304)]


def test_manifest_variant_text():
    v = parse_manifest(F.manifest(**{"toy.scale": F.scale_kernel()})).kernels["toy.scale"].variants[0]
    assert key_text(v.key) == "{dtype='bfloat16', block=128}"


def test_unsupported_device_refused_every_time(make_registry, fake_gpu, rt, monkeypatch):
    from cuda.bindings import driver as real

    a100 = _driver.DeviceInfo(0, 0, "NVIDIA A100", (8, 0), real.CUcontext(0x1234), 0x1234, 166912, 13000)
    monkeypatch.setattr(_driver, "_DEVICES", {0: a100})
    reg = make_registry()
    for _ in range(2):
        with pytest.raises(rt.DeviceError, match="NVIDIA A100 of compute capability 8.0"):
            _valid_call(reg)
    assert not fake_gpu.launches
