"""``moe.get_fused_mapping``: the token-major <-> expert-major mapping of a fused MoE layout.

Parameters, in order: ``topk_idx`` int64 ``[num_tokens, num_topk]``; outputs ``pos_to_expert``,
``pos_to_token``, ``pos_to_token_topk`` int32 ``[num_expanded_tokens]``, ``token_topk_to_pos``
int32 ``[num_tokens, num_topk]``, ``expert_start``, ``expert_end``, ``num_tokens_per_expert``
int32 ``[num_experts]``; ``workspace`` int32 ``[num_blocks + 1, num_experts]`` (contents on
entry do not matter; the ``redundant`` variant does not touch it); scalar ``alignment`` (>= 1).
Every extent is a runtime symbol, so one cubin per variant serves every shape, expert count
(<= ``MAX_EXPERTS``) and alignment.

The layout (identical for any block count, hence any SM count, and either variant): entry ``i``
of the flattened index tensor (``i = token * num_topk + k``) with expert ``e`` in
``[0, num_experts)`` lands at ``expert_start[e] + (number of entries j < i with expert e)``;
expert ``e`` owns ``[expert_start[e], expert_end[e])``, ``count(e)`` rounded up to
``alignment`` slots, experts back to back from 0.  Unused slots (each expert's padding, and
everything past the last expert) hold -1 in the three ``pos_to_*`` arrays; entries that are -1
or out of range get ``token_topk_to_pos = -1``.  Slots at or past ``num_expanded_tokens`` are
not written (the entry's ``token_topk_to_pos`` still names them): the caller sizes the buffer.

Variants (``redundant``, ``unroll``):

* ``True``: a plain launch of ``num_blocks`` blocks (no grid barrier) in which every block
  counts all entries and scans the experts itself (the op takes it for decode-sized inputs,
  where a second read of a few KB of indices is cheaper than a grid barrier); warp ``w``'s run
  is walked by block ``w % num_blocks``, and padding and the tail are spread over all blocks
  (one SM writes only about one sector per cycle: 390 KB of -1 at alignment 128 take ~6 us in
  one block).  The workspace is not touched.
* ``False``: a cooperative launch, at most one block per SM.  Phase 1: global warp ``g`` counts
  its contiguous run of flat entries per expert in shared memory, each block writes its
  per-expert sums to ``workspace[block]``; ``T.sync_grid()``.  Phase 2: per expert, exclusive
  prefixes over blocks (a shuffle scan, written back in place) and the total to
  ``workspace[num_blocks]``, spread over all warps of the grid; ``T.sync_grid()``.  Up to
  ``SMALL_E`` experts, phase 2 is instead done by every block for itself (warp ``w`` sums rows
  ``w, w + 8, ...`` whole, lanes over experts, so each block reads each workspace sector once,
  all loads in flight; the warps' sums meet in shared memory) and the second grid barrier is
  skipped.

Then (both variants) every block scans the aligned totals over experts and adds its block and
warp prefixes: each warp's first slot per expert.  Warps walk their runs in order, 32 entries at
a time: ``__match_any_sync`` groups lanes with the same expert, the rank among lower lanes gives
the slot, the group's first lane advances the base; the first trip of each warp's run (``32 *
unroll`` entries) stays in registers between the count and the slot walk.  ``unroll`` (4, or 1 for
the cooperative variant): the entries a warp takes per trip, 32 each; a warp's run is a whole
number of trips, so with 1 a small input's walk is spread over 4x the blocks (the op takes it
when one 32-entry trip per warp fits the grid).  Padding is written by groups of
``2**gs`` lanes (the smallest power of two >= ``alignment - 1``, at most 32), one expert per
group and consecutive slots per lane, so each store instruction covers whole sectors (one
thread per expert would scatter 32 sectors per store, and one SM issues about one sector per
cycle); the tail past the last expert is written by all threads of the grid.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256  # threads per block
WARPS = THREADS // 32
MAX_EXPERTS = 1024
EXPERTS_PER_THREAD = MAX_EXPERTS // THREADS
MAX_BLOCKS = 256  # workspace rows a warp scans: 32 lanes x BLOCKS_PER_LANE
BLOCKS_PER_LANE = MAX_BLOCKS // 32
FULL = 0xFFFFFFFF
SMALL_E = 64  # up to this many experts the cooperative variant needs one grid barrier, not two
ROWS_PER_WARP = MAX_BLOCKS // WARPS  # workspace rows each warp sums in the few-experts phase 2
ROW_GROUP = 8  # ... in groups of this many, each skipped as a whole when past the grid
# unroll 1: a warp takes 32 entries a trip, so small inputs spread their walk over 4x the blocks
VARIANTS = ({"redundant": False, "unroll": 4}, {"redundant": False, "unroll": 1}, {"redundant": True, "unroll": 4})


def get_fused_mapping(redundant: bool, unroll: int):
    """Build the PrimFunc: blocks that each count every entry (plain launch) or a cooperative grid;
    ``unroll``: the index loads each lane issues per trip (a warp takes ``32 * unroll`` entries a trip)."""
    step = 32 * unroll
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")
    num_slots = T.dynamic("num_expanded_tokens")
    num_experts = T.dynamic("num_experts")
    ws_rows = T.dynamic("workspace_rows")
    numel = num_tokens * num_topk
    nblocks = ws_rows - 1
    counting = 1 if redundant else nblocks  # the blocks the runs are spread over
    # entries per warp run: a multiple of step, so all lanes of a warp take the same trips
    run = T.ceildiv(T.ceildiv(numel, counting * WARPS), step) * step
    per = T.ceildiv(num_experts, THREADS)  # experts each thread owns in the scan
    walkers = nblocks if redundant else 1  # redundant: warp w's run is walked by block w % nblocks

    @T.macro
    def load_run(topk_idx, evs, first):
        """``evs[u]`` = the expert of flat entry ``first + 32 u`` as int32, -1 when the entry is
        past the end, -1 or out of range (all loads issued before any use)."""
        e64 = T.alloc_local((unroll,), "int64")
        for u in T.unroll(unroll):
            e64[u] = T.int64(-1)
            if first + u * 32 < numel:
                e64[u] = T.Tensor((numel,), "int64", topk_idx.data)[first + u * 32]
        for u in T.unroll(unroll):
            evs[u] = T.if_then_else(e64[u] >= T.int64(0) and e64[u] < T.Cast("int64", num_experts),
                                    T.Cast("int32", e64[u]), -1)

    @T.macro
    def fill(pos_to_expert, pos_to_token, pos_to_token_topk, pos):
        pos_to_expert[pos] = -1
        pos_to_token[pos] = -1
        pos_to_token_topk[pos] = -1

    @T.prim_func
    def main(
        topk_idx: T.Tensor((num_tokens, num_topk), "int64"),
        pos_to_expert: T.Tensor((num_slots,), "int32"),
        pos_to_token: T.Tensor((num_slots,), "int32"),
        pos_to_token_topk: T.Tensor((num_slots,), "int32"),
        token_topk_to_pos: T.Tensor((num_tokens, num_topk), "int32"),
        expert_start: T.Tensor((num_experts,), "int32"),
        expert_end: T.Tensor((num_experts,), "int32"),
        num_tokens_per_expert: T.Tensor((num_experts,), "int32"),
        workspace: T.Tensor((ws_rows, num_experts), "int32"),
        alignment: T.int32,
    ):
        with T.Kernel(nblocks, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            cnt = T.alloc_shared((WARPS, MAX_EXPERTS), "int32")  # per-warp counts, later bases
            s_pad = T.alloc_shared((MAX_EXPERTS,), "int32")  # first padding slot of each expert
            s_end = T.alloc_shared((MAX_EXPERTS,), "int32")  # end of each expert's slots
            warp_sum = T.alloc_shared((WARPS,), "int32")
            part = T.alloc_shared((2, WARPS, SMALL_E), "int32")  # few experts: per-warp totals and prefixes
            rows_c = T.alloc_local((ROWS_PER_WARP,), "int32")
            vals = T.alloc_local((BLOCKS_PER_LANE,), "int32")
            tot = T.alloc_local((EXPERTS_PER_THREAD,), "int32")
            pre = T.alloc_local((EXPERTS_PER_THREAD,), "int32")
            aln = T.alloc_local((EXPERTS_PER_THREAD,), "int32")  # aligned totals
            keep = T.alloc_local((unroll,), "int32")
            evs = T.alloc_local((unroll,), "int32")
            acc = T.alloc_var("int32")
            run_sum = T.alloc_var("int32")
            incl = T.alloc_var("int32")
            up = T.alloc_var("int32")
            ex = T.alloc_var("int32")
            mask = T.alloc_var("uint32")
            pos = T.alloc_var("int32")
            rank = T.alloc_var("int32")
            aligned = T.alloc_var("int32")
            gs = T.alloc_var("int32")

            # ---- phase 1: per-warp counts of each warp's run; per-expert block sums
            for j in T.serial(T.ceildiv(num_experts, THREADS)):
                if j * THREADS + tid < num_experts:
                    for w in T.unroll(WARPS):
                        cnt[w, j * THREADS + tid] = 0
            T.sync_threads()
            base = T.alloc_var("int32")
            base = ((0 if redundant else bx) * WARPS + warp) * run
            for u in T.unroll(unroll):
                keep[u] = -1
            for it in T.serial(run // step):
                load_run(topk_idx, evs, base + it * step + lane)
                for u in T.unroll(unroll):
                    if it == 0:
                        keep[u] = evs[u]
                    if evs[u] >= 0:
                        T.atomic_add(cnt[warp, evs[u]], 1)
            T.sync_threads()
            # thread tid owns experts [tid * per, tid * per + per) from here to the slot bases
            for j in T.unroll(EXPERTS_PER_THREAD):
                tot[j] = 0
                pre[j] = 0
                if j < per and tid * per + j < num_experts:
                    acc = 0
                    for w in T.unroll(WARPS):
                        acc = acc + cnt[w, tid * per + j]
                    if redundant:
                        tot[j] = acc
                    else:
                        workspace[bx, tid * per + j] = acc

            if not redundant:
                T.sync_grid()
                if num_experts <= SMALL_E:
                    # ---- phase 2, few experts: every block sums the workspace itself -- no 2nd barrier.
                    # Warp w reads rows w, w + WARPS, ... whole (lane l: experts l, l + 32; coalesced,
                    # each row's sectors read once per block), all loads in flight; per-warp totals
                    # and prefixes (rows < bx) meet in shared memory
                    # This phase is issue-bound (8 warps on 4 schedulers, ~600 instructions each when
                    # every row and chunk was unrolled): chunks of experts and groups of ROW_GROUP
                    # rows past the grid are skipped by uniform branches
                    for c in T.unroll(SMALL_E // 32):
                        if c * 32 < num_experts:
                            for g in T.unroll(ROWS_PER_WARP // ROW_GROUP):
                                if g * ROW_GROUP * WARPS < nblocks:
                                    for r in T.unroll(ROW_GROUP):
                                        rows_c[g * ROW_GROUP + r] = 0
                                        if (g * ROW_GROUP + r) * WARPS + warp < nblocks and c * 32 + lane < num_experts:
                                            rows_c[g * ROW_GROUP + r] = workspace[(g * ROW_GROUP + r) * WARPS + warp,
                                                                                  c * 32 + lane]
                            acc = 0
                            run_sum = 0
                            for g in T.unroll(ROWS_PER_WARP // ROW_GROUP):
                                if g * ROW_GROUP * WARPS < nblocks:
                                    for r in T.unroll(ROW_GROUP):
                                        acc = acc + rows_c[g * ROW_GROUP + r]
                                        if (g * ROW_GROUP + r) * WARPS + warp < bx:
                                            run_sum = run_sum + rows_c[g * ROW_GROUP + r]
                            part[0, warp, c * 32 + lane] = acc
                            part[1, warp, c * 32 + lane] = run_sum
                    T.sync_threads()
                    for j in T.unroll(EXPERTS_PER_THREAD):
                        if j < per and tid * per + j < num_experts:
                            for w in T.unroll(WARPS):
                                tot[j] = tot[j] + part[0, w, tid * per + j]
                                pre[j] = pre[j] + part[1, w, tid * per + j]
                    T.sync_threads()  # part's memory may be reused below (barriers are placed by hand)
                else:
                    # ---- phase 2: per expert, exclusive prefixes over blocks (in place), the total
                    for it in T.serial(T.ceildiv(num_experts, nblocks * WARPS)):
                        if it * (nblocks * WARPS) + bx * WARPS + warp < num_experts:
                            acc = 0
                            for q in T.unroll(BLOCKS_PER_LANE):
                                vals[q] = 0
                                if lane * BLOCKS_PER_LANE + q < nblocks:
                                    vals[q] = workspace[lane * BLOCKS_PER_LANE + q,
                                                        it * (nblocks * WARPS) + bx * WARPS + warp]
                                acc = acc + vals[q]
                            incl = acc
                            for d in T.unroll(5):
                                up = T.shfl_up(incl, 1 << d)
                                if lane >= (1 << d):
                                    incl = incl + up
                            run_sum = incl - acc
                            for q in T.unroll(BLOCKS_PER_LANE):
                                if lane * BLOCKS_PER_LANE + q < nblocks:
                                    workspace[lane * BLOCKS_PER_LANE + q,
                                              it * (nblocks * WARPS) + bx * WARPS + warp] = run_sum
                                run_sum = run_sum + vals[q]
                            if lane == 31:
                                workspace[nblocks, it * (nblocks * WARPS) + bx * WARPS + warp] = incl
                    T.sync_grid()
                    for j in T.unroll(EXPERTS_PER_THREAD):
                        if j < per and tid * per + j < num_experts:
                            tot[j] = workspace[nblocks, tid * per + j]
                            pre[j] = workspace[bx, tid * per + j]

            # ---- phase 3a: expert starts (scan over experts of the aligned totals), warp bases
            acc = 0
            for j in T.unroll(EXPERTS_PER_THREAD):
                aln[j] = 0
                if j < per:  # uniform: no division for the unused slots
                    aln[j] = T.ceildiv(tot[j], alignment) * alignment
                    acc = acc + aln[j]
            incl = acc
            for d in T.unroll(5):
                up = T.shfl_up(incl, 1 << d)
                if lane >= (1 << d):
                    incl = incl + up
            if lane == 31:
                warp_sum[warp] = incl
            T.sync_threads()
            run_sum = incl - acc
            for w in T.unroll(WARPS):
                if w < warp:
                    run_sum = run_sum + warp_sum[w]
            for j in T.unroll(EXPERTS_PER_THREAD):
                if j < per and tid * per + j < num_experts:
                    ex = tid * per + j
                    aligned = aln[j]
                    if bx == 0:
                        expert_start[ex] = run_sum
                        expert_end[ex] = run_sum + aligned
                        num_tokens_per_expert[ex] = aligned
                    s_pad[ex] = run_sum + tot[j]
                    s_end[ex] = run_sum + aligned
                    acc = run_sum + pre[j]
                    for w in T.unroll(WARPS):
                        up = cnt[w, ex]
                        cnt[w, ex] = acc
                        acc = acc + up
                    run_sum = run_sum + aligned
            T.sync_threads()

            # ---- phase 3b: slots of each warp's run, in order (redundant: warp w's by block w % nblocks)
            if warp % walkers == bx % walkers:
                for it in T.serial(run // step):
                    if it == 0:
                        for u in T.unroll(unroll):
                            evs[u] = keep[u]
                    else:
                        load_run(topk_idx, evs, base + it * step + lane)
                    for u in T.unroll(unroll):
                        ex = evs[u]
                        mask = T.call_extern("uint32", "__match_any_sync", T.uint32(FULL), ex)
                        rank = T.Cast("int32", T.popcount(mask & ((T.uint32(1) << T.Cast("uint32", lane))
                                                                  - T.uint32(1))))
                        flat = base + it * step + u * 32 + lane
                        if ex >= 0:
                            pos = cnt[warp, ex] + rank
                            T.Tensor((numel,), "int32", token_topk_to_pos.data)[flat] = pos
                            if pos < num_slots:
                                pos_to_expert[pos] = ex
                                pos_to_token[pos] = flat // num_topk
                                pos_to_token_topk[pos] = flat
                        elif flat < numel:
                            T.Tensor((numel,), "int32", token_topk_to_pos.data)[flat] = -1
                        T.sync_warp()
                        if ex >= 0 and rank == 0:
                            cnt[warp, ex] = cnt[warp, ex] + T.Cast("int32", T.popcount(mask))
                        T.sync_warp()

            # ---- phase 3c: padding, by groups of 2**gs lanes (the smallest power of two >= alignment - 1,
            # at most 32): one expert per group, consecutive slots per lane (coalesced stores)
            gs = 0
            for d in T.unroll(5):
                if (1 << gs) < alignment - 1:
                    gs = gs + 1
            for it in T.serial(T.ceildiv(num_experts, (nblocks * WARPS) * (32 >> gs))):
                ex = (it * (nblocks * WARPS) + bx * WARPS + warp) * (32 >> gs) + (lane >> gs)
                if ex < num_experts:
                    for p in T.serial((alignment - 1 + (1 << gs) - 1) >> gs):
                        pos = s_pad[ex] + (p << gs) + (lane & ((1 << gs) - 1))
                        if pos < s_end[ex] and pos < num_slots:
                            fill(pos_to_expert, pos_to_token, pos_to_token_topk, pos)
            # ---- the tail past the last expert, by all threads of the grid
            acc = 0
            for w in T.unroll(WARPS):
                acc = acc + warp_sum[w]
            for it in T.serial(T.ceildiv(T.max(num_slots - acc, 0), nblocks * THREADS)):
                pos = acc + (it * nblocks + bx) * THREADS + tid
                if pos < num_slots:
                    fill(pos_to_expert, pos_to_token, pos_to_token_topk, pos)

    return main


KERNELS = (
    KernelDecl(
        name="moe.get_fused_mapping",
        factory=get_fused_mapping,
        meta={"max_experts": MAX_EXPERTS, "max_blocks": MAX_BLOCKS},  # the op's limit and its grid cap
        grid=VARIANTS,
        outputs=("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start",
                 "expert_end", "num_tokens_per_expert", "workspace"),
        align=4,  # scalar accesses only
        pass_configs={
            "tl.disable_safe_memory_legalize": True,  # every access is guarded above
            "tl.disable_thread_storage_sync": True,  # barriers placed by hand
            "tl.disable_warp_specialized": True,
        },
        doc="Fused MoE layout: slots per expert (aligned), token<->slot maps (tile_kernels.moe.get_fused_mapping); "
            "redundant=True: a plain launch whose blocks each count every entry (decode-sized inputs), "
            "False: a cooperative launch; coalesced padding.",
    ),
)

__all__ = ["KERNELS", "MAX_BLOCKS", "MAX_EXPERTS", "THREADS", "VARIANTS", "get_fused_mapping"]
