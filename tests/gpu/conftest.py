"""GPU suite: runs the INSTALLED tilebin wheel's kernels on an sm_90 GPU (an H200).

Every test in this folder is marked ``gpu`` and skipped, with the reason, when torch is
missing, no CUDA GPU is visible, or the GPU is not sm_90 (the cubins are sm_90a).  On the
device machine ``wheels/gpu_check.sh`` installs the wheel into a folder outside the checkout,
puts it on PYTHONPATH, sets TILEBIN_EXPECT_INSTALLED=1 and runs pytest with
``--confcutdir`` here, so ``tests/conftest.py`` (which maps the source tree onto
``tilebin``) is not loaded.  Nothing from the source tree is imported except
``tests/reference.py`` (by path, see ``_gpu_util``).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(HERE) not in sys.path:  # helpers import by plain name under any --import-mode
    sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:  # test-only packages in tests/ (``quant_ref``), never tilebin
    sys.path.append(str(HERE.parent))


def expect_installed() -> bool:
    return os.environ.get("TILEBIN_EXPECT_INSTALLED", "") == "1"


@functools.lru_cache(maxsize=None)
def gpu_skip_reason() -> str | None:
    try:
        import torch
    except Exception as exc:
        return f"torch is not importable ({exc!r}); the GPU suite needs torch with CUDA"
    try:
        if not torch.cuda.is_available():
            return (f"no CUDA GPU visible (torch {torch.__version__}, built for CUDA {torch.version.cuda}, "
                    f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        cap = torch.cuda.get_device_capability(0)
        name = torch.cuda.get_device_name(0)
    except Exception as exc:
        return f"CUDA is not usable through torch: {exc!r}"
    if cap != (9, 0):
        return f"GPU 0 is {name} (sm_{cap[0]}{cap[1]}); tilebin's cubins are sm_90a (H100/H200)"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA sm_90 GPU and driver (run wheels/gpu_check.sh)")


def pytest_collection_modifyitems(config, items):
    reason = gpu_skip_reason()
    for item in items:
        if not Path(str(item.path)).resolve().is_relative_to(HERE):
            continue
        item.add_marker(pytest.mark.gpu)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_report_header(config):
    lines = [f"tilebin GPU suite: TILEBIN_EXPECT_INSTALLED={os.environ.get('TILEBIN_EXPECT_INSTALLED')!r}",
             f"  skip reason: {gpu_skip_reason()}"]
    if gpu_skip_reason() is None:
        import torch

        from _gpu_util import REFERENCE_NOTE
        p = torch.cuda.get_device_properties(0)
        lines.append(f"  GPU: {p.name}, {p.multi_processor_count} SMs, torch {torch.__version__}")
        lines.append(f"  references: {REFERENCE_NOTE}")
    try:
        import tilebin.runtime as runtime
        lines.append(f"  tilebin.runtime: {runtime.__file__}")
    except Exception as exc:  # the fixtures fail with the details; the header only reports
        lines.append(f"  tilebin.runtime: not importable ({exc!r})")
    return lines


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def rt():
    """``tilebin.runtime``; refuses to run against the source tree when the wheel is expected."""
    from tilebin import runtime

    if expect_installed() and Path(runtime.__file__).resolve().is_relative_to(REPO):
        pytest.fail(f"TILEBIN_EXPECT_INSTALLED=1 but tilebin.runtime was imported from the checkout "
                    f"({runtime.__file__}); sys.path[:6]={sys.path[:6]}")
    return runtime


@pytest.fixture(scope="session")
def artifacts_dir(rt) -> Path:
    """The installed wheel's artifacts folder (manifest.json + cubins/)."""
    import importlib.resources

    folder = Path(str(importlib.resources.files("tilebin") / "_artifacts"))
    if not (folder / "manifest.json").is_file():
        pytest.fail(f"no manifest.json in {folder}; contents: "
                    f"{sorted(p.name for p in folder.iterdir()) if folder.is_dir() else 'missing folder'}")
    return folder


@pytest.fixture(scope="session")
def kernel_names(rt) -> list[str]:
    return list(rt.kernel_names(internal=True))  # the test kernels too (hidden from the public list)


@pytest.fixture(scope="session")
def require(kernel_names):
    """``require(name)`` fails the test (not skips) when the wheel lacks the kernel."""

    def _require(name: str) -> None:
        if name not in kernel_names:
            pytest.fail(f"kernel {name!r} is not in the installed wheel; it has {kernel_names}")

    return _require


@pytest.fixture
def rng(request):
    from _gpu_util import Rng

    return Rng(request.node.nodeid)


@pytest.fixture(autouse=True)
def _cuda_clean(request):
    """Each test starts and ends with an idle device; a failing launch shows up in its own test."""
    if gpu_skip_reason() is not None:
        yield
        return
    import torch

    torch.cuda.synchronize()
    yield
    torch.cuda.synchronize()


@pytest.fixture
def sm_counts():
    """SM counts to run under (the device's, 20 fewer, 7, 1) and ``set_num_sms``; restores the default."""
    from tilebin.ops import config

    full = config.get_device_num_sms()
    counts = list(dict.fromkeys(c for c in (full, full - 20, 7, 1) if c >= 1))
    yield counts, config.set_num_sms
    config.set_num_sms(0)
