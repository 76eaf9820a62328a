"""Speed candidates of ``mhc.post_fwd`` (issue 9; ``post.py``, the ``cp`` ring): same parameters
``(x, residual, post_mix, comb_mix, out)``, same variant grid (``mhc`` 4, 2, 8), same output bits
(the per-element expression is the shipped one, unchanged); measured by the lead.

Where the shipped kernel loses (H200, mhc 4): 76.7 vs tile_kernels 76.5 us at 4096 x 4096, ahead
at the three larger shapes.  Per shape, ``T(8192 tokens) - T(4096 tokens)`` is the cost of 4096
tokens and ``2 T(4096) - T(8192)`` a fixed cost (ramp, tail, launch): at hidden 4096 ours is
70.3 us per 4096 tokens and 6.4 us fixed, tile_kernels' 71.2 and 5.3 (hidden 7168: 125.6 / 4.6 vs
126.0 / 4.4).  We stream faster and pay ~1 us more per launch; only the smallest shape shows it.

* ``_pdl``: the shipped kernel plus ``T.pdl_sync()`` (``griddepcontrol.wait``) before any global
  access, so the manifest marks it ``pdl`` and the runtime launches it with
  ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``: its blocks may be scheduled while the
  previous grid on the stream drains (they wait in ``griddepcontrol.wait`` until it has completed
  and its writes are visible: same results).  tile_kernels' ``mhc_post_fwd`` is the one mHC
  forward of theirs that calls ``T.pdl_sync()``; the hypothesis is that its ~1 us smaller fixed
  cost is that overlap.  (A launch-semantics change: the lead decides whether it may ship.)
* ``_pair``: blocks of ``PAIR_ITEMS`` = 2 consecutive items of the flat (token, chunk) list (grid
  ``ceil(num_tokens * nch / 2)``; a block may span two tokens: the mixes are reloaded at a chunk
  0, as the shipped cursors already do), ``S`` = 2 slots (both items copied at the block's start),
  8 blocks per SM at mhc 4 (20 KB shared each, up to 160 KB in flight per SM, was 5 x 40 KB).  At
  hidden 4096 a shipped block (4 items, S = 4) copies its whole row up front and then only computes
  and stores: no steady state, and the first wave's 660 blocks load and store in lock step; the tail
  unit is 72 KB.  Halved blocks on more slots per SM interleave loads and stores of different
  blocks sooner and halve the tail unit.  Risk: twice the block turnovers and at hidden 7168 a ring
  of 1 item ahead (the ``cpwide`` S = 3 candidate lost there).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from .post import BLOCKS, FWD_PASS_CONFIGS, MHC_VALUES, STAGES, THREADS, V, cp_async

PAIR_ITEMS = 2  # items per block of _pair
PAIR_STAGES = {2: 2, 4: 2, 8: 2}
PAIR_BLOCKS = {2: 10, 4: 8, 8: 3}


def post_fwd_variant(mhc: int, S: int, B: int, pair: bool, pdl: bool):
    """The shipped forward with ``S`` ring slots, ``B`` blocks per SM, the pair split or not, PDL or not."""
    K = mhc + 1
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    nvec = hidden // V
    nch = T.ceildiv(nvec, THREADS)  # chunks (items) per token
    # blocks: one per token (the shipped split), or one per PAIR_ITEMS consecutive items of the flat list
    G = T.ceildiv(num_tokens * nch, PAIR_ITEMS) if pair else num_tokens
    x_flat = (num_tokens * nvec * V,)
    r_flat = (num_tokens * mhc * nvec * V,)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), "bfloat16"),
        residual: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
        post_mix: T.Tensor((num_tokens, mhc), "float32"),
        comb_mix: T.Tensor((num_tokens, mhc, mhc), "float32"),
        out: T.Tensor((num_tokens, mhc, hidden), "bfloat16"),
    ):
        with T.Kernel(G, threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(B)
            tid = T.get_thread_binding()
            if pdl:
                T.pdl_sync()  # griddepcontrol.wait: the previous grid has finished, its writes are visible
            ring = T.alloc_shared((S, K, THREADS * V), "bfloat16")
            buf = T.alloc_local((K * V,), "bfloat16")
            pw = T.alloc_local((mhc,), "float32")
            cw = T.alloc_local((mhc * mhc,), "float32")
            acc = T.alloc_local((V,), "float32")
            ob = T.alloc_local((V,), "bfloat16")
            items = T.alloc_var("int32")
            ti = T.alloc_var("int32")  # the issue cursor: token and chunk of item j (no division per item)
            ci = T.alloc_var("int32")
            tc = T.alloc_var("int32")  # the compute cursor: token and chunk of item j - (S - 1)
            cc = T.alloc_var("int32")
            items = T.ceildiv(num_tokens * nch, G)  # per: block bx takes items bx * per .. (bx + 1) * per - 1
            ti = T.truncdiv(bx * items, nch)
            ci = T.truncmod(bx * items, nch)
            items = T.max(T.min(items, num_tokens * nch - bx * items), 0)  # (clipped at the end)
            tc = ti
            cc = ci
            # iteration j issues item j and computes item j - (S - 1)
            for j in T.serial(items + S - 1):
                T.sync_warp()  # a compiler fence: the last reads of slot j % S stay before its refill
                vi = ci * THREADS + tid
                ok = j < items and vi < nvec
                cp_async(ring[j % S, 0, tid * V], T.Tensor(x_flat, "bfloat16", x.data)[
                    (ti * nvec + vi) * V], V, ok)
                for m in T.unroll(mhc):
                    cp_async(ring[j % S, 1 + m, tid * V], T.Tensor(r_flat, "bfloat16", residual.data)[
                        ((ti * mhc + m) * nvec + vi) * V], V, ok)
                T.ptx_commit_group()  # one group per iteration, possibly empty
                ci = ci + 1
                if ci == nch:
                    ci = 0
                    ti = ti + 1
                if j >= S - 1:
                    jc = j - (S - 1)
                    vc = cc * THREADS + tid
                    if jc == 0 or cc == 0:  # the block's first item or a chunk 0: a new token's mixes
                        for m in T.unroll(mhc):
                            pw[m] = post_mix[tc, m]
                            for n in T.unroll(mhc):
                                cw[m * mhc + n] = comb_mix[tc, m, n]
                    T.ptx_wait_group(S - 1)  # item jc's copies (this thread's) have landed
                    T.sync_warp()  # the wait asm has no memory clobber: keep the reads below it
                    if vc < nvec:
                        for k in T.unroll(K):
                            for i in T.vectorized(V):
                                buf[k * V + i] = ring[jc % S, k, tid * V + i]
                        for n in T.unroll(mhc):
                            for i in T.unroll(V):
                                acc[i] = T.ieee_mul(pw[n], T.Cast("float32", buf[i]))
                            for m in T.unroll(mhc):
                                for i in T.unroll(V):
                                    acc[i] = T.ieee_fmaf(cw[m * mhc + n], T.Cast("float32", buf[(1 + m) * V + i]),
                                                         acc[i])
                            for i in T.vectorized(V):
                                ob[i] = T.Cast("bfloat16", acc[i])
                            T.stg128(T.Tensor(r_flat, "bfloat16", out.data)[((tc * mhc + n) * nvec + vc) * V],
                                     T.Tensor((1,), "uint32x4", ob.data)[0])
                    cc = cc + 1
                    if cc == nch:
                        cc = 0
                        tc = tc + 1

    return main


def _decl(tag: str, build, doc: str) -> KernelDecl:
    return KernelDecl(
        name=f"mhc._post_fwd_candidate_{tag}",
        factory=build,
        grid=tuple({"mhc": m} for m in MHC_VALUES),
        outputs=("out",),
        pass_configs=FWD_PASS_CONFIGS,
        doc=f"candidate mhc.post_fwd (internal): {doc}",
    )


def post_fwd_pdl(mhc: int):
    return post_fwd_variant(mhc, STAGES[mhc], BLOCKS[mhc], pair=False, pdl=True)


def post_fwd_pair(mhc: int):
    return post_fwd_variant(mhc, PAIR_STAGES[mhc], PAIR_BLOCKS[mhc], pair=True, pdl=False)


KERNELS = (
    _decl("pdl", post_fwd_pdl, "the shipped kernel launched with PDL (griddepcontrol.wait first)."),
    _decl("pair", post_fwd_pair, "blocks of 2 flat items, 2 ring slots, more blocks per SM."),
)

__all__ = ["KERNELS", "PAIR_ITEMS", "post_fwd_pair", "post_fwd_pdl", "post_fwd_variant"]
