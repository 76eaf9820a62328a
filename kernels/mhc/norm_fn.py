"""mHC pre-norm function: ``out = (residual_flat @ fn.T) * rsqrt(mean(residual_flat**2) + eps)``.

``residual_flat`` is bf16 ``[num_tokens, K]`` (``K = mhc_mult * hidden``, the flattened
streams), ``fn`` fp32 ``[N, K]`` (``N = mhc_mult * (mhc_mult + 2)``: 24 for mhc_mult 4).  Every
extent (tokens, K, number of splits) is a run-time symbol; the compile-time key is ``mhc_mult``
(2, 4 or 8, which fixes N = 8, 24 or 80).  K must be a multiple of ``KB`` = 128.

Numerics (the order the op layer and the tests rely on):

* ``fn`` is first rounded to TF32 by ``mhc.norm_fn_prep`` (``bits + 0x1000``, low 13 bits
  cleared: round half away from zero), optionally after the multiplication by the norm weight
  (one fp32 product).  bf16 residual values are exact in TF32, so every tensor-core product is
  exact; products are accumulated in fp32 inside the MMA in the hardware's order.
* Split-K: split ``s`` of ``S`` owns the 128-column blocks ``[s * nkb // S, (s + 1) * nkb // S)``
  (``nkb = K / 128``) and writes fp32 partials ``part_mul[s, t, :]`` (the projection) and
  ``part_sq[s, t]`` (the sum of squares).  ``mhc.norm_fn_fwd_norm`` then sums the partials in
  split order ``s = 0, 1, ..., S-1`` (left to right, starting from split 0's value), and applies
  the RMS factor *after* the GEMM: ``rms = rsqrt(sq / K + eps)``, ``out = mul * rms``.
* Backward (``mhc.norm_fn_bwd_norm`` then ``mhc.norm_fn_bwd_mul``), with ``g = d out``:
  ``g_mul = tf32(g * rms)``, ``g_sq = (sum_j g_j * mul_j) * rms / (sq + eps * K) / -2``;
  ``d fn = g_mul.T @ x`` (MMA, fp32), ``d x = bf16((d x_in + g_mul @ fn) + 2 * x * g_sq)`` where
  ``d x_in`` is the gradient already accumulated (``accumulate == 1``) or 0.

Kernels of this file:

* ``mhc.norm_fn_prep``: ``fn_eff = tf32(fn * w)`` (or ``tf32(fn)`` with ``has_weight == 0``).
* ``mhc.norm_fn_fwd_mul``: the split-K GEMM + sum of squares.  A block takes ``TB`` = 128
  tokens x a split's column range, 128 columns a step through a 4-stage pipeline (3 stages for
  mhc_mult 8, whose fn tile is 40 KB): TileLang warp-specialises it (a producer warpgroup issues
  the TMA loads of the x tile, bf16 32 KB in a 128-byte swizzle, and of the fn tile, fp32
  N x 128; rows past the tokens are filled with zeros by TMA) and 8 consumer warps of 16 rows
  each widen x to fp32 in registers (the swizzle keeps those scalar shared-memory reads
  conflict-free), add the squares and feed
  ``mma.sync`` TF32 with N exactly (24: three n8 tiles; WGMMA off).  Grid ``(ceil(T / 128), S)``,
  one block per SM (176 KB of shared memory for mhc_mult 4).
* ``mhc.norm_fn_fwd_norm``: one thread per ``(token, j)``; writes ``out``, and ``out_mul`` /
  ``sqrsum`` (the saved statistics for backward).
* ``mhc.norm_fn_bwd_norm``: one thread per ``(token, j)``.
* ``mhc.norm_fn_bwd_mul``: grid ``(K / 128, S_t)``, 128 threads: block ``(c, s)`` takes 128
  columns (their fn tile in shared memory, N padded to a multiple of 16 with zeros) and the
  token blocks ``[s * ntb // S_t, (s + 1) * ntb // S_t)`` of 64 tokens (loaded synchronously,
  x widened to fp32 in shared memory); it writes ``d x`` of its tiles once and its split's
  ``g_mul.T @ x`` to ``fn_grad_part[s]`` (no atomics).
* ``mhc.norm_fn_grad_reduce``: one thread per column: ``d fn_eff = sum_s fn_grad_part[s]`` in
  split order; then ``d fn = d fn_eff * w`` and ``d w = sum_n d fn_eff[n] * fn[n]`` (rows in
  order) with a norm weight, else ``d fn = d fn_eff``; added to the targets when
  ``accumulate == 1`` (the ``main_grad`` convention).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T
from tilelang.layout import make_swizzled_layout

from .._declare import KernelDecl

KB = 128  # columns per pipeline step (K must be a multiple)
TB = 128  # tokens per block of the forward GEMM (8 consumer warps, 16 rows each)
FWD_THREADS = 256  # consumer threads of the forward GEMM (TileLang adds a TMA producer warpgroup)
TB_BWD = 64  # tokens per step of the backward GEMM
MAX_N = 80  # mhc_mult 8
THREADS = 128
EW = 256  # threads of the element-wise kernels
MULTS = (4, 2, 8)
PASS_CONFIGS = {"tl.disable_wgmma": True, "tl.disable_warp_specialized": True}
GEMM_PASS_CONFIGS = {"tl.disable_wgmma": True}


def _n_of(mult: int) -> int:
    n = mult * (mult + 2)
    if n > MAX_N:
        raise ValueError(f"mhc.norm_fn: mhc_mult={mult} gives N={n} > {MAX_N}")
    return n


def _n_pad(n: int) -> int:
    """N rounded up to a multiple of 16 (the backward's MMA tiles; padded rows are zeros)."""
    return -(-n // 16) * 16


def _fwd_stages(n: int) -> int:
    """Pipeline depth of the forward: 4 stages of (32 KB x + N * 512 B fn) fit up to N = 32."""
    return 4 if n <= 32 else 3


def _tf32(v):
    """fp32 ``v`` rounded to TF32 (half away from zero), low 13 bits cleared."""
    bits = T.reinterpret(v, "int32")
    return T.reinterpret((bits + 0x1000) & T.int32(-8192), "float32")


def norm_fn_prep():
    """``fn_eff[n, k] = tf32(fn[n, k] * w[k])`` (``w`` read only when ``has_weight``)."""
    n_rows, k_cols, k_w = T.dynamic("n_rows"), T.dynamic("mhc_hidden"), T.dynamic("w_len")

    @T.prim_func
    def main(
        fn: T.Tensor((n_rows, k_cols), "float32"),
        w: T.Tensor((k_w,), "float32"),
        fn_eff: T.Tensor((n_rows, k_cols), "float32"),
        has_weight: T.int32,
    ):
        with T.Kernel(T.ceildiv(n_rows * k_cols, EW), threads=EW) as bx:
            tid = T.get_thread_binding()
            idx = bx * EW + tid
            if idx < n_rows * k_cols:
                r = idx // k_cols
                c = idx % k_cols
                v = T.alloc_var("float32")
                v = fn[r, c]
                if has_weight != 0:
                    v = v * w[c]
                fn_eff[r, c] = _tf32(v)

    return main


def norm_fn_fwd_mul(mhc_mult: int):
    """Split-K partials of ``x @ fn_eff.T`` and of ``sum x**2``."""
    n = _n_of(mhc_mult)
    num_tokens, k_cols, n_splits = T.dynamic("num_tokens"), T.dynamic("mhc_hidden"), T.dynamic("n_splits")

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, k_cols), "bfloat16"),
        fn_eff: T.Tensor((n, k_cols), "float32"),
        part_mul: T.Tensor((n_splits, num_tokens, n), "float32"),
        part_sq: T.Tensor((n_splits, num_tokens), "float32"),
    ):
        with T.Kernel(T.ceildiv(num_tokens, TB), n_splits, threads=FWD_THREADS) as (bx, bs):
            acc = T.alloc_fragment((TB, n), "float32")
            sq4 = T.alloc_fragment((TB, 4), "float32")
            sq = T.alloc_fragment((TB,), "float32")
            T.clear(acc)
            T.clear(sq4)
            nkb = k_cols // KB
            kb_lo = bs * nkb // n_splits
            kb_hi = (bs + 1) * nkb // n_splits
            for kb in T.Pipelined(kb_lo, kb_hi, num_stages=_fwd_stages(n)):
                x_s = T.alloc_shared((TB, KB), "bfloat16")
                f_s = T.alloc_shared((n, KB), "float32")
                x_h = T.alloc_fragment((TB, KB), "bfloat16")
                x_f = T.alloc_fragment((TB, KB), "float32")
                T.annotate_layout({x_s: make_swizzled_layout(x_s)})  # conflict-free scalar reads below
                T.copy(x[bx * TB, kb * KB], x_s)
                T.copy(fn_eff[0, kb * KB], f_s)
                T.copy(x_s, x_h)
                T.copy(x_h, x_f)
                for q in T.serial(KB // 4):
                    for i, j in T.Parallel(TB, 4):
                        sq4[i, j] += x_f[i, q * 4 + j] * x_f[i, q * 4 + j]
                T.gemm(x_f, f_s, acc, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            T.reduce_sum(sq4, sq, dim=1)
            for i in T.Parallel(TB):
                if bx * TB + i < num_tokens:
                    part_sq[bs, bx * TB + i] = sq[i]
            for i, j in T.Parallel(TB, n):
                if bx * TB + i < num_tokens:
                    part_mul[bs, bx * TB + i, j] = acc[i, j]

    return main


def norm_fn_fwd_norm(mhc_mult: int):
    """Sum the split partials in split order, ``out = mul * rsqrt(sq / K + eps)``."""
    n = _n_of(mhc_mult)
    num_tokens, n_splits = T.dynamic("num_tokens"), T.dynamic("n_splits")

    @T.prim_func
    def main(
        part_mul: T.Tensor((n_splits, num_tokens, n), "float32"),
        part_sq: T.Tensor((n_splits, num_tokens), "float32"),
        out: T.Tensor((num_tokens, n), "float32"),
        out_mul: T.Tensor((num_tokens, n), "float32"),
        sqrsum: T.Tensor((num_tokens,), "float32"),
        mhc_hidden: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * n, EW), threads=EW) as bx:
            tid = T.get_thread_binding()
            idx = bx * EW + tid
            if idx < num_tokens * n:
                t = idx // n
                j = idx % n
                s_sq = T.alloc_var("float32")
                s_mul = T.alloc_var("float32")
                s_sq = part_sq[0, t]
                s_mul = part_mul[0, t, j]
                for s in T.serial(n_splits - 1):
                    s_sq = s_sq + part_sq[s + 1, t]
                    s_mul = s_mul + part_mul[s + 1, t, j]
                rms = T.rsqrt(s_sq / T.Cast("float32", mhc_hidden) + eps)
                out[t, j] = s_mul * rms
                out_mul[t, j] = s_mul
                if j == 0:
                    sqrsum[t] = s_sq

    return main


def norm_fn_bwd_norm(mhc_mult: int):
    """``g_mul = tf32(g * rms)``; ``g_sq = (g . mul) * rms / (sq + eps * K) / -2``."""
    n = _n_of(mhc_mult)
    num_tokens = T.dynamic("num_tokens")

    @T.prim_func
    def main(
        out_grad: T.Tensor((num_tokens, n), "float32"),
        out_mul: T.Tensor((num_tokens, n), "float32"),
        sqrsum: T.Tensor((num_tokens,), "float32"),
        g_mul: T.Tensor((num_tokens, n), "float32"),
        g_sq: T.Tensor((num_tokens,), "float32"),
        mhc_hidden: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * n, EW), threads=EW) as bx:
            tid = T.get_thread_binding()
            idx = bx * EW + tid
            if idx < num_tokens * n:
                t = idx // n
                j = idx % n
                kf = T.Cast("float32", mhc_hidden)
                s = sqrsum[t]
                rms = T.rsqrt(s / kf + eps)
                g_mul[t, j] = _tf32(out_grad[t, j] * rms)
                if j == 0:
                    dot = T.alloc_var("float32")
                    dot = out_grad[t, 0] * out_mul[t, 0]
                    for q in T.serial(n - 1):
                        dot = dot + out_grad[t, q + 1] * out_mul[t, q + 1]
                    g_sq[t] = dot * rms / (s + eps * kf) / T.float32(-2)

    return main


def norm_fn_bwd_mul(mhc_mult: int):
    """``d x = (d x_in + g_mul @ fn_eff) + 2 x g_sq`` (bf16); split ``s``'s part of ``g_mul.T @ x``."""
    n = _n_of(mhc_mult)
    npad = _n_pad(n)
    num_tokens, k_cols, t_splits = T.dynamic("num_tokens"), T.dynamic("mhc_hidden"), T.dynamic("t_splits")
    kv = (num_tokens, (k_cols // KB) * KB)  # rows a multiple of KB long: 8- and 4-byte vector accesses

    @T.prim_func
    def main(
        g_mul: T.Tensor((num_tokens, n), "float32"),
        g_sq: T.Tensor((num_tokens,), "float32"),
        x: T.Tensor((num_tokens, k_cols), "bfloat16"),
        fn_eff: T.Tensor((n, k_cols), "float32"),
        x_grad: T.Tensor((num_tokens, k_cols), "bfloat16"),
        fn_grad_part: T.Tensor((t_splits, n, k_cols), "float32"),
        accumulate: T.int32,
    ):
        with T.Kernel(k_cols // KB, t_splits, threads=THREADS) as (bk, bs):
            f_s = T.alloc_shared((npad, KB), "float32")
            x_s = T.alloc_shared((TB_BWD, KB), "float32")
            g_s = T.alloc_shared((TB_BWD, npad), "float32")
            fg = T.alloc_fragment((npad, KB), "float32")
            xg = T.alloc_fragment((TB_BWD, KB), "float32")
            gs = T.alloc_fragment((TB_BWD,), "float32")
            for i, j in T.Parallel(npad, KB):
                f_s[i, j] = T.if_then_else(i < n, fn_eff[T.min(i, n - 1), bk * KB + j], T.float32(0))
            T.clear(fg)
            ntb = T.ceildiv(num_tokens, TB_BWD)
            for tb in T.serial(bs * ntb // t_splits, (bs + 1) * ntb // t_splits):
                t0 = tb * TB_BWD
                for i, j in T.Parallel(TB_BWD, KB):
                    x_s[i, j] = T.if_then_else(
                        t0 + i < num_tokens,
                        T.Cast("float32", T.Tensor(kv, "bfloat16", x.data)[t0 + i, bk * KB + j]),
                        T.float32(0))
                for i, j in T.Parallel(TB_BWD, npad):
                    g_s[i, j] = T.if_then_else(
                        t0 + i < num_tokens and j < n,
                        g_mul[T.min(t0 + i, num_tokens - 1), T.min(j, n - 1)],
                        T.float32(0))
                for i in T.Parallel(TB_BWD):
                    gs[i] = T.if_then_else(t0 + i < num_tokens, g_sq[T.min(t0 + i, num_tokens - 1)], T.float32(0))
                for i, j in T.Parallel(TB_BWD, KB):
                    xg[i, j] = T.if_then_else(
                        accumulate != 0 and t0 + i < num_tokens,
                        T.Cast("float32", T.Tensor(kv, "bfloat16", x_grad.data)[t0 + i, bk * KB + j]),
                        T.float32(0))
                T.gemm(g_s, x_s, fg, transpose_A=True)
                T.gemm(g_s, f_s, xg)
                for i, j in T.Parallel(TB_BWD, KB):
                    if t0 + i < num_tokens:
                        T.Tensor(kv, "bfloat16", x_grad.data)[t0 + i, bk * KB + j] = T.Cast(
                            "bfloat16", xg[i, j] + 2 * x_s[i, j] * gs[i])
            for i, j in T.Parallel(npad, KB):
                if i < n:
                    fn_grad_part[bs, i, bk * KB + j] = fg[i, j]

    return main


def norm_fn_grad_reduce():
    """``d fn_eff = sum_s part[s]`` (split order); with ``has_weight``: ``d fn = d fn_eff * w`` and
    ``d w[k] = sum_n d fn_eff[n, k] * fn[n, k]`` (rows in order), else ``d fn = d fn_eff``."""
    t_splits, n_rows, k_cols, k_w = T.dynamic("t_splits"), T.dynamic("n_rows"), T.dynamic("mhc_hidden"), T.dynamic("w_len")

    @T.prim_func
    def main(
        fn_grad_part: T.Tensor((t_splits, n_rows, k_cols), "float32"),
        fn: T.Tensor((n_rows, k_cols), "float32"),
        w: T.Tensor((k_w,), "float32"),
        fn_grad: T.Tensor((n_rows, k_cols), "float32"),
        w_grad: T.Tensor((k_w,), "float32"),
        has_weight: T.int32,
        accumulate: T.int32,
    ):
        with T.Kernel(T.ceildiv(k_cols, EW), threads=EW) as bx:
            tid = T.get_thread_binding()
            c = bx * EW + tid
            if c < k_cols:
                wv = T.alloc_var("float32")
                wv = T.float32(1)
                if has_weight != 0:
                    wv = w[c]
                acc = T.alloc_var("float32")
                acc = T.float32(0)
                g = T.alloc_var("float32")
                for r in T.serial(n_rows):
                    g = fn_grad_part[0, r, c]
                    for q in T.serial(t_splits - 1):
                        g = g + fn_grad_part[q + 1, r, c]
                    acc = acc + g * fn[r, c]
                    if has_weight != 0:
                        g = g * wv
                    if accumulate != 0:
                        fn_grad[r, c] = fn_grad[r, c] + g
                    else:
                        fn_grad[r, c] = g
                if has_weight != 0:
                    if accumulate != 0:
                        w_grad[c] = w_grad[c] + acc
                    else:
                        w_grad[c] = acc

    return main


_MULT_GRID = tuple({"mhc_mult": m} for m in MULTS)

KERNELS = (
    KernelDecl(name="mhc.norm_fn_prep", factory=norm_fn_prep, grid=({},), outputs=("fn_eff",),
               pass_configs=PASS_CONFIGS, doc="fn_eff = tf32(fn * w) (or tf32(fn))."),
    KernelDecl(name="mhc.norm_fn_fwd_mul", factory=norm_fn_fwd_mul, grid=_MULT_GRID,
               outputs=("part_mul", "part_sq"), pass_configs=GEMM_PASS_CONFIGS,
               doc="split-K partials of x @ fn_eff.T (TF32 MMA) and of sum(x**2)."),
    KernelDecl(name="mhc.norm_fn_fwd_norm", factory=norm_fn_fwd_norm, grid=_MULT_GRID,
               outputs=("out", "out_mul", "sqrsum"), pass_configs=PASS_CONFIGS,
               doc="sum split partials in order; out = mul * rsqrt(sq / K + eps)."),
    KernelDecl(name="mhc.norm_fn_bwd_norm", factory=norm_fn_bwd_norm, grid=_MULT_GRID,
               outputs=("g_mul", "g_sq"), pass_configs=PASS_CONFIGS,
               doc="gradients of the mul partial sums (tf32) and of the sum of squares."),
    KernelDecl(name="mhc.norm_fn_bwd_mul", factory=norm_fn_bwd_mul, grid=_MULT_GRID,
               outputs=("x_grad", "fn_grad_part"), pass_configs=PASS_CONFIGS,
               doc="d x (+)= g_mul @ fn_eff + 2 x g_sq; per token split: g_mul.T @ x."),
    KernelDecl(name="mhc.norm_fn_grad_reduce", factory=norm_fn_grad_reduce, grid=({},),
               outputs=("fn_grad", "w_grad"), pass_configs=PASS_CONFIGS,
               doc="sum the token splits of d fn_eff; gradients of fn and the norm weight through fn_eff = fn * w."),
)

__all__ = ["KB", "KERNELS", "MULTS", "TB"]
