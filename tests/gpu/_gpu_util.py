"""Helpers of the GPU suite: seeded inputs, poisoning, bit-exact and tolerance comparisons.

Every check raises an AssertionError that says what it saw (counts, first bad indices,
values, whether the poison pattern survived), because the suite runs on a lent H200 that
the author never sees.  Only torch and the standard library are imported here; the
reference functions come from ``tests/reference.py`` when it provides them.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import zlib
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
REFERENCE_PATH = HERE.parent / "reference.py"

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float8_e4m3fn": torch.float8_e4m3fn}
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------- reference module
def _load_reference():
    """tests/reference.py, imported by path (tests/ is on sys.path only while it loads)."""
    if not REFERENCE_PATH.is_file():
        return None, f"{REFERENCE_PATH} not found: using the suite's own torch references"
    spec = importlib.util.spec_from_file_location("tilebin_tests_reference", REFERENCE_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REFERENCE_PATH.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # report, then fall back: the references below are exact
        return None, f"{REFERENCE_PATH} failed to import ({exc!r}): using the suite's own references"
    finally:
        sys.path.remove(str(REFERENCE_PATH.parent))
    return module, f"{REFERENCE_PATH}"


REFERENCE, REFERENCE_NOTE = _load_reference()


def reference_fn(name: str):
    """``tests/reference.py``'s function ``name``, or None when the module lacks it."""
    fn = getattr(REFERENCE, name, None) if REFERENCE is not None else None
    return fn if callable(fn) else None


# ---------------------------------------------------------------- seeded inputs
class Rng:
    """A CUDA generator seeded from the test's node id: fresh per test, reproducible."""

    def __init__(self, nodeid: str, salt: int = 0):
        self.seed = (zlib.crc32(nodeid.encode()) + 7919 * salt) & 0x7FFFFFFF
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(self.seed)

    def normal(self, shape, dtype, scale: float = 1.0) -> torch.Tensor:
        t = torch.randn(shape, device="cuda", dtype=torch.float32, generator=self.gen)
        if scale != 1.0:
            t.mul_(scale)
        return t.to(dtype)

    def uniform(self, shape, lo: float, hi: float) -> torch.Tensor:
        t = torch.rand(shape, device="cuda", dtype=torch.float32, generator=self.gen)
        return t.mul_(hi - lo).add_(lo)

    def bits(self, shape, dtype) -> torch.Tensor:
        """Random bit patterns of ``dtype`` (subnormals, infinities, -0), NaNs replaced by 0."""
        size = torch.empty((), dtype=dtype).element_size()
        raw = torch.randint(0, 256, (*shape, size), device="cuda", dtype=torch.uint8, generator=self.gen)
        t = raw.view(dtype).reshape(shape)
        nan = torch.isnan(t.float()) if t.numel() else torch.zeros(shape, dtype=torch.bool, device="cuda")
        return t.masked_fill(nan, 0) if dtype.itemsize > 1 else _fp8_denan(t, nan)

    def fill_(self, t: torch.Tensor, kind: str = "normal") -> torch.Tensor:
        """Refill ``t`` in place (keeps its address: graphs and prepacked pointers stay valid)."""
        src = self.bits(t.shape, t.dtype) if kind == "bits" else self.normal(t.shape, t.dtype)
        return t.copy_(src)


def _fp8_denan(t: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    u = t.view(torch.uint8).clone()
    u[nan] = 0
    return u.view(t.dtype)


# ---------------------------------------------------------------- poison
def poison_(t: torch.Tensor) -> torch.Tensor:
    """NaN for 2/4/8-byte floats, 0xFF bytes otherwise (0xFF is NaN in float8_e4m3fn)."""
    if t.numel() == 0:
        return t
    if t.dtype.is_floating_point and t.element_size() >= 2:
        return t.fill_(float("nan"))
    t.view(torch.uint8).fill_(255)
    return t


def poison_bits(dtype: torch.dtype) -> int:
    """The integer bit pattern :func:`poison_` writes into one element of ``dtype``."""
    one = poison_(torch.empty(1, dtype=dtype, device="cuda"))
    return int(one.view(_INT_VIEW[one.element_size()]).item())


def int_view(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_INT_VIEW[t.element_size()])


def assert_poisoned(t: torch.Tensor, what: str) -> None:
    """After a refused launch: every element must still hold the poison pattern."""
    torch.cuda.synchronize()
    if t.numel() == 0:
        return
    changed = int((int_view(t) != poison_bits(t.dtype)).sum())
    assert changed == 0, (
        f"{what}: {changed}/{t.numel()} elements of the output changed although the launch "
        "was refused: something reached the GPU before the error was raised"
    )


# ---------------------------------------------------------------- comparisons
def _describe(out: torch.Tensor, ref: torch.Tensor, bad: torch.Tensor, limit: int = 6) -> str:
    idx = bad.nonzero()[:limit]
    lines = []
    for row in idx.tolist():
        o, r = out[tuple(row)], ref[tuple(row)]
        ob = int(int_view(o.reshape(1)).item()) & ((1 << (8 * out.element_size())) - 1)
        rb = int(int_view(r.reshape(1)).item()) & ((1 << (8 * ref.element_size())) - 1)
        lines.append(f"  at {tuple(row)}: got {o.float().item()!r} (0x{ob:x}), want {r.float().item()!r} (0x{rb:x})")
    return "\n".join(lines)


def assert_bits_equal(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """Bit-exact: same shape, dtype and raw bytes.  Reports unwritten (still poisoned) elements."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)}, want {tuple(ref.shape)}"
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype}, want {ref.dtype}"
    if out.numel() == 0:
        return
    o, r = int_view(out), int_view(ref)
    bad = o != r
    n_bad = int(bad.sum())
    if n_bad:
        unwritten = int((bad & (o == poison_bits(out.dtype))).sum())
        raise AssertionError(
            f"{what}: {n_bad}/{out.numel()} elements differ from the reference "
            f"({unwritten} of them still hold the poison pattern, i.e. were never written); "
            f"shape {tuple(out.shape)} {out.dtype}; first mismatches:\n{_describe(out, ref, bad)}"
        )


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str, rtol: float, atol: float,
                 max_rel_fro: float) -> None:
    """Elementwise |out-ref| <= atol + rtol*|ref| against a float64 reference, no NaN/Inf,
    and the relative Frobenius error under ``max_rel_fro``."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)}, want {tuple(ref.shape)}"
    if out.numel() == 0:
        return
    o, r = out.double(), ref.double()
    nonfinite = int((~torch.isfinite(o)).sum())
    err = (o - r).abs()
    bad = ~(err <= atol + rtol * r.abs())  # NaN counts as bad
    n_bad = int(bad.sum())
    fro = float(torch.linalg.vector_norm(torch.nan_to_num(o - r, nan=1e30)) /
                max(float(torch.linalg.vector_norm(r)), 1e-30))
    if n_bad or not fro <= max_rel_fro:
        worst = torch.nan_to_num(err, nan=math.inf).argmax()
        loc = tuple(int(i) for i in torch.unravel_index(worst, err.shape))
        raise AssertionError(
            f"{what}: {n_bad}/{out.numel()} elements outside atol={atol} rtol={rtol} "
            f"({nonfinite} NaN/Inf, e.g. unwritten poison); relative Frobenius error {fro:.3e} "
            f"(limit {max_rel_fro:.1e}); worst at {loc}: got {o[loc].item()!r}, want {r[loc].item()!r}; "
            f"first bad:\n{_describe(out.float(), ref.float(), bad)}"
        )


def count_mismatches(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Device-side count of bitwise mismatches (no sync: for loops that check at the end)."""
    if out.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device="cuda")
    return (int_view(out) != int_view(ref)).sum()


def is_inside(path: str | Path, folder: Path) -> bool:
    try:
        Path(path).resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False
