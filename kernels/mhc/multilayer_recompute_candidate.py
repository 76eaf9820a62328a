"""``mhc._multilayer_recompute_candidate``: a speed candidate for ``mhc.multilayer_recompute``
(issue 9): same parameters, variants (``mhc_mult`` 4, 2, 8) and bits; the bench and
``tests/gpu/test_gpu_cand_mhc.py`` launch it directly
(``runtime.unchecked_launcher("mhc._multilayer_recompute_candidate", mhc_mult=M)`` with the
op's ``ptrs`` table).

Parameters (as the shipped kernel): ``initial_residual`` bf16 ``[n, M, hidden]``, ``ptrs`` int64
``[6, num_layers]`` (rows: pre_mix, layer_input, layer_output, post_mix, comb_mix, residual
data pointers), ``num_post`` (``num_layers - 1`` or ``num_layers``).  Per token and element, with
``r`` the fp32 residual, every product and sum rounded on its own in the shipped order::

    for i < num_post:
        layer_input[i] = bf16(sum_j pre_mix[i][j] * r[j])
        residual[i][o] = bf16(post_mix[i][o] * layer_output[i] + sum_j comb_mix[i][j, o] * r[j])
        r = fp32(residual[i])
    if num_post < num_layers:  layer_input[num_post] = bf16(sum_j pre_mix[num_post][j] * r[j])

Why: the shipped kernel's block (grid tokens x segments of 256 vectors, 2 vectors per thread and
stream) loads its residual and first layer output, runs the layers and exits; at hidden 7168 every
fourth block is half idle, and within a block nothing overlaps the first loads' latency.  Here a
block owns a token and walks its row in chunks of 128 vectors (one per thread and stream; 4 at
hidden 4096, 7 at 7168) through a two-slot register ring: chunk ``k + 1``'s residual and first
layer output (``M + 1`` ``LDG.E.128``) are issued before chunk ``k``'s layers, whose next layer
output is loaded before each layer's math as before.  The mixes are reloaded per chunk and layer
(16-byte loads that hit L1 after the first chunk).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
D = 2  # chunks in the register ring
MULTS = (4, 2, 8)
MIN_BLOCKS = {2: 6, 4: 4, 8: 2}  # __launch_bounds__ minimum blocks per SM


def multilayer_recompute_candidate(mhc_mult: int):
    """Build the PrimFunc for ``mhc_mult`` streams."""
    m = mhc_mult
    vm = 4 if m % 4 == 0 else m  # fp32 per vector load of a mix row
    S = m + 1  # ring vectors per chunk: the residual's streams, then the first layer output
    n, hidden, layers = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_layers")
    hv = hidden // V  # vectors per token row
    r_flat = (n * m * hv * V,)
    o_flat = (n * hv * V,)

    @T.prim_func
    def main(
        initial_residual: T.Tensor((n, m, hidden), "bfloat16"),
        ptrs: T.Tensor((6, layers), "int64"),
        num_post: T.int32,
    ):
        with T.Kernel(n, threads=THREADS) as tok:
            T.annotate_min_blocks_per_sm(MIN_BLOCKS[m])
            tid = T.get_thread_binding()
            ring = T.alloc_local((D * S * V,), "bfloat16")
            nb = T.alloc_local((m * V,), "bfloat16")  # the residual leaving a layer
            lb = T.alloc_local((V,), "bfloat16")
            obn = T.alloc_local((V,), "bfloat16")  # the next layer's output, loaded early
            acc = T.alloc_local((V,), "float32")
            pre = T.alloc_local((m,), "float32")
            post = T.alloc_local((m,), "float32")
            comb = T.alloc_local((m * m,), "float32")
            ov = T.alloc_var("int32")  # vector index of the thread's chunk-0 vector in a [n, hidden] row
            rv = T.alloc_var("int32")  # ... and of its stream-0 vector in a [n, M, hidden] row
            ov = tok * hv + tid
            rv = tok * m * hv + tid
            if tid < hv:  # prologue: chunk 0 into slot 0
                for j in T.unroll(m):
                    for e in T.vectorized(V):
                        ring[j * V + e] = T.Tensor(r_flat, "bfloat16", initial_residual.data)[(rv + j * hv) * V + e]
                if num_post > 0:
                    for e in T.vectorized(V):
                        ring[m * V + e] = T.make_tensor_from_addr(ptrs[2, 0], o_flat, "bfloat16")[ov * V + e]
            for p in T.serial(T.ceildiv(T.ceildiv(hv, THREADS), D)):
                for s in T.unroll(D):
                    # issue chunk p*D + s + 1 into slot 1 - s, then run the layers on chunk p*D + s (slot s)
                    if (p * D + s + 1) * THREADS + tid < hv:
                        for j in T.unroll(m):
                            for e in T.vectorized(V):
                                ring[((1 - s) * S + j) * V + e] = T.Tensor(r_flat, "bfloat16", initial_residual.data)[
                                    (rv + j * hv + (p * D + s + 1) * THREADS) * V + e]
                        if num_post > 0:
                            for e in T.vectorized(V):
                                ring[((1 - s) * S + m) * V + e] = T.make_tensor_from_addr(
                                    ptrs[2, 0], o_flat, "bfloat16")[(ov + (p * D + s + 1) * THREADS) * V + e]
                    if (p * D + s) * THREADS + tid < hv:
                        for i in T.serial(num_post):
                            for c in T.unroll(m // vm):
                                for k in T.vectorized(vm):
                                    pre[c * vm + k] = T.make_tensor_from_addr(ptrs[0, i], (n, m), "float32")[
                                        tok, c * vm + k]
                            for c in T.unroll(m // vm):
                                for k in T.vectorized(vm):
                                    post[c * vm + k] = T.make_tensor_from_addr(ptrs[3, i], (n, m), "float32")[
                                        tok, c * vm + k]
                            for c in T.unroll(m * m // 4):
                                for k in T.vectorized(4):
                                    comb[c * 4 + k] = T.make_tensor_from_addr(ptrs[4, i], (n, m * m), "float32")[
                                        tok, c * 4 + k]
                            if i + 1 < num_post:  # no output overlaps an input (the op checks)
                                for e in T.vectorized(V):
                                    obn[e] = T.make_tensor_from_addr(ptrs[2, i + 1], o_flat, "bfloat16")[
                                        (ov + (p * D + s) * THREADS) * V + e]
                            # the layer's input from the residual entering it
                            for e in T.unroll(V):
                                acc[e] = T.ieee_mul(pre[0], T.Cast("float32", ring[(s * S) * V + e]))
                            for j in T.unroll(m - 1):
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_add(
                                        acc[e], T.ieee_mul(pre[j + 1],
                                                           T.Cast("float32", ring[(s * S + j + 1) * V + e])))
                            for e in T.unroll(V):
                                lb[e] = T.Cast("bfloat16", acc[e])
                            T.stg128(T.make_tensor_from_addr(ptrs[1, i], o_flat, "bfloat16")[
                                (ov + (p * D + s) * THREADS) * V], T.Tensor((1,), "uint32x4", lb.data)[0])
                            # the residual leaving it, one output stream at a time
                            for o in T.unroll(m):
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_mul(post[o], T.Cast("float32", ring[(s * S + m) * V + e]))
                                for j in T.unroll(m):
                                    for e in T.unroll(V):
                                        acc[e] = T.ieee_add(
                                            acc[e], T.ieee_mul(comb[j * m + o],
                                                               T.Cast("float32", ring[(s * S + j) * V + e])))
                                for e in T.unroll(V):
                                    nb[o * V + e] = T.Cast("bfloat16", acc[e])
                            for o in T.unroll(m):
                                T.stg128(T.make_tensor_from_addr(ptrs[5, i], r_flat, "bfloat16")[
                                    (rv + o * hv + (p * D + s) * THREADS) * V], T.Tensor((m,), "uint32x4", nb.data)[o])
                            for o in T.unroll(m):
                                for e in T.unroll(V):
                                    ring[(s * S + o) * V + e] = nb[o * V + e]
                            for e in T.unroll(V):
                                ring[(s * S + m) * V + e] = obn[e]
                        if num_post < layers:
                            for c in T.unroll(m // vm):
                                for k in T.vectorized(vm):
                                    pre[c * vm + k] = T.make_tensor_from_addr(ptrs[0, num_post], (n, m), "float32")[
                                        tok, c * vm + k]
                            for e in T.unroll(V):
                                acc[e] = T.ieee_mul(pre[0], T.Cast("float32", ring[(s * S) * V + e]))
                            for j in T.unroll(m - 1):
                                for e in T.unroll(V):
                                    acc[e] = T.ieee_add(
                                        acc[e], T.ieee_mul(pre[j + 1],
                                                           T.Cast("float32", ring[(s * S + j + 1) * V + e])))
                            for e in T.unroll(V):
                                lb[e] = T.Cast("bfloat16", acc[e])
                            T.stg128(T.make_tensor_from_addr(ptrs[1, num_post], o_flat, "bfloat16")[
                                (ov + (p * D + s) * THREADS) * V], T.Tensor((1,), "uint32x4", lb.data)[0])

    return main


KERNELS = (
    KernelDecl(
        name="mhc._multilayer_recompute_candidate",
        factory=multilayer_recompute_candidate,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=(),  # it writes only through ptrs (the op checks those tensors)
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded by the element check
        doc="Speed candidate for mhc.multilayer_recompute (same parameters, variants and bits): a block per token, "
            "register ring.",
    ),
)

__all__ = ["KERNELS", "MULTS", "THREADS", "multilayer_recompute_candidate"]
