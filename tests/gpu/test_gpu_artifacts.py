"""``runtime.Registry`` over a copy of the installed artifacts: intact, corrupted, incomplete."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")

from _cases import TRANSPOSE, TransposeCase  # noqa: E402
from _gpu_util import assert_poisoned  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def copied(artifacts_dir, tmp_path, require):
    require(TRANSPOSE)
    dst = tmp_path / "artifacts"
    shutil.copytree(artifacts_dir, dst)
    return dst


def _cubin_of(folder, dtype="float32"):
    data = json.loads((folder / "manifest.json").read_text())
    for v in data["kernels"][TRANSPOSE]["variants"]:
        if v["key"].get("dtype") == dtype:
            return folder / v["cubin"]
    raise AssertionError(f"no {dtype} variant of {TRANSPOSE} in {folder}/manifest.json")


def _refused(rt, folder, case):
    """Construction or launch (whichever checks) must raise ArtifactError; nothing may run."""
    case.poison()
    with pytest.raises(rt.ArtifactError) as info:
        rt.Registry(folder).launch(case.kernel, *case.args)
    assert_poisoned(case.out, f"ArtifactError ({info.value})")
    return info.value


def test_registry_over_a_copy_works(rt, rng, copied):
    case = TransposeCase(rng, torch.float32, (2, 33, 65))
    reg = rt.Registry(copied)
    assert TRANSPOSE in reg.kernel_names(), reg.kernel_names()
    assert reg.spec(TRANSPOSE) == rt.spec(TRANSPOSE), "the copy's spec differs from the installed one"
    case.poison()
    reg.launch(TRANSPOSE, *case.args)
    case.check("through Registry(copy)")


@pytest.mark.parametrize("where", ["middle", "first", "last"])
def test_corrupted_cubin_refused(rt, rng, copied, where):
    path = _cubin_of(copied)
    data = bytearray(path.read_bytes())
    pos = {"first": 0, "middle": len(data) // 2, "last": len(data) - 1}[where]
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))
    err = _refused(rt, copied, TransposeCase(rng, torch.float32, (2, 33, 65)))
    assert path.name in str(err) or "sha256" in str(err).lower() or "checksum" in str(err).lower(), (
        f"the ArtifactError does not say which cubin failed its checksum: {err}")


def test_missing_cubin_refused(rt, rng, copied):
    _cubin_of(copied).unlink()
    _refused(rt, copied, TransposeCase(rng, torch.float32, (2, 33, 65)))


def test_truncated_manifest_refused(rt, rng, copied):
    manifest = copied / "manifest.json"
    manifest.write_text(manifest.read_text()[: len(manifest.read_text()) // 2])
    _refused(rt, copied, TransposeCase(rng, torch.float32, (2, 33, 65)))


def test_corruption_of_one_variant_spares_the_others(rt, rng, copied):
    """Integrity is checked per cubin when it loads: the bf16 variant still runs."""
    path = _cubin_of(copied, "float32")
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    if _cubin_of(copied, "bfloat16") == path:
        pytest.skip("the bf16 and fp32 variants share one cubin")
    reg = rt.Registry(copied)
    good = TransposeCase(rng, torch.bfloat16, (2, 33, 65))
    good.poison()
    reg.launch(TRANSPOSE, *good.args)
    good.check("bf16 variant next to a corrupted fp32 cubin")
    bad = TransposeCase(rng, torch.float32, (2, 33, 65))
    bad.poison()
    with pytest.raises(rt.ArtifactError):
        reg.launch(TRANSPOSE, *bad.args)
    assert_poisoned(bad.out, "fp32 launch with a corrupted cubin")
