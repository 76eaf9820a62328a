"""``moe.get_fused_mapping``: the token-major <-> expert-major mapping of a fused MoE layout.

Parameters, in order: ``topk_idx`` int64 ``[num_tokens, num_topk]``; outputs ``pos_to_expert``,
``pos_to_token``, ``pos_to_token_topk`` int32 ``[num_expanded_tokens]``, ``token_topk_to_pos``
int32 ``[num_tokens, num_topk]``, ``expert_start``, ``expert_end``, ``num_tokens_per_expert``
int32 ``[num_experts]``; ``workspace`` int32 ``[num_blocks + 1, num_experts]`` (contents on
entry do not matter); scalar ``alignment`` (>= 1).  Every extent is a runtime symbol, so one
cubin serves every shape, expert count (<= ``MAX_EXPERTS``) and alignment.

The layout (identical for any block count, hence any SM count): entry ``i`` of the flattened
index tensor (``i = token * num_topk + k``) with expert ``e`` in ``[0, num_experts)`` lands at
``expert_start[e] + (number of entries j < i with expert e)``; expert ``e`` owns
``[expert_start[e], expert_end[e])``, ``count(e)`` rounded up to ``alignment`` slots, experts
back to back from 0.  Unused slots (each expert's padding, and everything past the last expert)
hold -1 in the three ``pos_to_*`` arrays; entries that are -1 or out of range get
``token_topk_to_pos = -1``.  Slots at or past ``num_expanded_tokens`` are not written (the
entry's ``token_topk_to_pos`` still names them): the caller sizes the buffer.

Design (a cooperative launch of ``num_blocks`` blocks, at most one per SM; three phases split by
``T.sync_grid()``):

1. Global warp ``g`` owns the contiguous run ``[g L, (g + 1) L)`` of flat entries (``L`` a
   multiple of 32); each warp counts its run per expert in shared memory, each block writes its
   per-expert sums to ``workspace[block]``.
2. Warp ``g`` takes experts ``g, g + G, ...``: its lanes hold ``num_blocks`` counts of the
   expert, a shuffle scan turns them into exclusive per-block prefixes (written back in place),
   and the expert's total goes to ``workspace[num_blocks]``.
3. Every block scans the aligned totals over experts (shuffles, then warp totals), adds its own
   block prefix and the warp prefixes: each warp's first slot per expert.  Warps then walk their
   runs in order, 32 entries at a time: ``__match_any_sync`` groups lanes with the same expert,
   the rank among lower lanes gives the slot, the group's first lane advances the base.
   Padding slots are filled with -1 by the block ``e % num_blocks``, the tail by all.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256
WARPS = THREADS // 32
MAX_EXPERTS = 1024
EXPERTS_PER_THREAD = MAX_EXPERTS // THREADS
MAX_BLOCKS = 256  # workspace rows a warp scans: 32 lanes x BLOCKS_PER_LANE
BLOCKS_PER_LANE = MAX_BLOCKS // 32
FULL = 0xFFFFFFFF
UNROLL = 4  # index loads each lane issues before using them


def get_fused_mapping():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, num_topk = T.dynamic("num_tokens"), T.dynamic("num_topk")
    num_slots = T.dynamic("num_expanded_tokens")
    num_experts = T.dynamic("num_experts")
    ws_rows = T.dynamic("workspace_rows")
    numel = num_tokens * num_topk
    nblocks = ws_rows - 1
    # entries per warp run: a multiple of 32 x UNROLL, so all lanes of a warp take the same trips
    run = T.ceildiv(T.ceildiv(numel, nblocks * WARPS), 32 * UNROLL) * (32 * UNROLL)

    @T.macro
    def load_run(topk_idx, evs, first):
        """``evs[u]`` = the expert of flat entry ``first + 32 u`` as int32, -1 when the entry is
        past the end, -1 or out of range (all loads issued before any use)."""
        e64 = T.alloc_local((UNROLL,), "int64")
        for u in T.unroll(UNROLL):
            e64[u] = T.int64(-1)
            if first + u * 32 < numel:
                e64[u] = T.Tensor((numel,), "int64", topk_idx.data)[first + u * 32]
        for u in T.unroll(UNROLL):
            evs[u] = T.if_then_else(e64[u] >= T.int64(0) and e64[u] < T.Cast("int64", num_experts),
                                    T.Cast("int32", e64[u]), -1)

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
            s_start = T.alloc_shared((MAX_EXPERTS,), "int32")
            s_total = T.alloc_shared((MAX_EXPERTS,), "int32")
            warp_sum = T.alloc_shared((WARPS,), "int32")
            vals = T.alloc_local((BLOCKS_PER_LANE,), "int32")
            tot = T.alloc_local((EXPERTS_PER_THREAD,), "int32")
            acc = T.alloc_var("int32")
            run_sum = T.alloc_var("int32")
            incl = T.alloc_var("int32")
            up = T.alloc_var("int32")
            evs = T.alloc_local((UNROLL,), "int32")
            ex = T.alloc_var("int32")
            mask = T.alloc_var("uint32")
            pos = T.alloc_var("int32")
            rank = T.alloc_var("int32")

            # ---- phase 1: per-warp counts of each warp's run, per-block sums to the workspace
            for j in T.serial(T.ceildiv(num_experts, THREADS)):
                if j * THREADS + tid < num_experts:
                    for w in T.unroll(WARPS):
                        cnt[w, j * THREADS + tid] = 0
            T.sync_threads()
            base = T.alloc_var("int32")
            base = (bx * WARPS + warp) * run
            for it in T.serial(run // (32 * UNROLL)):
                load_run(topk_idx, evs, base + it * (32 * UNROLL) + lane)
                for u in T.unroll(UNROLL):
                    if evs[u] >= 0:
                        T.atomic_add(cnt[warp, evs[u]], 1)
            T.sync_threads()
            for j in T.serial(T.ceildiv(num_experts, THREADS)):
                if j * THREADS + tid < num_experts:
                    acc = 0
                    for w in T.unroll(WARPS):
                        acc = acc + cnt[w, j * THREADS + tid]
                    workspace[bx, j * THREADS + tid] = acc
            T.sync_grid()

            # ---- phase 2: per expert, exclusive prefixes over blocks (in place) and the total
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

            # ---- phase 3a: expert starts (scan over experts of the aligned totals), warp bases
            # thread tid owns experts [tid * P, tid * P + P), P = ceil(num_experts / THREADS)
            acc = 0
            for j in T.unroll(EXPERTS_PER_THREAD):
                tot[j] = 0
                if j < T.ceildiv(num_experts, THREADS) and tid * T.ceildiv(num_experts, THREADS) + j < num_experts:
                    tot[j] = workspace[nblocks, tid * T.ceildiv(num_experts, THREADS) + j]
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
                if j < T.ceildiv(num_experts, THREADS) and tid * T.ceildiv(num_experts, THREADS) + j < num_experts:
                    ex = tid * T.ceildiv(num_experts, THREADS) + j
                    s_start[ex] = run_sum
                    s_total[ex] = tot[j]
                    if bx == 0:
                        expert_start[ex] = run_sum
                        expert_end[ex] = run_sum + T.ceildiv(tot[j], alignment) * alignment
                        num_tokens_per_expert[ex] = T.ceildiv(tot[j], alignment) * alignment
                    acc = run_sum + workspace[bx, ex]
                    for w in T.unroll(WARPS):
                        up = cnt[w, ex]
                        cnt[w, ex] = acc
                        acc = acc + up
                    run_sum = run_sum + T.ceildiv(tot[j], alignment) * alignment
            T.sync_threads()

            # ---- phase 3b: slots of each warp's run, in order
            for it in T.serial(run // (32 * UNROLL)):
                load_run(topk_idx, evs, base + it * (32 * UNROLL) + lane)
                for u in T.unroll(UNROLL):
                    ex = evs[u]
                    mask = T.call_extern("uint32", "__match_any_sync", T.uint32(FULL), ex)
                    rank = T.Cast("int32", T.popcount(mask & ((T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1))))
                    flat = base + it * (32 * UNROLL) + u * 32 + lane
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

            # ---- phase 3c: -1 in every unused slot (expert padding, then the tail)
            for it in T.serial(T.ceildiv(num_experts, nblocks)):
                if it * nblocks + bx < num_experts:
                    ex = it * nblocks + bx
                    for p in T.serial(T.ceildiv(alignment, THREADS)):
                        pos = s_start[ex] + s_total[ex] + p * THREADS + tid
                        if pos < s_start[ex] + T.ceildiv(s_total[ex], alignment) * alignment and pos < num_slots:
                            pos_to_expert[pos] = -1
                            pos_to_token[pos] = -1
                            pos_to_token_topk[pos] = -1
            acc = 0
            for w in T.unroll(WARPS):
                acc = acc + warp_sum[w]
            for it in T.serial(T.ceildiv(T.max(num_slots - acc, 0), nblocks * THREADS)):
                pos = acc + (it * nblocks + bx) * THREADS + tid
                if pos < num_slots:
                    pos_to_expert[pos] = -1
                    pos_to_token[pos] = -1
                    pos_to_token_topk[pos] = -1

    return main


KERNELS = (
    KernelDecl(
        name="moe.get_fused_mapping",
        factory=get_fused_mapping,
        meta={"max_experts": MAX_EXPERTS, "max_blocks": MAX_BLOCKS},  # the op's limit and its grid cap
        grid=({},),
        outputs=("pos_to_expert", "pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start",
                 "expert_end", "num_tokens_per_expert", "workspace"),
        align=4,  # scalar accesses only
        pass_configs={
            "tl.disable_safe_memory_legalize": True,  # every access is guarded above
            "tl.disable_thread_storage_sync": True,  # barriers placed by hand
            "tl.disable_warp_specialized": True,
        },
        doc="Fused MoE layout: slots per expert (aligned), token<->slot maps; a cooperative launch "
            "(tile_kernels.moe.get_fused_mapping).",
    ),
)

__all__ = ["KERNELS", "MAX_BLOCKS", "MAX_EXPERTS", "THREADS", "get_fused_mapping"]
