"""Speed candidates for ``mhc.multilayer_recompute`` (issue 9, round 4): ``_hoist``.

Same parameters (``initial_residual`` bf16 ``[n, M, hidden]``, ``ptrs`` int64 ``[6, num_layers]``,
``num_post``), grid ``(tokens, ceil(hidden / (8 * 128 * U)))``, 128 threads, ``U`` = 2 vectors per
thread and stream, variants (``mhc_mult`` 4, 2, 8) and per-element expressions as the shipped kernel
(``multilayer_recompute.py``): bit-identical outputs.  Launched directly
(``runtime.unchecked_launcher("mhc._multilayer_recompute_candidate_<tag>", mhc_mult=M)``) with the
op's pointer table; ``tests/gpu/test_gpu_cand_mhc_recompute.py`` checks them bit for bit.

Why round 3's ``pf`` lost 6-7 % (SASS, nvcc 13.0, M = 4): every lane's ``LDGSTS`` needs its ``ptrs``
entry, and it sat between the ``ptrs`` load and the next one (the first layer output's pointer),
so each block started with 2 serialized ``ptrs`` round trips before its first output load and 2
more (``LDGSTS`` of layer i + 1, then the next output's pointer) before each layer's math; on top,
the loop head waits on scoreboard SB5, which holds every 128-bit load (residual, outputs).

The shipped kernel has that same SB5 wait, hidden in its first loop iteration: ptxas gives all 128-bit
loads (residual, layer output, mixes) one scoreboard, and the second mix ``LD.E.128`` of the loop
body (``0x780``) waits on SB5, i.e. on all 8 residual vectors and the layer output.  So a block
issues its layer-0 mix loads (post, comb) and the next layer's output load only after its residual
has arrived: two serialized DRAM round trips before the first math, where one would do (the
``ptrs`` entries themselves are ``LDG.E.64.CONSTANT``, mostly L1 hits).

``hoist``: layer 0 is peeled into the prologue.  The block first loads its ``ptrs`` entries (pre,
output, post, comb of layer 0, output of layer 1) into registers, then the residual, then (after
only the ``ptrs`` round trip) layer 0's output and mixes and layer 1's output: every load the first
layer needs, and the next output, in flight together before any wait on data.  The loop is rotated:
iteration ``i`` does layer ``i``'s math and stores, then loads layer ``i + 1``'s mixes (the pre row
also for the trailing input-only layer) and layer ``i + 2``'s output.  Hypothesis: block life
shorter by about one loaded DRAM latency (~1 us of ~9.4 us per block at 4096 x 4096), so more
blocks per unit time at the same 4 blocks / SM.

(``hoist5``, the same at ``__launch_bounds__(128, 5)``, was dropped unmeasured: 96 registers and a
56-byte stack at M = 4.)

SASS of ``hoist`` (nvcc 13.0, sm_90a; registers M = 4 / 2 / 8: 122 / 105 / 240, no spills; shipped
123 / 96 / 251; 800 FMUL + FADD at M = 4 as shipped): the hypothesis is only partly realized.
ptxas still (1) moves the layer-0 pre row to uniform registers (``R2UR``) and waits for that
``LD.E.128`` (SB2) before a ``num_post > 0`` branch it re-forms, and (2) sinks the ``ptrs`` loads of
rows 2-4 into that branch, so layer 0's output / post / comb loads issue after one pre-mix round
trip (not after the residual's, as shipped); layer 1's output pointer is loaded with the residual.
SASS facts in the commit message / report (registers M = 4 / 2 / 8; shipped 123 / 96 / 251).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
U = 2  # vectors per thread and stream (as shipped)
V = 8  # bf16 per 16-byte vector
MULTS = (4, 2, 8)
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}  # every access is guarded by the element check


def recompute_candidate(mhc_mult: int, blocks4: int):
    """The shipped kernel with layer 0's loads hoisted into the prologue (pointer table first) and
    the loop rotated; ``blocks4`` blocks per SM for M <= 4 (M = 8: 2, as shipped)."""
    m = mhc_mult
    vm = 4 if m % 4 == 0 else m  # fp32 per vector load of a mix row
    n, hidden, layers = T.dynamic("num_tokens"), T.dynamic("hidden"), T.dynamic("num_layers")
    hv = hidden // V  # vectors per token row
    PH = THREADS * U  # vectors per segment
    min_blocks = blocks4 if m <= 4 else 2

    @T.macro
    def load_pre(pre, addr, tok):
        for c in T.unroll(m // vm):
            for k in T.vectorized(vm):
                pre[c * vm + k] = T.make_tensor_from_addr(addr, (n, m), "float32")[tok, c * vm + k]

    @T.macro
    def load_post_comb(post, comb, paddr, caddr, tok, ok):
        for c in T.unroll(m // vm):
            if ok:  # one predicated load each (no branch around the group)
                for k in T.vectorized(vm):
                    post[c * vm + k] = T.make_tensor_from_addr(paddr, (n, m), "float32")[tok, c * vm + k]
        for c in T.unroll(m * m // 4):
            if ok:
                for k in T.vectorized(4):
                    comb[c * 4 + k] = T.make_tensor_from_addr(caddr, (n, m * m), "float32")[tok, c * 4 + k]

    @T.macro
    def load_out(buf, addr, tok, g, tid, ok):
        for u in T.unroll(U):
            if ok and g * PH + u * THREADS + tid < hv:
                for e in T.vectorized(V):
                    buf[u, e] = T.make_tensor_from_addr(addr, (n, hv * V), "bfloat16")[
                        tok, (g * PH + u * THREADS + tid) * V + e]

    @T.macro
    def layer_input(rb, pre, lb, acc, addr, tok, g, tid, u):
        for e in T.unroll(V):
            acc[e] = T.ieee_mul(pre[0], T.Cast("float32", rb[u, 0, e]))
        for j in T.unroll(m - 1):
            for e in T.unroll(V):
                acc[e] = T.ieee_add(acc[e], T.ieee_mul(pre[j + 1], T.Cast("float32", rb[u, j + 1, e])))
        for e in T.unroll(V):
            lb[e] = T.Cast("bfloat16", acc[e])
        T.stg128(T.make_tensor_from_addr(addr, (n, hv * V), "bfloat16")[
            tok, (g * PH + u * THREADS + tid) * V], T.Tensor((1,), "uint32x4", lb.data)[0])

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
            obn = T.alloc_local((U, V), "bfloat16")  # the next layer's, loaded a layer early
            acc = T.alloc_local((V,), "float32")
            pre = T.alloc_local((m,), "float32")
            post = T.alloc_local((m,), "float32")
            comb = T.alloc_local((m * m,), "float32")
            pv = T.alloc_local((5,), "int64")  # layer 0's pre, output, post, comb and layer 1's output pointers
            # the pointer table first: its round trip overlaps the residual loads' issue
            # unconditional (no branch for ptxas to schedule them after): slots past num_post are only read
            pv[0] = ptrs[0, 0]
            pv[1] = ptrs[2, 0]
            pv[2] = ptrs[3, 0]
            pv[3] = ptrs[4, 0]
            pv[4] = ptrs[2, T.min(1, layers - 1)]
            for u in T.unroll(U):
                if g * PH + u * THREADS + tid < hv:
                    for j in T.unroll(m):
                        for e in T.vectorized(V):
                            rb[u, j, e] = T.Tensor((n, m, hv * V), "bfloat16", initial_residual.data)[
                                tok, j, (g * PH + u * THREADS + tid) * V + e]
            # every load of layer 0 (and layer 1's output) before any wait on data
            # (per-load predicates, no branch: ptxas would sink the pointer loads into one, after the residual's)
            load_out(ob, pv[1], tok, g, tid, num_post > 0)
            load_post_comb(post, comb, pv[2], pv[3], tok, num_post > 0)
            # no output overlaps an input (the op checks), so reading early is safe
            load_out(obn, pv[4], tok, g, tid, num_post > 1)
            load_pre(pre, pv[0], tok)  # last: ptxas moves it to uniform registers (a wait on its data)
            for i in T.serial(num_post):
                for u in T.unroll(U):
                    if g * PH + u * THREADS + tid < hv:
                        layer_input(rb, pre, lb, acc, ptrs[1, i], tok, g, tid, u)
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
                # rotated: the next layer's mixes (its pre row also for the trailing input-only layer)
                if i + 1 < layers:
                    load_pre(pre, ptrs[0, i + 1], tok)
                if i + 1 < num_post:
                    load_post_comb(post, comb, ptrs[3, i + 1], ptrs[4, i + 1], tok, True)
                if i + 2 < num_post:
                    load_out(obn, ptrs[2, i + 2], tok, g, tid, True)
            if num_post < layers:
                for u in T.unroll(U):
                    if g * PH + u * THREADS + tid < hv:
                        layer_input(rb, pre, lb, acc, ptrs[1, num_post], tok, g, tid, u)

    return main


def recompute_candidate_hoist(mhc_mult: int):
    """Layer 0's loads in the prologue (pointer table first), loop rotated; 4 blocks / SM as shipped."""
    return recompute_candidate(mhc_mult, 4)


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
    _decl("hoist", recompute_candidate_hoist,
          "layer 0's loads in the prologue, pointer table first (no residual wait before the mix loads)"),
)

__all__ = ["KERNELS", "MULTS", "THREADS", "U", "recompute_candidate"]
