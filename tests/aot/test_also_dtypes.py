"""``KernelDecl.also_dtypes``: a tensor parameter that also takes other dtypes of its item size (as
their bits) is declared, checked at the build and written into the manifest's tensor facts."""

from __future__ import annotations

import pytest


def _decl(**kw):
    from tilebin.kernels import KernelDecl

    return KernelDecl("toy.k", lambda **_: None, ({"block": 64},), **kw)


@pytest.mark.parametrize("also, needle", [
    (("x",), "must be a dict"),
    ({"x": ()}, "tuple of dtype names"),
    ({"x": (1,)}, "tuple of dtype names"),
    ({1: ("float32",)}, "tuple of dtype names"),
])
def test_also_dtypes_mistakes_are_declaration_errors(also, needle):
    from tilebin.kernels._declare import DeclarationError

    with pytest.raises(DeclarationError, match=needle):
        _decl(also_dtypes=also)


def test_also_dtypes_is_frozen_and_a_single_name_is_a_tuple():
    decl = _decl(also_dtypes={"x": "float32", "y": ["uint8", "uint8"]})
    assert dict(decl.also_dtypes) == {"x": ("float32",), "y": ("uint8",)}
    with pytest.raises(TypeError):
        decl.also_dtypes["z"] = ("int8",)


def test_the_build_checks_item_sizes_and_names_and_writes_the_facts():
    pytest.importorskip("tilelang")
    from tilebin.aot import AotError
    from tilebin.aot._facts import _with_also_dtypes
    from tilebin.runtime._manifest import TensorSpec

    tensors = (TensorSpec("x_sf", "int32", ("m",), (1,)), TensorSpec("x", "int8", ("m",), (1,)))
    out = _with_also_dtypes(tensors, {"x_sf": ("float32", "int32"), "x": ("uint8",)}, "toy.k {}")
    assert [t.also_dtypes for t in out] == [("float32",), ("uint8",)]  # its own dtype is not repeated
    assert _with_also_dtypes(tensors, {}, "toy.k {}") == tensors
    with pytest.raises(AotError, match=r"lets 'x_sf' \(int32\) take 'bfloat16', whose item size differs.*float32"):
        _with_also_dtypes(tensors, {"x_sf": ("bfloat16",)}, "toy.k {}")
    with pytest.raises(AotError, match="item size differs"):
        _with_also_dtypes(tensors, {"x": ("float4",)}, "toy.k {}")
    with pytest.raises(AotError, match=r"names \['y'\], which are not tensor parameters of the kernel \(x_sf, x\)"):
        _with_also_dtypes(tensors, {"y": ("float32",)}, "toy.k {}")


def test_the_lossless_cast_declares_the_users_dtypes():
    from tilebin.kernels.quant.per_block_cast_lossless import KERNELS

    assert dict(KERNELS[0].also_dtypes) == {"x": ("uint8",), "x_sf": ("float32",), "out_sf": ("float32",)}
