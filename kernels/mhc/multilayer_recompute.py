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

Design (the shape of ``mhc.post_fwd``'s forward, ``post.py``): an *item* is one token's chunk of
``THREADS`` = 128 16-byte vectors (one per thread); a block of 128 threads walks ``ITEMS`` consecutive
items of the flat (token, chunk) list (grid ``ceil(tokens * chunks / ITEMS)``; a block may span two
tokens) with int32 (token, chunk) cursors stepped per item (one division per block).  Item ``j``'s
streamed vectors, the M residual streams and layers 0 and 1's outputs (zero-filled past the row or
where the layer does not exist), are copied by ``cp.async`` (16 bytes) into the thread's own part of
ring slot ``j % S``, ``S - 1`` items ahead of the math; a thread reads only the bytes it copied, so
``cp.async.wait_group S - 1`` is the only wait (no barrier, ``tl.disable_thread_storage_sync``).  Each
layer's new residual is written back over the slot's residual vectors once the old one is in
registers, so the next layer reads it from shared memory: the old and the new residual are never both
in registers.  Layer 0's pointer-table entries and layer 1's output pointer are loaded once per block
(the item loop loads no table entry for layers 0 and 1's outputs); mixes are loaded per item and layer
(16-byte broadcast loads, L1 hits after a token's first item), layer 0's before the ring wait; layers
>= 2 load their outputs by ``LDG`` at the layer's start.  Up to 2 post layers no DRAM load lands in a
register, so no mix load waits behind one (ptxas puts every 128-bit load on one scoreboard).
``CONFIGS`` (S, ITEMS, blocks per SM): M = 4 (2, 2, 5), M = 2 (2, 2, 8), M = 8 (2, 2, 2).  Element
offsets are int32 (the op refuses more than 2**31 - 1 residual elements).  SASS (nvcc 13.0): 96 / 61
/ 246 registers at M = 4 / 2 / 8, no spills; 24 KB shared per block at M = 4 (16 KB at M = 2, 40 KB at
M = 8).

Measured (H200, 2 layers, M = 4, n1 x hidden 4096 x 4096 / 4096 x 7168 / 8192 x 4096 / 8192 x 7168):
round 5's (3, 4, 5) 144.3 / 242.5 / 278.7 / 475.3 us (12:41 UTC 2026-12-02), the previous kernel 145.5 /
246.6 / 287.2 / 486.4 and tile_kernels 146.5 / 307.7 / 284.7 / 599.8 in that run.  Round 6 (14:14 UTC,
one run): (2, 2, 5) 141.0 / 239.4 / 273.5 / 469.4 us = 91.9 / 93.2 / 94.6 / 95.3 % of a copy of the same
traffic, against (3, 4, 5) 146.0 / 244.8 / 280.8 / 479.0 (88.8 / 91.2 / 92.1 / 93.4 %) and tile_kernels
148.3 / 307.9 / 287.2 / 601.1; two-item blocks make 12.4 waves at 4096 x 4096 instead of 6.2 (the last
one 20 % full).  M = 2 and 8 are checked bit for bit, not timed.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from ._ring import cp_async

THREADS = 128
V = 8  # bf16 per 16-byte vector
MULTS = (4, 2, 8)
# a thread reads only the ring bytes it copied: no block barriers; every access is guarded
# (loop unswitching off: it fails on the cp.async from a let-bound table entry, and would clone the item loop
# per num_post test)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True,
                "tl.disable_loop_unswitching": True}
# per M: (ring slots S, items per block, blocks per SM)
CONFIGS = {4: (2, 2, 5), 2: (2, 2, 8), 8: (2, 2, 2)}


def multilayer_recompute(mhc_mult: int, config: tuple = ()):
    """The PrimFunc for ``mhc_mult`` streams, configuration ``config`` (S, ITEMS, blocks per SM) or
    ``CONFIGS[mhc_mult]`` (see the module docstring)."""
    m = mhc_mult
    S, ITEMS, B = config or CONFIGS[m]
    K = m + 2  # vectors per thread and slot: layer 0's output, the M residual streams, layer 1's output
    vm = 4 if m % 4 == 0 else m  # fp32 per vector load of a mix row
    n, hidden, layers = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_layers")
    nvec = hidden // V  # vectors per token row
    nch = T.ceildiv(nvec, THREADS)  # items (chunks) per token
    total = n * nch
    G = T.ceildiv(total, ITEMS)
    x_flat = (n * nvec * V,)  # a [n, hidden] tensor, flat
    r_flat = (n * m * nvec * V,)  # a [n, M, hidden] tensor, flat

    @T.macro
    def load_pre(pre, tb, tok):
        for c in T.unroll(m // vm):
            for k in T.vectorized(vm):
                pre[c * vm + k] = tb[tok, c * vm + k]

    @T.macro
    def load_post_comb(post, comb, pt, ct, tok):
        for c in T.unroll(m // vm):
            for k in T.vectorized(vm):
                post[c * vm + k] = pt[tok, c * vm + k]
        for c in T.unroll(m * m // 4):
            for k in T.vectorized(4):
                comb[c * 4 + k] = ct[tok, c * 4 + k]

    @T.macro
    def load_r(rb, ring, slot, tid):
        for j in T.unroll(m):
            for e in T.vectorized(V):
                rb[j, e] = ring[slot, 1 + j, tid * V + e]

    @T.macro
    def layer_input(rb, pre, acc, lb, tb, xv):
        for e in T.unroll(V):
            acc[e] = T.ieee_mul(pre[0], T.Cast("float32", rb[0, e]))
        for j in T.unroll(m - 1):
            for e in T.unroll(V):
                acc[e] = T.ieee_add(acc[e], T.ieee_mul(pre[j + 1], T.Cast("float32", rb[j + 1, e])))
        for e in T.unroll(V):
            lb[e] = T.Cast("bfloat16", acc[e])
        T.stg128(tb[xv * V],
                 T.Tensor((1,), "uint32x4", lb.data)[0])

    @T.macro
    def layer_residual(rb, ob, post, comb, acc, nb, ring, slot, tid, tb, ro):
        # new[o] = post[o] * out + sum_j comb[j, o] * r[j]; stored, and written over the slot's stream o
        for o in T.unroll(m):
            for e in T.unroll(V):
                acc[e] = T.ieee_mul(post[o], T.Cast("float32", ob[e]))
            for j in T.unroll(m):
                for e in T.unroll(V):
                    acc[e] = T.ieee_add(acc[e], T.ieee_mul(comb[j * m + o], T.Cast("float32", rb[j, e])))
            for e in T.unroll(V):
                nb[e] = T.Cast("bfloat16", acc[e])
            T.stg128(tb[ro + o * (nvec * V)],
                     T.Tensor((1,), "uint32x4", nb.data)[0])
            for e in T.vectorized(V):
                ring[slot, 1 + o, tid * V + e] = nb[e]

    @T.prim_func
    def main(
        initial_residual: T.Tensor((n, m, hidden), "bfloat16"),
        ptrs: T.Tensor((6, layers), "int64"),
        num_post: T.int32,
    ):
        with T.Kernel(G, threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(B)
            tid = T.get_thread_binding()
            ring = T.alloc_shared((S, K, THREADS * V), "bfloat16")
            rb = T.alloc_local((m, V), "bfloat16")  # the residual entering the layer
            ob = T.alloc_local((V,), "bfloat16")  # the layer's output
            nb = T.alloc_local((V,), "bfloat16")
            lb = T.alloc_local((V,), "bfloat16")
            acc = T.alloc_local((V,), "float32")
            pre = T.alloc_local((m,), "float32")
            post = T.alloc_local((m,), "float32")
            comb = T.alloc_local((m * m,), "float32")
            items = T.alloc_var("int32")
            ti = T.alloc_var("int32")  # the issue cursor: token and chunk of item j
            ci = T.alloc_var("int32")
            tc = T.alloc_var("int32")  # the compute cursor: token and chunk of item j - (S - 1)
            cc = T.alloc_var("int32")
            # layer 0's table entries (and layer 1's output), bound once per block (let-bound values)
            # (layer 1's slot past the table: the last layer's entry, never dereferenced then)
            pre0 = T.make_tensor_from_addr(ptrs[0, 0], (n, m), "float32")
            in0 = T.make_tensor_from_addr(ptrs[1, 0], x_flat, "bfloat16")
            out0 = T.make_tensor_from_addr(ptrs[2, 0], x_flat, "bfloat16")
            post0 = T.make_tensor_from_addr(ptrs[3, 0], (n, m), "float32")
            comb0 = T.make_tensor_from_addr(ptrs[4, 0], (n, m * m), "float32")
            res0 = T.make_tensor_from_addr(ptrs[5, 0], r_flat, "bfloat16")
            out1 = T.make_tensor_from_addr(ptrs[2, T.min(1, layers - 1)], x_flat, "bfloat16")
            ti = T.truncdiv(bx * ITEMS, nch)
            ci = T.truncmod(bx * ITEMS, nch)
            items = T.min(ITEMS, total - bx * ITEMS)
            tc = ti
            cc = ci
            # iteration j issues item j and computes item j - (S - 1)
            for j in T.serial(items + S - 1):
                T.sync_warp()  # a compiler fence: the last accesses of slot j % S stay before its refill
                vi = ci * THREADS + tid
                ok = j < items and vi < nvec
                xi = (ti * nvec + vi) * V  # int32 element offsets (as post.py: n * M * hidden < 2^31)
                ri = (ti * (m * nvec) + vi) * V
                for q in T.unroll(m):
                    cp_async(ring[j % S, 1 + q, tid * V], T.Tensor(r_flat, "bfloat16", initial_residual.data)[
                        ri + q * (nvec * V)], V, ok)
                cp_async(ring[j % S, 0, tid * V], out0[xi], V, ok and num_post > 0)
                cp_async(ring[j % S, m + 1, tid * V], out1[xi], V, ok and num_post > 1)
                T.ptx_commit_group()  # one group per iteration, possibly empty
                ci = ci + 1
                if ci == nch:
                    ci = 0
                    ti = ti + 1
                if j >= S - 1:
                    slot = (j - (S - 1)) % S
                    vc = cc * THREADS + tid
                    xv = tc * nvec + vc  # int32 vector offsets (as post.py: n * M * hidden < 2^31)
                    ro = (tc * (m * nvec) + vc) * V
                    if vc < nvec:
                        # layer 0's mixes in flight during the ring wait
                        load_pre(pre, pre0, tc)
                        if num_post > 0:
                            load_post_comb(post, comb, post0, comb0, tc)
                    T.ptx_wait_group(S - 1)  # this thread's copies of the item have landed
                    T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                    if vc < nvec:
                        load_r(rb, ring, slot, tid)
                        layer_input(rb, pre, acc, lb, in0, xv)
                        if num_post > 0:
                            for e in T.vectorized(V):
                                ob[e] = ring[slot, 0, tid * V + e]
                            layer_residual(rb, ob, post, comb, acc, nb, ring, slot, tid, res0, ro)
                            for i1 in T.serial(num_post - 1):
                                i = i1 + 1
                                if i == 1:
                                    for e in T.vectorized(V):
                                        ob[e] = ring[slot, m + 1, tid * V + e]
                                else:
                                    for e in T.vectorized(V):
                                        ob[e] = T.make_tensor_from_addr(ptrs[2, i], x_flat, "bfloat16")[xv * V + e]
                                load_pre(pre, T.make_tensor_from_addr(ptrs[0, i], (n, m), "float32"), tc)
                                load_post_comb(post, comb, T.make_tensor_from_addr(ptrs[3, i], (n, m), "float32"),
                                               T.make_tensor_from_addr(ptrs[4, i], (n, m * m), "float32"), tc)
                                load_r(rb, ring, slot, tid)
                                layer_input(rb, pre, acc, lb,
                                            T.make_tensor_from_addr(ptrs[1, i], x_flat, "bfloat16"), xv)
                                layer_residual(rb, ob, post, comb, acc, nb, ring, slot, tid,
                                               T.make_tensor_from_addr(ptrs[5, i], r_flat, "bfloat16"), ro)
                            if num_post < layers:
                                load_pre(pre,
                                         T.make_tensor_from_addr(ptrs[0, num_post], (n, m), "float32"), tc)
                                load_r(rb, ring, slot, tid)
                                layer_input(rb, pre, acc, lb,
                                            T.make_tensor_from_addr(ptrs[1, num_post], x_flat, "bfloat16"), xv)
                    cc = cc + 1
                    if cc == nch:
                        cc = 0
                        tc = tc + 1

    return main


KERNELS = (
    KernelDecl(
        name="mhc.multilayer_recompute",
        factory=multilayer_recompute,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=(),  # it writes only through ptrs (the op checks those tensors)
        pass_configs=PASS_CONFIGS,
        doc="layer inputs and residuals of consecutive mHC layers, rebuilt from the first residual.",
    ),
)

__all__ = ["CONFIGS", "KERNELS", "MULTS", "THREADS", "multilayer_recompute"]
