"""``moe._get_fused_mapping_candidate``: ``moe.get_fused_mapping``'s cooperative variant, its -1 fill
moved ahead of the grid barrier and spread over every SM (issue 12).

Same parameters, slot layout and results, bit for bit, as ``moe.get_fused_mapping`` with
``redundant=False`` (read its docstring: phases 1, 2, 3a and 3b are unchanged).  Differences:

* Before phase 1 (so before the grid barrier), all threads of the grid write -1 to every slot
  ``[0, num_expanded_tokens)`` of the three ``pos_to_*`` maps, consecutive threads on
  consecutive slots (coalesced).  After the barrier only the entries' own slots are written (the slot
  walk); the padding and tail loops of the shipped kernel are gone.  The grid barrier orders
  the fill before the walk's stores (its fence), so a slot ends with its entry's values.
  Shipped: padding and the tail past the last expert are written after the walk, on the
  kernel's critical path (at the benchmark's top-k 9, 4001 x 8 ranks: ~166k tail slots,
  ~2 MB of -1 stores after the barrier).
* ``unroll`` (variant key: 1, 2 or 4) is the index loads a lane issues per trip, so a warp takes
  ``32 * unroll`` entries per trip; a smaller ``unroll`` lets the op spread a small input's runs
  (and with them the walk's scattered stores, about one sector per cycle per SM) over more
  warps (shipped: 128 entries per warp, so ~15 blocks walk the benchmark's top-k 2).  The op launches one block per SM (at most ``MAX_BLOCKS``) so the fill uses them all.
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
QUAD = 4  # experts whose workspace columns a warp loads at once (then QUAD shuffle reductions)
VARIANTS = ({"unroll": 1}, {"unroll": 2}, {"unroll": 4})  # unroll: index loads per lane per trip (32 * unroll entries per warp)


def get_fused_mapping_candidate(unroll: int):
    """Build the PrimFunc: a cooperative grid (the fill before the barrier, ``unroll`` loads per lane and trip)."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")
    num_slots = T.dynamic("num_expanded_tokens")
    num_experts = T.dynamic("num_experts")
    ws_rows = T.dynamic("workspace_rows")
    numel = num_tokens * num_topk
    nblocks = ws_rows - 1
    step = 32 * unroll  # entries a warp takes per trip
    # entries per warp run: a multiple of step, so all lanes of a warp take the same trips
    run = T.ceildiv(T.ceildiv(numel, nblocks * WARPS), step) * step
    per = T.ceildiv(num_experts, THREADS)  # experts each thread owns in the scan

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
            warp_sum = T.alloc_shared((WARPS,), "int32")
            s_tot = T.alloc_shared((SMALL_E,), "int32")  # few experts: totals and this block's prefixes
            s_pre = T.alloc_shared((SMALL_E,), "int32")
            cols = T.alloc_local((QUAD * BLOCKS_PER_LANE,), "int32")
            vals = T.alloc_local((BLOCKS_PER_LANE,), "int32")
            tot = T.alloc_local((EXPERTS_PER_THREAD,), "int32")
            pre = T.alloc_local((EXPERTS_PER_THREAD,), "int32")
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

            # ---- phase 0: the first trip's index loads in flight, then -1 into every slot of the three
            # pos_to_* maps by all threads of the grid (coalesced; ordered before the walk by the grid barrier)
            base = T.alloc_var("int32")
            base = (bx * WARPS + warp) * run
            first64 = T.alloc_local((unroll,), "int64")
            for u in T.unroll(unroll):
                first64[u] = T.int64(-1)
                if base + u * 32 + lane < numel:
                    first64[u] = T.Tensor((numel,), "int64", topk_idx.data)[base + u * 32 + lane]
            for it in T.serial(T.ceildiv(num_slots, nblocks * THREADS)):
                pos = (it * nblocks + bx) * THREADS + tid
                if pos < num_slots:
                    fill(pos_to_expert, pos_to_token, pos_to_token_topk, pos)
            # ---- phase 1: per-warp counts of each warp's run; per-expert block sums
            for j in T.serial(T.ceildiv(num_experts, THREADS)):
                if j * THREADS + tid < num_experts:
                    for w in T.unroll(WARPS):
                        cnt[w, j * THREADS + tid] = 0
            for u in T.unroll(unroll):
                keep[u] = T.if_then_else(first64[u] >= T.int64(0) and first64[u] < T.Cast("int64", num_experts),
                                         T.Cast("int32", first64[u]), -1)
            T.sync_threads()
            for it in T.serial(run // step):
                if it == 0:
                    for u in T.unroll(unroll):
                        evs[u] = keep[u]
                else:
                    load_run(topk_idx, evs, base + it * step + lane)
                for u in T.unroll(unroll):
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
                    workspace[bx, tid * per + j] = acc

            T.sync_grid()
            if num_experts <= SMALL_E:
                # ---- phase 2, few experts: every block sums each expert's column of the workspace
                # (warp w: experts w, w + WARPS, ..., QUAD at a time; lanes over rows) -- no 2nd barrier
                for c in T.serial(T.ceildiv(num_experts, WARPS * QUAD)):
                    for q in T.unroll(QUAD):
                        for r in T.unroll(BLOCKS_PER_LANE):
                            cols[q * BLOCKS_PER_LANE + r] = 0
                            if (c * QUAD + q) * WARPS + warp < num_experts and lane * BLOCKS_PER_LANE + r < nblocks:
                                cols[q * BLOCKS_PER_LANE + r] = workspace[lane * BLOCKS_PER_LANE + r,
                                                                          (c * QUAD + q) * WARPS + warp]
                    for q in T.unroll(QUAD):
                        acc = 0
                        run_sum = 0
                        for r in T.unroll(BLOCKS_PER_LANE):
                            acc = acc + cols[q * BLOCKS_PER_LANE + r]
                            if lane * BLOCKS_PER_LANE + r < bx:
                                run_sum = run_sum + cols[q * BLOCKS_PER_LANE + r]
                        for d in T.unroll(5):
                            acc = acc + T.shfl_xor(acc, 16 >> d)
                            run_sum = run_sum + T.shfl_xor(run_sum, 16 >> d)
                        if lane == 0 and (c * QUAD + q) * WARPS + warp < num_experts:
                            s_tot[(c * QUAD + q) * WARPS + warp] = acc
                            s_pre[(c * QUAD + q) * WARPS + warp] = run_sum
                T.sync_threads()
                for j in T.unroll(EXPERTS_PER_THREAD):
                    if j < per and tid * per + j < num_experts:
                        tot[j] = s_tot[tid * per + j]
                        pre[j] = s_pre[tid * per + j]
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
                acc = acc + T.ceildiv(tot[j], alignment) * alignment
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
                    aligned = T.ceildiv(tot[j], alignment) * alignment
                    if bx == 0:
                        expert_start[ex] = run_sum
                        expert_end[ex] = run_sum + aligned
                        num_tokens_per_expert[ex] = aligned
                    acc = run_sum + pre[j]
                    for w in T.unroll(WARPS):
                        up = cnt[w, ex]
                        cnt[w, ex] = acc
                        acc = acc + up
                    run_sum = run_sum + aligned
            T.sync_threads()

            # ---- phase 3b: slots of each warp's run, in order (the slots were filled with -1 in phase 0)
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

    return main


KERNELS = (
    KernelDecl(
        name="moe._get_fused_mapping_candidate",
        factory=get_fused_mapping_candidate,
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
        doc="get_fused_mapping candidate (cooperative only): every slot set to -1 by the whole grid before the "
            "grid barrier, then only the entries' slots written; unroll = index loads per lane and trip.",
    ),
)

__all__ = ["KERNELS", "MAX_BLOCKS", "MAX_EXPERTS", "THREADS", "VARIANTS", "get_fused_mapping_candidate"]
