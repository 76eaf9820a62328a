"""``mhc.multilayer_recompute``: rebuild the layer inputs and residuals of several consecutive mHC
layers from the first residual (activation recomputation; tile_kernels 1.0.0
``mhc_multilayer_recompute``).

Parameters, in order: ``initial_residual`` bf16 ``[n, M, hidden]`` (contiguous), ``ptrs`` int64
``[6, num_layers]``: the data pointers of the per-layer tensors, by row

    0 pre_mix[i]      fp32 [n, M]       (i < num_layers)
    1 layer_input[i]  bf16 [n, hidden]  (i < num_layers, written)
    2 layer_output[i] bf16 [n, hidden]  (i < num_post)
    3 post_mix[i]     fp32 [n, M]       (i < num_post)
    4 comb_mix[i]     fp32 [n, M, M]    (i < num_post)
    5 residual[i]     bf16 [n, M, hidden] (i < num_post, written)

(every one contiguous and 16-byte aligned; unused slots are ignored), and ``num_post``
(``num_layers - 1`` or ``num_layers``).  Per token and hidden element, with ``r`` the fp32 residual
(``initial_residual`` widened)::

    for i < num_post:
        layer_input[i] = bf16(sum_j pre_mix[i][j] * r[j])
        new[o]         = post_mix[i][o] * layer_output[i] + sum_j comb_mix[i][j, o] * r[j]
        residual[i][o] = bf16(new[o]);   r = fp32(residual[i])
    if num_post < num_layers:  layer_input[num_post] = bf16(sum_j pre_mix[num_post][j] * r[j])

Every product and sum is rounded to fp32 on its own (no FMA), in the order written (j ascending),
so a float32 torch loop in the same order is bit-exact.

Design.  Why this shape: an earlier version gave each thread one 16-byte vector of one token (``M + 1``
loads in flight per thread, 128 registers, two 256-thread blocks per SM: ~40 KB of loads in
flight per SM; ncu at 4096 x 4096, 2 layers: DRAM 65 %).  tile_kernels keeps 4 x 32 residual
values per thread (254 registers, 4 x 64 threads per SM, ~80 KB in flight, DRAM 73 %).

Here block ``(t, g)`` (grid ``(T, ceil(hidden / (8 * 128 * U)))``, 128 threads) takes segment
``g`` of token ``t``: thread ``tid`` owns the vectors ``g * 128 * U + u * 128 + tid`` (``u <
U``, a compile-time step) of every stream, so its ``U * (M + 1)`` loads (residual and the first
layer output) are in flight together and one set of mixes serves them all; the next layer's
outputs are loaded before the current layer's math, as before.  ``__launch_bounds__(128, 4)``
for M <= 4: at most 128 registers, 16 warps per SM, ~80 KB of loads in flight.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
U = 2  # vectors per thread and stream
V = 8  # bf16 per 16-byte vector
MULTS = (4, 2, 8)


def multilayer_recompute(mhc_mult: int):
    m = mhc_mult
    vm = 4 if m % 4 == 0 else m  # fp32 per vector load of a mix row
    n, hidden, layers = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_layers")
    hv = hidden // V  # vectors per token row
    PH = THREADS * U  # vectors per segment
    min_blocks = 4 if m <= 4 else 2  # <= 128 registers for M <= 4 (M = 8 keeps 2 x 2 x 64 values live)

    @T.prim_func
    def main(
        initial_residual: T.Tensor((n, m, hidden), "bfloat16"),
        ptrs: T.Tensor((6, layers), "int64"),
        num_post: T.int32,
    ):
        with T.Kernel(n, T.ceildiv(hv, PH), threads=THREADS) as (tok, g):
            T.annotate_min_blocks_per_sm(min_blocks)
            tid = T.get_thread_binding()
            rb = T.alloc_local((U, m, V), "bfloat16")  # the residual entering the layer (bf16 exactly)
            nb = T.alloc_local((m, V), "bfloat16")  # the residual leaving it (one vector at a time)
            lb = T.alloc_local((V,), "bfloat16")
            ob = T.alloc_local((U, V), "bfloat16")  # this layer's output
            obn = T.alloc_local((U, V), "bfloat16")  # the next layer's, loaded early (in flight during the math)
            acc = T.alloc_local((V,), "float32")
            pre = T.alloc_local((m,), "float32")
            post = T.alloc_local((m,), "float32")
            comb = T.alloc_local((m * m,), "float32")
            for u in T.unroll(U):
                if g * PH + u * THREADS + tid < hv:
                    for j in T.unroll(m):
                        for e in T.vectorized(V):
                            rb[u, j, e] = T.Tensor((n, m, hv * V), "bfloat16", initial_residual.data)[
                                tok, j, (g * PH + u * THREADS + tid) * V + e]
            if num_post > 0:
                for u in T.unroll(U):
                    if g * PH + u * THREADS + tid < hv:
                        for e in T.vectorized(V):
                            ob[u, e] = T.make_tensor_from_addr(ptrs[2, 0], (n, hv * V), "bfloat16")[
                                tok, (g * PH + u * THREADS + tid) * V + e]
            for i in T.serial(num_post):
                for c in T.unroll(m // vm):
                    for k in T.vectorized(vm):
                        pre[c * vm + k] = T.make_tensor_from_addr(ptrs[0, i], (n, m), "float32")[tok, c * vm + k]
                for c in T.unroll(m // vm):
                    for k in T.vectorized(vm):
                        post[c * vm + k] = T.make_tensor_from_addr(ptrs[3, i], (n, m), "float32")[tok, c * vm + k]
                for c in T.unroll(m * m // 4):
                    for k in T.vectorized(4):
                        comb[c * 4 + k] = T.make_tensor_from_addr(ptrs[4, i], (n, m * m), "float32")[tok, c * 4 + k]
                if i + 1 < num_post:  # no output overlaps an input (the op checks), so reading early is safe
                    for u in T.unroll(U):
                        if g * PH + u * THREADS + tid < hv:
                            for e in T.vectorized(V):
                                obn[u, e] = T.make_tensor_from_addr(ptrs[2, i + 1], (n, hv * V), "bfloat16")[
                                    tok, (g * PH + u * THREADS + tid) * V + e]
                for u in T.unroll(U):
                    if g * PH + u * THREADS + tid < hv:
                        # the layer's input from the residual entering it
                        for e in T.unroll(V):
                            acc[e] = T.ieee_mul(pre[0], T.Cast("float32", rb[u, 0, e]))
                        for j in T.unroll(m - 1):
                            for e in T.unroll(V):
                                acc[e] = T.ieee_add(acc[e], T.ieee_mul(pre[j + 1], T.Cast("float32", rb[u, j + 1, e])))
                        for e in T.unroll(V):
                            lb[e] = T.Cast("bfloat16", acc[e])
                        T.stg128(T.make_tensor_from_addr(ptrs[1, i], (n, hv * V), "bfloat16")[
                            tok, (g * PH + u * THREADS + tid) * V], T.Tensor((1,), "uint32x4", lb.data)[0])
                        # the residual leaving it, one output stream at a time
                        for o in T.unroll(m):
                            for e in T.unroll(V):
                                acc[e] = T.ieee_mul(post[o], T.Cast("float32", ob[u, e]))
                            for j in T.unroll(m):
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_add(acc[e], T.ieee_mul(comb[j * m + o], T.Cast("float32", rb[u, j, e])))
                            for e in T.unroll(V):
                                nb[o, e] = T.Cast("bfloat16", acc[e])
                        for o in T.unroll(m):
                            T.stg128(T.make_tensor_from_addr(ptrs[5, i], (n, m, hv * V), "bfloat16")[
                                tok, o, (g * PH + u * THREADS + tid) * V], T.Tensor((m,), "uint32x4", nb.data)[o])
                        for o in T.unroll(m):
                            for e in T.unroll(V):
                                rb[u, o, e] = nb[o, e]
                        for e in T.unroll(V):
                            ob[u, e] = obn[u, e]
            if num_post < layers:
                for c in T.unroll(m // vm):
                    for k in T.vectorized(vm):
                        pre[c * vm + k] = T.make_tensor_from_addr(ptrs[0, num_post], (n, m), "float32")[
                            tok, c * vm + k]
                for u in T.unroll(U):
                    if g * PH + u * THREADS + tid < hv:
                        for e in T.unroll(V):
                            acc[e] = T.ieee_mul(pre[0], T.Cast("float32", rb[u, 0, e]))
                        for j in T.unroll(m - 1):
                            for e in T.unroll(V):
                                acc[e] = T.ieee_add(acc[e], T.ieee_mul(pre[j + 1], T.Cast("float32", rb[u, j + 1, e])))
                        for e in T.unroll(V):
                            lb[e] = T.Cast("bfloat16", acc[e])
                        T.stg128(T.make_tensor_from_addr(ptrs[1, num_post], (n, hv * V), "bfloat16")[
                            tok, (g * PH + u * THREADS + tid) * V], T.Tensor((1,), "uint32x4", lb.data)[0])

    return main


KERNELS = (
    KernelDecl(
        name="mhc.multilayer_recompute",
        factory=multilayer_recompute,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=(),  # it writes only through ptrs (the op checks those tensors)
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded by the element check
        doc="layer inputs and residuals of consecutive mHC layers, rebuilt from the first residual.",
    ),
)

__all__ = ["KERNELS", "MULTS", "THREADS", "U", "multilayer_recompute"]
