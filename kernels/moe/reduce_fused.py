"""``moe.reduce_fused``: weighted sum of each token's top-k rows of the fused expert layout.

Parameters, in order: ``x`` ``[num_expanded_tokens, hidden]`` of ``in_dtype``; ``topk_weights``
fp32 ``[num_tokens, num_topk]``; ``token_topk_to_pos`` int32 ``[num_tokens, num_topk]``; ``out``
``[num_tokens, hidden]`` of ``out_dtype``; ``sf`` fp32 ``[1]``; ``x_sf`` fp32 ``[x_sf_len]``;
flags ``with_weights``, ``with_x_sf``, ``with_sf`` (0/1: a tensor whose flag is 0 is never read,
any tensor of the right rank may stand in for it).  Sizes are run-time values.

Per token ``t``, in fp32, ``acc = 0``; for ``k`` in order with ``p = token_topk_to_pos[t, k] >= 0``:
``s = topk_weights[t, k]`` (or 1), ``s = s * x_sf[p]`` (with x_sf), ``acc = fma(x[p], s, acc)``
(one rounding, ``T.ieee_fmaf``: no compiler contraction choice); then ``acc * sf[0]`` (with sf,
``T.ieee_mul``), cast to ``out_dtype`` (bf16: round to nearest even; e4m3: round to nearest
even, saturating at +-448).  The bits are those of tile_kernels' torch reference (with an
explicit FMA), independent of launch shape.  Needs ``hidden % (16 / itemsize(in_dtype)) == 0``.

Design (streaming, 16-byte vectors in, one vector's worth out): a block of 128 threads per
token; per chunk of ``128 x U`` vectors every thread keeps ``U x V = 16`` fp32 accumulators,
walks the token's top-k slots and issues its ``U`` vector loads of each row together.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
ACC = 16  # fp32 accumulators per thread per chunk
_VEC = {"bfloat16": 8, "float32": 4}  # input elements per 16-byte vector
IN_DTYPES = tuple(_VEC)
OUT_DTYPES = ("same", "float8_e4m3fn")


def reduce_fused(in_dtype: str, out_dtype: str):
    """Build the PrimFunc of one variant; ``out_dtype`` is ``in_dtype`` or ``float8_e4m3fn``."""
    if in_dtype not in _VEC or out_dtype not in (in_dtype, "float8_e4m3fn"):
        raise ValueError(f"reduce_fused: bad variant in_dtype={in_dtype!r} out_dtype={out_dtype!r}")
    V = _VEC[in_dtype]
    U = ACC // V
    num_tokens, hidden, num_topk = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_topk")
    num_slots, x_sf_len = T.dynamic("num_expanded_tokens"), T.dynamic("x_sf_len")
    nvec = hidden // V
    x_vec = (num_slots, nvec * V)  # row length a multiple of V: every vector is 16-byte aligned
    out_vec = (num_tokens, nvec * V)

    @T.prim_func
    def main(
        x: T.Tensor((num_slots, hidden), in_dtype),
        topk_weights: T.Tensor((num_tokens, num_topk), "float32"),
        token_topk_to_pos: T.Tensor((num_tokens, num_topk), "int32"),
        out: T.Tensor((num_tokens, hidden), out_dtype),
        sf: T.Tensor((1,), "float32"),
        x_sf: T.Tensor((x_sf_len,), "float32"),
        with_weights: T.int32,
        with_x_sf: T.int32,
        with_sf: T.int32,
    ):
        with T.Kernel(num_tokens, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            acc = T.alloc_local((ACC,), "float32")
            xin = T.alloc_local((ACC,), in_dtype)
            res = T.alloc_local((ACC,), out_dtype)
            s = T.alloc_var("float32")
            pos = T.alloc_var("int32")
            for c in T.serial(T.ceildiv(nvec, THREADS * U)):
                for i in T.unroll(ACC):
                    acc[i] = T.float32(0)
                for k in T.serial(num_topk):
                    pos = token_topk_to_pos[bx, k]
                    if pos >= 0 and pos < num_slots:
                        s = T.float32(1)
                        if with_weights != 0:
                            s = topk_weights[bx, k]
                        if with_x_sf != 0:
                            s = T.ieee_mul(s, x_sf[pos])
                        for u in T.unroll(U):
                            if (c * U + u) * THREADS + tid < nvec:
                                for v in T.vectorized(V):
                                    xin[u * V + v] = T.Tensor(x_vec, in_dtype, x.data)[
                                        pos, ((c * U + u) * THREADS + tid) * V + v]
                        for u in T.unroll(U):
                            if (c * U + u) * THREADS + tid < nvec:
                                for v in T.unroll(V):
                                    acc[u * V + v] = T.ieee_fmaf(T.Cast("float32", xin[u * V + v]), s, acc[u * V + v])
                for u in T.unroll(U):
                    if (c * U + u) * THREADS + tid < nvec:
                        for v in T.unroll(V):
                            if with_sf != 0:
                                acc[u * V + v] = T.ieee_mul(acc[u * V + v], sf[0])
                        for v in T.vectorized(V):
                            res[u * V + v] = T.Cast(out_dtype, acc[u * V + v])
                        for v in T.vectorized(V):
                            T.Tensor(out_vec, out_dtype, out.data)[bx, ((c * U + u) * THREADS + tid) * V + v] = \
                                res[u * V + v]

    return main


GRID = tuple({"in_dtype": i, "out_dtype": o} for i in IN_DTYPES for o in (i, "float8_e4m3fn"))

KERNELS = (
    KernelDecl(
        name="moe.reduce_fused",
        factory=reduce_fused,
        grid=GRID,
        outputs=("out",),
        align=16,
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="out[t] = sum_k fma(x[pos(t, k)], w[t, k] * x_sf[pos], acc) (* sf), cast "
            "(tile_kernels.moe.reduce_fused).",
    ),
)

__all__ = ["GRID", "IN_DTYPES", "KERNELS", "reduce_fused"]
