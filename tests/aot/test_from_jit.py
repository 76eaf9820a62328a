"""KernelDecl.from_jit: a @tilelang.jit kernel (config-object arguments, pass configs, compile flags,
out_idx) built to a cubin here, and a jit object given as factory= refused at declaration time."""

from __future__ import annotations

import pathlib
import sys

import pytest

pytest.importorskip("tilelang")

from tilebin.aot import BuildOptions, KernelDecl, build  # noqa: E402
from tilebin.kernels._declare import DeclarationError  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def toy():
    sys.path.insert(0, str(HERE))
    import toy_jit_kernels

    yield toy_jit_kernels
    sys.path.remove(str(HERE))


def test_declaration_carries_the_jits_pass_configs_flags_and_out_idx(toy):
    decl = toy.KERNELS[0]
    assert dict(decl.pass_configs) == {"tl.disable_warp_specialized": True,
                                       "tl.device_compile_flags": ["-DTILEBIN_TOY_FLAG=1"]}
    assert decl.outputs == (-1,)
    assert [dict(v) for v in decl.grid] == [
        {"cfg": "ScaleConfig(block=128, factor=2.0)", "dtype": "float32"},
        {"cfg": "ScaleConfig(block=64, factor=0.5)", "dtype": "float16"},
    ]
    override = KernelDecl.from_jit("toy.o", toy.jit_scale, grid=({"dtype": "float32", "cfg": toy.ScaleConfig()},),
                                   outputs=("Y",), pass_configs={"tl.disable_warp_specialized": False})
    assert override.outputs == ("Y",) and override.pass_configs["tl.disable_warp_specialized"] is False
    also = KernelDecl.from_jit("toy.a", toy.jit_scale, grid=({"dtype": "float32", "cfg": toy.ScaleConfig()},),
                               also_dtypes={"X": ("int32",)})
    assert dict(also.also_dtypes) == {"X": ("int32",)} and dict(override.also_dtypes) == {}


def test_from_jit_builds_a_cubin_and_the_manifest(toy, tmp_path):
    m = build(["toy_jit_kernels"], BuildOptions(out_dir=tmp_path, jobs=1), log=lambda *_: None)
    k = m.kernels["toy.jit_scale"]
    assert [p.name for p in k.params] == ["X", "Y"]
    assert k.doc == "Y = X * cfg.factor" and dict(k.meta) == {"blocks": (128, 64)}
    first, second = k.variants
    assert dict(first.key) == {"cfg": "ScaleConfig(block=128, factor=2.0)", "dtype": "float32"}
    assert dict(second.key)["dtype"] == "float16"
    assert [t.output for t in first.tensors] == [False, True]  # out_idx=[-1] is Y
    assert [t.dtype for t in second.tensors] == ["float16", "float16"]
    assert first.launches[0].block == (128, 1, 1) and second.launches[0].block == (64, 1, 1)
    for v in k.variants:
        assert (tmp_path / v.cubin).stat().st_size > 0
    (eager,) = m.kernels["toy.jit_add_one"].variants  # eager style: TileLang traces it from the annotations
    assert [(t.name, t.shape, t.output) for t in eager.tensors] == [("X", ("n",), False), ("Y", ("n",), True)]
    assert eager.launches[0].block == (256, 1, 1)


def test_a_jit_object_as_factory_is_refused_at_declaration(toy):
    with pytest.raises(DeclarationError, match=r"KernelDecl.from_jit\('toy.x', jit_fn, grid=...\)") as info:
        KernelDecl("toy.x", toy.jit_scale, ({"dtype": "float32"},))
    assert "Mismatched type" not in str(info.value)
    assert not toy.jit_scale._kernel_cache  # nothing was JIT-compiled


def test_from_jit_refuses_what_is_not_a_jit_and_unstable_config_reprs(toy):
    with pytest.raises(DeclarationError, match="from_jit takes a @tilelang.jit"):
        KernelDecl.from_jit("toy.y", lambda dtype: None, grid=({"dtype": "float32"},))

    class Opaque:  # hashable, but its repr names a memory address
        pass

    with pytest.raises(DeclarationError, match="memory address"):
        KernelDecl.from_jit("toy.y", toy.jit_scale, grid=({"dtype": "float32", "cfg": Opaque()},))
    with pytest.raises(DeclarationError, match="hashable"):
        KernelDecl.from_jit("toy.y", toy.jit_scale, grid=({"dtype": "float32", "cfg": bytearray(b"x")},))
    cfg = toy.ScaleConfig()
    with pytest.raises(DeclarationError, match="both a str value and the repr"):
        KernelDecl.from_jit("toy.y", toy.jit_scale, grid=({"dtype": "float32", "cfg": cfg},
                                                          {"dtype": "float16", "cfg": repr(cfg)}))
    with pytest.raises(DeclarationError, match="same variant twice"):
        KernelDecl.from_jit("toy.y", toy.jit_scale, grid=({"dtype": "float32", "cfg": cfg},) * 2)


def test_the_factory_gives_the_config_object_back_to_the_jit(toy, monkeypatch):
    seen = {}
    monkeypatch.setattr(toy.jit_scale, "get_tir", lambda **kw: seen.update(kw) or "tir")
    decl = toy.KERNELS[0]
    assert decl.factory(**decl.grid[1]) == "tir"
    assert seen == {"dtype": "float16", "cfg": toy.ScaleConfig(block=64, factor=0.5)}


def test_decl_site_names_the_jit_function(toy):
    from tilebin.aot._lower import decl_site

    decl = toy.KERNELS[0]
    lines = (HERE / "toy_jit_kernels.py").read_text().splitlines()
    decorator = next(i for i, text in enumerate(lines, 1) if text.startswith("@tilelang.jit(out_idx"))
    assert decl_site(decl, "toy_jit_kernels") == f"{HERE / 'toy_jit_kernels.py'}:{decorator}"


def _annotated(block=128):
    import tilelang.language as T

    N = T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        T.annotate_pass_configs({"tl.disable_warp_specialized": True, "tl.enable_fast_math": False})
        T.annotate_compile_flags(["-DTILEBIN_TOY_FLAG=2"])
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for i in T.Parallel(block):
                if bx * block + i < N:
                    Y[bx * block + i] = X[bx * block + i]
    return main


def test_a_prim_funcs_own_pass_configs_and_flags_apply_under_the_declared_ones():
    """What T.annotate_pass_configs / T.annotate_compile_flags put on the PrimFunc is lowered with,
    as tilelang.compile does; the declaration's pass configs win."""
    from tvm.target import Target

    from tilebin.aot._lower import output_names, pass_configs

    with Target({"kind": "cuda", "arch": "sm_90a"}):
        func = _annotated()
    assert pass_configs(func, {"tl.enable_fast_math": True}) == {
        "tl.disable_warp_specialized": True, "tl.enable_fast_math": True, "tl.device_compile_flags": ["-DTILEBIN_TOY_FLAG=2"]}
    assert output_names(func, ("X", -1, 0), "k") == ("X", "Y", "X")
    from tilebin.aot import AotError

    with pytest.raises(AotError, match="output position 2 is out of range: the kernel has 2 parameters"):
        output_names(func, (2,), "k")


def test_a_jit_with_its_own_target_is_traced_for_sm_90a(toy):
    """@tilelang.jit(target="cuda") would trace under sm_50 on a machine without a GPU; the build's
    sm_90a target is what the factory sees, as lowering does."""
    import tilelang
    import tilelang.language as T
    from tvm.target import Target

    seen = []

    def body(block: int = 128):
        seen.append(str(Target.current().attrs["arch"]))
        N = T.dynamic("n")

        @T.prim_func
        def main(X: T.Tensor((N,), "float32")):
            with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
                for i in T.Parallel(block):
                    if bx * block + i < N:
                        X[bx * block + i] = 0.0
        return main

    decl = KernelDecl.from_jit("toy.targeted", tilelang.jit(target="cuda")(body), grid=({"block": 128},))
    with Target({"kind": "cuda", "arch": "sm_90a"}):
        func = decl.factory(**decl.grid[0])
    assert type(func).__name__ == "PrimFunc" and set(seen) == {"sm_90a"}
