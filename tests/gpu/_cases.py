"""One test case per shipped kernel: its tensors, how to refill inputs in place, and its check.

A case owns its tensors for its whole life, so CUDA-graph and thread tests can refill the
inputs in place (same addresses), poison the outputs, launch or replay, and check again.
``check`` synchronizes and raises with details; ``mismatches`` returns a device-side count
without synchronizing (for loops that check once at the end).
"""

from __future__ import annotations

import torch

from _gpu_util import (Rng, assert_bits_equal, assert_close, count_mismatches, poison_,
                       reference_fn)

TRANSPOSE = "transpose.batched_transpose"
TRANSPOSE_WARPS = "transpose.batched_transpose_warps"
GEMM = "testing.gemm_nt"
COOP_SUM = "testing.coop_sum"
PDL_CHAIN = "testing.pdl_chain"
GEMM_VARIANTS = ((1024, 1024), (4096, 7168))  # (n, k)


class Case:
    kernel = ""

    def __init__(self) -> None:
        self.args: tuple = ()
        self.kwargs: dict = {}
        self.outputs: tuple[torch.Tensor, ...] = ()

    def launch(self, launcher, **extra):
        """``launcher.launch(kernel, *args, **kwargs)``; returns what launch returned (None)."""
        return launcher.launch(self.kernel, *self.args, **self.kwargs, **extra)

    def poison(self) -> None:
        for t in self.outputs:
            poison_(t)

    def refill(self) -> None:
        raise NotImplementedError

    def check(self, what: str = "") -> None:
        raise NotImplementedError

    def mismatches(self) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        shapes = ", ".join(f"{tuple(a.shape)}:{str(a.dtype)[6:]}" for a in self.args if torch.is_tensor(a))
        return f"{self.kernel}({shapes}{', ' if self.kwargs else ''}{self.kwargs or ''})"


# ---------------------------------------------------------------- transpose
def ref_transpose(x: torch.Tensor) -> torch.Tensor:
    fn = reference_fn("batched_transpose")
    if fn is not None:
        return fn(x)
    iv = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
    return x.view(iv).transpose(-1, -2).contiguous().view(x.dtype)


class TransposeCase(Case):
    kernel = TRANSPOSE

    def __init__(self, rng: Rng, dtype: torch.dtype, shape: tuple[int, int, int], fill: str = "normal"):
        super().__init__()
        b, r, c = shape
        self.rng, self.fill = rng, fill
        self.x = torch.empty((b, r, c), dtype=dtype, device="cuda")
        self.out = torch.empty((b, c, r), dtype=dtype, device="cuda")
        self.args, self.outputs = (self.x, self.out), (self.out,)
        self.refill()

    def refill(self) -> None:
        self.rng.fill_(self.x, self.fill)

    def check(self, what: str = "") -> None:
        assert_bits_equal(self.out, ref_transpose(self.x), f"{self!r} {what}".strip())

    def mismatches(self) -> torch.Tensor:
        return count_mismatches(self.out, ref_transpose(self.x))


class TransposeWarpsCase(TransposeCase):
    """``transpose.batched_transpose_warps`` (the op's kernel for aligned grids of 2+ blocks per SM)."""

    kernel = TRANSPOSE_WARPS


# ---------------------------------------------------------------- gemm
def ref_gemm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """tests/reference.py's gemm_nt (fp32 matmul rounded to bf16), else float64 a @ b.T."""
    fn = reference_fn("gemm_nt")
    return fn(a, b) if fn is not None else a.double() @ b.double().T


# Outputs are ~N(0, 1) (b is scaled by k^-0.5); the kernel and the reference each round once
# to bf16 (half-ulp 2^-9 relative), so 1e-2 leaves room for one ulp either way and nothing else.
GEMM_TOL = dict(rtol=1e-2, atol=1e-2, max_rel_fro=4e-3)


class GemmCase(Case):
    kernel = GEMM

    def __init__(self, rng: Rng, m: int, n: int, k: int, pin: bool = False):
        super().__init__()
        self.rng, self.n, self.k = rng, n, k
        self.a = torch.empty((m, k), dtype=torch.bfloat16, device="cuda")
        self.b = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")
        self.c = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
        self.args, self.outputs = (self.a, self.b, self.c), (self.c,)
        self.kwargs = {"n": n, "k": k} if pin else {}
        self.refill()

    def refill(self) -> None:
        self.a.copy_(self.rng.normal(self.a.shape, torch.bfloat16))
        self.b.copy_(self.rng.normal(self.b.shape, torch.bfloat16, scale=self.k ** -0.5))

    def check(self, what: str = "") -> None:
        assert_close(self.c, ref_gemm_nt(self.a, self.b), f"{self!r} {what}".strip(), **GEMM_TOL)

    def mismatches(self) -> torch.Tensor:
        ref = ref_gemm_nt(self.a, self.b).double()
        err = (self.c.double() - ref).abs()
        return (~(err <= GEMM_TOL["atol"] + GEMM_TOL["rtol"] * ref.abs())).sum()


# ---------------------------------------------------------------- coop_sum
def eval_dim(expr, env: dict) -> int:
    """A manifest shape entry (int, symbol or [op, a, b]) evaluated with ``env``."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, str):
        if expr not in env:
            raise AssertionError(f"shape symbol {expr!r} is not bound by the test (bound: {env})")
        return env[expr]
    op, *args = expr
    vals = [eval_dim(a, env) for a in args]
    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "floordiv": lambda a, b: a // b, "floormod": lambda a, b: a % b, "min": min, "max": max}
    if op not in ops:
        raise AssertionError(f"the suite cannot evaluate shape expression {expr!r}")
    return ops[op](*vals)


class CoopSumCase(Case):
    """``coop_sum(x, out)`` or ``coop_sum(x, <workspace...>, out)``: parameters between x and
    out are allocated from the manifest's tensor specs (e.g. partials [8] f32) and poisoned."""

    kernel = COOP_SUM

    def __init__(self, rng: Rng, n: int, spec):
        super().__init__()
        self.rng = rng
        names = [p.name for p in spec.params]
        tensors = {t.name: t for t in spec.variants[0].tensors}
        self.x = torch.empty((n,), dtype=torch.float32, device="cuda")
        self.out = torch.empty((1,), dtype=torch.float32, device="cuda")
        env = {s: n for s in tensors[names[0]].shape if isinstance(s, str)}
        middle = []
        for name in names[1:-1]:
            ts = tensors[name]
            shape = tuple(eval_dim(d, env) for d in ts.shape)
            middle.append(torch.empty(shape, dtype=getattr(torch, ts.dtype), device="cuda"))
        self.args = (self.x, *middle, self.out)
        self.outputs = (*middle, self.out)
        self.refill()

    def refill(self) -> None:
        self.x.copy_(self.rng.uniform(self.x.shape, 0.25, 1.25))

    def _ref_tol(self):
        fn = reference_fn("coop_sum")
        ref = fn(self.x).double()[0] if fn is not None else self.x.double().sum()
        return ref, 1e-5 * self.x.double().abs().sum() + 1e-6

    def check(self, what: str = "") -> None:
        ref, tol = self._ref_tol()
        got, want, tol = self.out.double().item(), ref.item(), tol.item()
        assert abs(got - want) <= tol, (
            f"{self!r} {what}: sum {got!r}, want {want!r} (|diff| {abs(got - want):.4g} > tol {tol:.3g}; "
            f"each element is in [0.25, 1.25), so a missing block shows as a deficit; NaN = unwritten)")

    def mismatches(self) -> torch.Tensor:
        ref, tol = self._ref_tol()
        return (~((self.out.double()[0] - ref).abs() <= tol)).long()


# ---------------------------------------------------------------- pdl_chain
def ref_pdl_chain(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    fn = reference_fn("pdl_chain")
    if fn is not None:
        return fn(x)
    y = x + 1.0
    return y, y * 2.0


class PdlChainCase(Case):
    kernel = PDL_CHAIN

    def __init__(self, rng: Rng, n: int):
        super().__init__()
        self.rng = rng
        self.x, self.y, self.z = (torch.empty((n,), dtype=torch.float32, device="cuda") for _ in range(3))
        self.args, self.outputs = (self.x, self.y, self.z), (self.y, self.z)
        self.refill()

    def refill(self) -> None:
        self.x.copy_(self.rng.normal(self.x.shape, torch.float32))

    def check(self, what: str = "") -> None:
        y, z = ref_pdl_chain(self.x)
        assert_bits_equal(self.y, y, f"{self!r} y=x+1 {what}".strip())
        assert_bits_equal(self.z, z, f"{self!r} z=y*2 (second, PDL-synchronised launch) {what}".strip())

    def mismatches(self) -> torch.Tensor:
        y, z = ref_pdl_chain(self.x)
        return count_mismatches(self.y, y) + count_mismatches(self.z, z)


def launch_rounds(rt, cases: list[Case], rounds: int) -> None:
    """Refill, poison and launch every case back to back (no sync), then check them all; repeat."""
    for rep in range(rounds):
        for c in cases:
            c.refill()
            c.poison()
            c.launch(rt)
        for c in cases:
            c.check(f"round {rep}")


def make_case(kind: str, rng: Rng, rt) -> Case:
    """Small standard cases by short name, for graph / stream / thread tests."""
    if kind == "transpose_bf16":
        return TransposeCase(rng, torch.bfloat16, (3, 129, 257))
    if kind == "transpose_f32":
        return TransposeCase(rng, torch.float32, (2, 100, 37))
    if kind == "transpose_fp8":
        return TransposeCase(rng, torch.float8_e4m3fn, (2, 65, 190))
    if kind == "transpose_warps_bf16":  # rows and cols multiples of 8, partial tiles on both axes
        return TransposeWarpsCase(rng, torch.bfloat16, (3, 136, 264))
    if kind == "transpose_warps_fp8":  # multiples of 16, partial tiles on both axes
        return TransposeWarpsCase(rng, torch.float8_e4m3fn, (2, 144, 272))
    if kind == "gemm_small":
        return GemmCase(rng, 127, 1024, 1024)
    if kind == "gemm_large":
        return GemmCase(rng, 33, 4096, 7168)
    if kind == "coop_sum":
        return CoopSumCase(rng, 100_003, rt.spec(COOP_SUM))
    if kind == "pdl_chain":
        return PdlChainCase(rng, 70_001)
    raise ValueError(kind)


CASE_KERNEL = {"transpose_bf16": TRANSPOSE, "transpose_f32": TRANSPOSE, "transpose_fp8": TRANSPOSE,
               "transpose_warps_bf16": TRANSPOSE_WARPS, "transpose_warps_fp8": TRANSPOSE_WARPS,
               "gemm_small": GEMM, "gemm_large": GEMM, "coop_sum": COOP_SUM, "pdl_chain": PDL_CHAIN}
CASE_KINDS = tuple(CASE_KERNEL)
