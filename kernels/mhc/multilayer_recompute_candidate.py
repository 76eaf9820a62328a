"""Speed candidates for ``mhc.multilayer_recompute`` (issue 9, round 5): ``_ring`` and ``_ring2``,
``mhc.post_fwd``'s streaming design applied to the recompute.

Same parameters (``initial_residual`` bf16 ``[n, M, hidden]``, ``ptrs`` int64 ``[6, num_layers]``,
``num_post``), variants (``mhc_mult`` 4, 2, 8), written tensors and per-element fp32 expressions
(every product and sum rounded on its own, in the shipped order) as the shipped kernel
(``multilayer_recompute.py``): bit-identical outputs.  Launched directly
(``runtime.unchecked_launcher("mhc._multilayer_recompute_candidate_<tag>", mhc_mult=M)``) with the
op's pointer table; ``tests/gpu/test_gpu_cand_mhc_recompute.py`` checks them bit for bit.

Design (as ``post.py``'s forward): an *item* is one token's chunk of ``THREADS`` = 128 16-byte vectors
(one per thread); a block of 128 threads walks ``ITEMS[M]`` consecutive items of the flat (token,
chunk) list (grid ``ceil(tokens * chunks / ITEMS)``; a block may span two tokens), with int32
(token, chunk) cursors stepped per item (one division per block).  Item ``j``'s streamed vectors
are copied by ``cp.async`` (16 bytes, zero-filled past the row or where the stream does not
exist) into the thread's own part of ring slot ``j % S``, ``S - 1`` items ahead of the math; a
thread reads only the bytes it copied, so ``cp.async.wait_group S - 1`` is the only wait (no
barrier, ``tl.disable_thread_storage_sync``).  Slot layout (vectors per thread): layer 0's output,
the M residual streams, (``ring2``) layer 1's output.  Each layer's new residual is written back over
the slot's residual vectors (the thread's own bytes) once the old one is in registers, so the
next layer reads it from shared memory: the old and the new residual are never both in registers.

Layer 0's pointer-table entries (pre, input, output, post, comb, residual; ``ring`` also layer 1's
output) are loaded once per block into int64 variables: the item loop loads no table entry for
layer 0.  Mixes are loaded per item and layer (16-byte broadcast loads, L1 hits after a token's first
item), layer 0's before the ring wait.

- ``ring``: layer 1's output (and every later one) by ``LDG``, layer 1's issued before the ring
  wait (for the item about to be computed), so its latency overlaps the wait and layer 0's math.
- ``ring2``: layer 1's output also streamed through the ring (``M + 2`` vectors per slot; zero-filled
  when ``num_post < 2``): at 2 layers no DRAM load is a register load, so no mix load can share a
  scoreboard with a DRAM round trip (round 4: ptxas put every 128-bit load on one scoreboard);
  layers >= 2 load their outputs by ``LDG`` at the layer's start.

Configurations (``CONFIGS``: S, ITEMS, blocks per SM): M = 4 (3, 4, 5), M = 2 (2, 2, 8), M = 8 (2, 2,
2); post.py's (2, 2, 8) at M = 4 needs <= 64 registers and spilled even at 6 blocks (80 registers, 24-40
byte stack).  Element offsets are int32 (as post.py: n * M * hidden < 2^31).  Loop unswitching is off.

SASS (nvcc 13.0, sm_90a), registers M = 4 / 2 / 8: ring 96 / 62 / 249, ring2 96 / 61 / 246, no
stack, no spills; shared per block M = 4: 30 KB (ring) / 36 KB (ring2) (M = 2: 12 / 16 KB, M = 8:
36 / 40 KB); M = 4 loads in flight per SM (2 items ahead x 5 blocks): 100 KB (+10 KB of layer-1
output LDG) / 120 KB.  ring: ptxas issues layer 1's output load (``LD.E.128``) ahead of layer 0's
mix loads, so the first mix use waits on that DRAM load too (the round-4 scoreboard finding);
ring2 has no DRAM register load at <= 2 post layers.  Unmeasured.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
V = 8  # bf16 per 16-byte vector
MULTS = (4, 2, 8)
# a thread reads only the ring bytes it copied: no block barriers; every access is guarded
# (loop unswitching off: it fails on the cp.async from a let-bound table entry, and would clone the item loop
# per num_post test)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True,
                "tl.disable_loop_unswitching": True}
# per tag and M: (ring slots S, items per block, blocks per SM)
CONFIGS = {
    "ring": {4: (3, 4, 5), 2: (2, 2, 8), 8: (2, 2, 2)},
    "ring2": {4: (3, 4, 5), 2: (2, 2, 8), 8: (2, 2, 2)},
}


def cp_async(dst, src, n, pred):
    """One 16-byte ``cp.async`` of ``n`` elements into shared memory, zero-filling when ``pred`` is false."""
    return T.ptx_cp_async(T.access_ptr(dst, "w", n), T.access_ptr(src, "r", n), n, pred)


def recompute_candidate(mhc_mult: int, tag: str):
    """The PrimFunc for ``mhc_mult`` streams, configuration ``CONFIGS[tag]`` (see the module docstring)."""
    m = mhc_mult
    S, ITEMS, B = CONFIGS[tag][m]
    out1_ring = tag == "ring2"
    K = m + 2 if out1_ring else m + 1  # vectors per thread and slot
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
            ob1 = T.alloc_local((V,), "bfloat16")  # ring: layer 1's output, loaded before the ring wait
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
                if out1_ring:
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
                        # layer 0's mixes (and, ring, layer 1's output) in flight during the ring wait
                        load_pre(pre, pre0, tc)
                        if num_post > 0:
                            load_post_comb(post, comb, post0, comb0, tc)
                        if not out1_ring:
                            if num_post > 1:
                                for e in T.vectorized(V):
                                    ob1[e] = out1[xv * V + e]
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
                                    if out1_ring:
                                        for e in T.vectorized(V):
                                            ob[e] = ring[slot, m + 1, tid * V + e]
                                    else:
                                        for e in T.vectorized(V):
                                            ob[e] = ob1[e]
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


def recompute_candidate_ring(mhc_mult: int):
    """post.py's ring: residual and layer 0's output by cp.async; layer 1's output by LDG before the wait."""
    return recompute_candidate(mhc_mult, "ring")


def recompute_candidate_ring2(mhc_mult: int):
    """The ring with layer 1's output streamed too (M + 2 vectors per slot)."""
    return recompute_candidate(mhc_mult, "ring2")


def _decl(tag: str, factory, doc: str) -> KernelDecl:
    return KernelDecl(
        name=f"mhc._multilayer_recompute_candidate_{tag}",
        factory=factory,
        grid=tuple({"mhc_mult": m} for m in MULTS),
        outputs=(),  # it writes only through ptrs (the op checks those tensors)
        pass_configs=PASS_CONFIGS,
        doc=f"Speed candidate for mhc.multilayer_recompute: {doc}.",
    )


KERNELS = (
    _decl("ring", recompute_candidate_ring,
          "items of 128 vectors in 2-item blocks, residual and layer 0's output through a cp.async ring"),
    _decl("ring2", recompute_candidate_ring2,
          "as ring, layer 1's output streamed through the ring too"),
)

__all__ = ["CONFIGS", "KERNELS", "MULTS", "THREADS", "recompute_candidate"]
