"""What a new user meets first: error classes under their public module, an unknown kernel name
answered with close names and how to list kernels, a CPU tensor answered with the fix, and
``kernel_names()`` listing production kernels only."""

from __future__ import annotations

import pickle
import traceback

import pytest
import rt_fakes as F

PUBLIC_ERRORS = ("TilebinError", "ArgumentError", "NoVariantError", "UnknownKernelError", "ArtifactError",
                 "DeviceError")


def test_every_public_error_class_reports_the_public_module(rt):
    exported = [n for n in rt.__all__ if isinstance(getattr(rt, n), type)
                and issubclass(getattr(rt, n), BaseException)]
    assert sorted(exported) == sorted(PUBLIC_ERRORS)
    for name in PUBLIC_ERRORS:
        cls = getattr(rt, name)
        assert (cls.__module__, cls.__qualname__, cls.__name__) == ("tilebin.runtime", name, name)
        assert issubclass(cls, rt.TilebinError)


def test_tracebacks_and_pickles_show_the_public_path(rt):
    try:
        raise rt.ArgumentError("x: wrong")
    except rt.ArgumentError as exc:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    assert "tilebin.runtime.ArgumentError: x: wrong" in text and "_errors" not in text.splitlines()[-1]
    err = rt.UnknownKernelError("unknown kernel 'a.b'", name="a.b", close=("a.c",))
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is rt.UnknownKernelError and (str(back), back.name, back.close) == (str(err), "a.b", ("a.c",))


def test_unknown_kernel_is_a_typed_error_with_close_names(make_registry, rt):
    reg = make_registry()
    for call in (lambda: reg.launch("toy.scal", F.tensor((4, 64)), F.tensor((4, 64)), 1.0),
                 lambda: reg.spec("toy.scal"), lambda: reg.prepare("toy.scal"),
                 lambda: reg.unchecked_launcher("toy.scal", dtype="bfloat16")):
        with pytest.raises(rt.UnknownKernelError) as info:
            call()
        err = info.value
        assert isinstance(err, rt.NoVariantError) and isinstance(err, rt.ArgumentError)
        assert (err.name, err.close[0]) == ("toy.scal", "toy.scale")
        text = str(err)
        assert text.startswith("unknown kernel 'toy.scal'; did you mean 'toy.scale'")
        assert "runtime.kernel_names()" in text and "python -m tilebin list" in text


def test_unknown_kernel_without_close_names(make_registry, rt):
    with pytest.raises(rt.UnknownKernelError) as info:
        make_registry().spec("nope")
    assert info.value.close == () and "did you mean" not in str(info.value)
    assert "'nope'" in str(info.value) and "runtime.kernel_names()" in str(info.value)


def test_wrong_variant_is_not_an_unknown_kernel(make_registry, rt):
    with pytest.raises(rt.NoVariantError) as info:
        make_registry().unchecked_launcher("toy.scale", dtype="int8", block=128)
    assert not isinstance(info.value, rt.UnknownKernelError)


@pytest.fixture
def default_registry(make_registry, monkeypatch, rt):
    """A fake registry installed as the default one (the list ``launch`` and ``kernel_names`` read)."""
    from tilebin.runtime import _registry

    data = F.manifest(**{"toy.scale": F.scale_kernel(), "testing.coop": F.quant_kernel(),
                         "testing.gemm_nt": F.gemm_kernel()})
    reg = make_registry(data)
    cell = [reg]
    monkeypatch.setattr(_registry, "_DEFAULT", cell)
    monkeypatch.setattr(rt, "_DEFAULT", cell)
    return reg


def test_runtime_launch_and_spec_raise_it(default_registry, rt):
    with pytest.raises(rt.UnknownKernelError, match="did you mean 'toy.scale'"):
        rt.launch("toy.scael", F.tensor((4, 64)), F.tensor((4, 64)), 1.0)
    with pytest.raises(rt.UnknownKernelError, match="unknown kernel 'nope.x'"):
        rt.spec("nope.x")


def test_the_compiled_front_hands_unknown_names_to_python(default_registry, hot_module, rt):
    front = hot_module.Front(rt._DEFAULT, rt._launch_python)
    assert rt._DEFAULT[0] is default_registry
    for kwargs in ({}, {"stream": 0}):
        with pytest.raises(rt.UnknownKernelError, match="unknown kernel 'toy.scael'; did you mean 'toy.scale'"):
            front("toy.scael", F.tensor((4, 64)), F.tensor((4, 64)), 1.0, **kwargs)


def test_kernel_names_lists_production_kernels_only(default_registry, rt):
    assert default_registry.kernel_names() == ["toy.scale"]
    assert default_registry.kernel_names(internal=True) == ["testing.coop", "testing.gemm_nt", "toy.scale"]
    assert rt.kernel_names() == ["toy.scale"]
    assert rt.kernel_names(internal=True) == ["testing.coop", "testing.gemm_nt", "toy.scale"]
    assert rt.spec("testing.coop").name == "testing.coop"  # hidden, still there by name


@pytest.mark.parametrize("name, internal", [
    ("testing.coop_sum", True), ("testing.pdl_chain", True), ("testing.gemm_nt", True), ("_x.y", True),
    ("moe.topk_gate", False), ("quant.per_token_cast", False), ("mhc.sinkhorn_fwd", False),
    ("transpose.batched_transpose", False), ("gemm.gemm_nt", False), ("gemmx.y", False), ("quant._private", True),
])
def test_is_internal(rt, name, internal):
    assert rt.is_internal(name) is internal


def test_cpu_tensor_message_names_the_cpu_and_the_fix(make_registry, rt):
    torch = pytest.importorskip("torch")
    reg = make_registry()
    x = torch.zeros(100, 64, dtype=torch.bfloat16)
    with pytest.raises(rt.ArgumentError) as info:
        reg.launch("toy.scale", x, torch.zeros(100, 64, dtype=torch.bfloat16), 1.0)
    text = str(info.value)
    assert "parameter 'x' is a tensor on the CPU" in text and "x.cuda()" in text, text
    assert "in cpu" not in text
    with pytest.raises(rt.ArgumentError, match="'x' is a tensor on device 'meta'"):
        reg.launch("toy.scale", torch.empty(100, 64, dtype=torch.bfloat16, device="meta"), x, 1.0)
