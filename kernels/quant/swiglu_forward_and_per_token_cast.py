"""``quant.swiglu_forward_and_per_token_cast``: ``act = silu(gate) * up`` (optionally clamped and
weighted per row), quantized to e4m3 with one scale per 128 channels or per row.

``x`` is ``[num_rows, 2 * hidden]`` (gate = first half, up = second half), bf16 or fp32,
contiguous.  Per element, in fp32 and in the reference's order, each step rounded on its own
(``__fadd_rn``/``__fdiv_rn``/``__fmul_rn``: nvcc may not contract them into FMAs):

    g = gate > c ? c : gate                       (torch.clamp(max=c) keeps NaN)
    u = up < -c ? -c : up;  u = u > c ? c : u     (torch.clamp(min=-c, max=c))
    act = ((g / (1 + expf(-g))) * u) * w

``c`` is the runtime ``clamp_value`` (+inf when the op has no clamp: the selects then keep every
value, NaN included, so no flag is needed); ``w`` is 1.0 without weights (an exact multiply), else
``topk_weights.flat[pos_to_token_topk[row]]``, or 0.0 where that position is negative or past the end.  Rows with
``pos_to_expert[row] < 0`` (when ``with_p2e``) are not read and not counted; they are written as
a zero row (data 0, scale of an all-zero group), what the reference gives for a masked row.

Scales (``tile_kernels.torch.cast`` semantics): ``sf = max(amax, sf_clamp_min) / 448``; with
``round_sf`` the sf bits are rounded up to a power of two and ``sf_inv = 1 / sf``, else
``sf_inv = 448 / max(amax, sf_clamp_min)``; a zero sf gives ``sf_inv = 0``.  The data byte is
``e4m3(act * sf_inv)`` (round to nearest even, saturating at 448).

Parameters, in order: ``x``, ``out`` (``[num_rows, hidden]`` e4m3), ``out_sf`` (kernel
orientation, see ``ops/quant/_sf.py``: ``row`` fp32 ``[rows, groups]``, ``col`` fp32
``[groups, rows]``, ``ue8m0`` uint8 ``[ceil(groups / 4), 4 * rows]``, each with a runtime row
stride), ``pos_to_token_topk`` (int32), ``topk_weights`` (fp32 ``[tokens, topk]``),
``pos_to_expert`` (int32), ``clamped_count`` (int64 ``[3]``), then the scalars ``clamp_value``,
``sf_clamp_min``, ``round_sf``, ``with_weight``, ``with_p2e`` (0/1) and ``num_blocks`` (the grid).
Unused optional tensors may be any 1-element tensors of their dtype.  With ``count_clamp``,
``clamped_count += (#gate > c, #up > c, #up < -c)`` (int64 atomics, one per block and counter).

Rules the op checks: ``hidden % 64 == 0`` (a partial last group of 64 channels is handled);
16-byte aligned pointers; ``num_blocks >= 1``.

Design: 8 channels per thread-unit (one 16-byte load of gate and one of up for bf16, two each
for fp32; one 8-byte store).  ``per_group`` (128 channels): a group is 16 consecutive units of a
half-warp; the problem is flattened into ``rows * groups * 16`` units, so every warp access is
contiguous whatever ``hidden``; the amax is reduced with 4 xor-shuffles.  A block handles
``UNROLL`` units per thread per step (all loads issued before the math) and strides over the
problem with ``num_blocks`` blocks (the op picks a few blocks per SM), which keeps the clamp
counters to one atomic per block.  Without a clamp (``clamp_value == +inf``, a uniform test) and
without clamp counting, the activation skips the clamp selects, which then keep every value.  ``full_row`` (one scale per row): a block per row, 2048
channels per pass; the first ``ROW_CHUNKS`` passes stay in registers, wider rows recompute the
activation for the second (quantizing) pass, which then reads ``x`` from L2.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 256
UNROLL = 2
ROW_CHUNKS = 4  # full_row: 4 x 2048 channels kept in registers
FP8_MAX = 448.0
IN_DTYPES = ("bfloat16", "float32")
SF_KINDS = ("row", "col", "ue8m0", "full_row")
# Every access is in bounds by construction (the op validates shapes); TileLang's automatic
# bounds guards would otherwise split the 16-byte accesses into guarded scalar ones.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def _view(buf, shape, dtype: str):
    """A reinterpreting view of ``buf``'s data; build it inline at each use (binding it to a name
    renames the data pointer, hence the kernel parameter)."""
    return T.Tensor(shape, dtype, buf.data)


def rn(op: str, a, b):
    """One correctly rounded fp32 operation that nvcc never contracts (``__fadd_rn`` etc.)."""
    return T.call_extern("float32", op, a, b)


def clamp_gate(g, c):
    return T.Select(g > c, c, g)


def clamp_up(u, c):
    lo = T.Select(u < -c, -c, u)
    return T.Select(lo > c, c, lo)


def silu_mul(g, u):
    """``g / (1 + expf(-g)) * u`` for clamped fp32 g, u, each step rounded as torch does."""
    return rn("__fmul_rn", rn("__fdiv_rn", g, rn("__fadd_rn", T.float32(1.0), T.exp(-g))), u)


def sf_bits(amax, clamp_min, round_sf):
    """fp32 bit pattern (int32, non-negative) of the dequantization scale of a group with this amax."""
    bits = T.reinterpret(rn("__fdiv_rn", T.max(amax, clamp_min), T.float32(FP8_MAX)), "int32")
    return T.if_then_else(round_sf != 0, (bits + 0x7FFFFF) & 0x7F800000, bits)


def sf_inverse(bits, amax, clamp_min, round_sf):
    """The quantization multiplier for ``bits = sf_bits(...)`` (0 for a zero scale)."""
    inv = T.if_then_else(
        round_sf != 0,
        rn("__fdiv_rn", T.float32(1.0), T.reinterpret(bits, "float32")),
        rn("__fdiv_rn", T.float32(FP8_MAX), T.max(amax, clamp_min)),
    )
    return T.if_then_else(bits == 0, T.float32(0.0), inv)


@T.macro
def store_sf(out_sf, sf_kind: str, bits, row, g):
    if sf_kind == "ue8m0":
        out_sf[g // 4, row * 4 + g % 4] = T.Cast("uint8", bits >> 23)
    elif sf_kind == "col":
        out_sf[g, row] = T.reinterpret(bits, "float32")
    else:
        out_sf[row, g] = T.reinterpret(bits, "float32")


@T.macro
def load_halves(x, in_dtype: str, raw_g, raw_u, slot, row, col, rows, hidden):
    """8 gate and 8 up elements of ``row`` from channel ``col`` (a multiple of 8) into ``raw_*[slot]``."""
    for k in T.vectorized(8):
        raw_g[slot, k] = _view(x, (rows * hidden * 2,), in_dtype)[(row * (hidden // 4) + col // 8) * 8 + k]
    for k in T.vectorized(8):
        raw_u[slot, k] = _view(x, (rows * hidden * 2,), in_dtype)[(row * (hidden // 4) + (hidden + col) // 8) * 8 + k]


@T.macro
def activate(raw_g, raw_u, act, slot, clamp_value, w, cnt, count_clamp: bool, clamp: bool = True):
    """``act[slot, :] = swiglu(raw_g[slot, :], raw_u[slot, :]) * w``; counts clamps when asked.
    ``clamp=False`` leaves out the clamp selects: only for ``clamp_value == +inf``, where they keep
    every value (NaN included), so the result is the same.
    (Parameter names match the callers': a macro renames the PrimFunc parameters it is given.)"""
    for k in T.unroll(8):
        g = T.Cast("float32", raw_g[slot, k])
        u = T.Cast("float32", raw_u[slot, k])
        if count_clamp:
            cnt[0] += T.Cast("int32", g > clamp_value)
            cnt[1] += T.Cast("int32", u > clamp_value)
            cnt[2] += T.Cast("int32", u < -clamp_value)
        if clamp:
            act[slot, k] = rn("__fmul_rn", silu_mul(clamp_gate(g, clamp_value), clamp_up(u, clamp_value)), w)
        else:
            act[slot, k] = rn("__fmul_rn", silu_mul(g, u), w)


def no_clamp(clamp_value):
    """Whether the runtime ``clamp_value`` is +inf (the op's value when there is no clamp); uniform."""
    return T.reinterpret(clamp_value, "int32") == 0x7F800000


@T.macro
def quantize_store(out, act, q, q8, slot, inv, row, col, rows, hidden):
    for k in T.unroll(8):
        q[k] = rn("__fmul_rn", act[slot, k], inv)
    for k in T.vectorized(8):
        q8[k] = T.Cast("float8_e4m3fn", q[k])
    for k in T.vectorized(8):
        _view(out, (rows * hidden,), "float8_e4m3fn")[(row * (hidden // 8) + col // 8) * 8 + k] = q8[k]


@T.macro
def row_weight(w, masked, s, row, pos_to_token_topk, topk_weights, pos_to_expert, with_weight, with_p2e):
    """``w[s]``: the row's weight (1.0 without weights, 0.0 for a negative position);
    ``masked[s]``: 1 when ``pos_to_expert`` drops the row."""
    w[s] = T.float32(1.0)
    if with_weight != 0:
        n_w = topk_weights.shape[0] * topk_weights.shape[1]
        # a position outside topk_weights (negative, or past its end) is weight 0: never read out
        # of bounds, whatever the index data holds
        w[s] = T.if_then_else(pos_to_token_topk[row] >= 0 and pos_to_token_topk[row] < n_w,
                              _view(topk_weights, (n_w,), "float32")[T.max(pos_to_token_topk[row], 0)],
                              T.float32(0.0))
    masked[s] = 0
    if with_p2e != 0:
        masked[s] = T.Cast("int32", pos_to_expert[row] < 0)


@T.macro
def flush_counts(cnt, red, clamped_count, tid):
    """Block sum of the three per-thread counters, one int64 atomic per counter (skipped when 0)."""
    for i in T.unroll(3):
        for s in T.unroll(5):
            cnt[i] += T.shfl_xor(cnt[i], 16 >> s)
    if tid % 32 == 0:
        for i in T.unroll(3):
            red[i, tid // 32] = cnt[i]
    T.sync_threads()
    if tid < 3:
        total = T.alloc_var("int32")
        total = 0
        for j in T.unroll(THREADS // 32):
            total += red[tid, j]
        if total != 0:
            T.atomic_add(clamped_count[tid], T.Cast("int64", total))


def _per_group(in_dtype: str, sf_kind: str, count_clamp: bool):
    rows, hidden = T.dynamic("num_rows"), T.dynamic("hidden")
    sf_d0, sf_d1, sf_stride = T.dynamic("sf_d0"), T.dynamic("sf_d1"), T.dynamic("sf_stride")
    n_ptt, n_p2e, n_tok, n_topk = T.dynamic("n_ptt"), T.dynamic("n_p2e"), T.dynamic("n_tok"), T.dynamic("n_topk")
    sf_dtype = "uint8" if sf_kind == "ue8m0" else "float32"
    groups = T.ceildiv(hidden, 128)
    total = rows * groups * 16  # units of 8 channels, 16 per group
    per_block = THREADS * UNROLL

    @T.prim_func
    def main(
        x: T.Tensor((rows, hidden * 2), in_dtype),
        out: T.Tensor((rows, hidden), "float8_e4m3fn"),
        out_sf: T.StridedTensor((sf_d0, sf_d1), (sf_stride, 1), sf_dtype),
        pos_to_token_topk: T.Tensor((n_ptt,), "int32"),
        topk_weights: T.Tensor((n_tok, n_topk), "float32"),
        pos_to_expert: T.Tensor((n_p2e,), "int32"),
        clamped_count: T.Tensor((3,), "int64"),
        clamp_value: T.float32,
        sf_clamp_min: T.float32,
        round_sf: T.int32,
        with_weight: T.int32,
        with_p2e: T.int32,
        num_blocks: T.int32,
    ):
        with T.Kernel(num_blocks, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            raw_g = T.alloc_local((UNROLL, 8), in_dtype)
            raw_u = T.alloc_local((UNROLL, 8), in_dtype)
            act = T.alloc_local((UNROLL, 8), "float32")
            q = T.alloc_local((8,), "float32")
            q8 = T.alloc_local((8,), "float8_e4m3fn")
            w = T.alloc_local((UNROLL,), "float32")
            masked = T.alloc_local((UNROLL,), "int32")
            live = T.alloc_local((UNROLL,), "int32")  # the unit exists (its group may still be partial)
            row_of = T.alloc_local((UNROLL,), "int32")
            grp_of = T.alloc_local((UNROLL,), "int32")
            col_of = T.alloc_local((UNROLL,), "int32")
            cnt = T.alloc_local((3,), "int32")
            red = T.alloc_shared((3, THREADS // 32), "int32")
            amax = T.alloc_var("float32")
            for i in T.unroll(3):
                cnt[i] = 0
            step = num_blocks * per_block
            for it in T.serial(T.truncdiv(total - bx * per_block + step - 1, step)):
                for s in T.unroll(UNROLL):
                    unit = (it * num_blocks + bx) * per_block + s * THREADS + tid
                    live[s] = T.Cast("int32", unit < total)
                    row_of[s] = T.truncdiv(unit // 16, groups)
                    grp_of[s] = T.truncmod(unit // 16, groups)
                    col_of[s] = grp_of[s] * 128 + unit % 16 * 8
                    masked[s] = 1
                    if live[s] != 0:
                        row_weight(w, masked, s, row_of[s], pos_to_token_topk, topk_weights, pos_to_expert,
                                   with_weight, with_p2e)
                        if masked[s] == 0 and col_of[s] < hidden:
                            load_halves(x, in_dtype, raw_g, raw_u, s, row_of[s], col_of[s], rows, hidden)
                for s in T.unroll(UNROLL):
                    amax = T.float32(0.0)
                    if masked[s] == 0 and col_of[s] < hidden:
                        if count_clamp:
                            activate(raw_g, raw_u, act, s, clamp_value, w[s], cnt, True)
                        elif no_clamp(clamp_value):
                            activate(raw_g, raw_u, act, s, clamp_value, w[s], cnt, False, False)
                        else:
                            activate(raw_g, raw_u, act, s, clamp_value, w[s], cnt, False)
                        for k in T.unroll(8):
                            amax = T.max(amax, T.abs(act[s, k]))
                    else:
                        for k in T.unroll(8):
                            act[s, k] = T.float32(0.0)
                    for r in T.unroll(4):  # the 16 lanes of the group
                        amax = T.max(amax, T.shfl_xor(amax, 8 >> r))
                    bits = sf_bits(amax, sf_clamp_min, round_sf)
                    if live[s] != 0:
                        if tid % 16 == 0:
                            store_sf(out_sf, sf_kind, bits, row_of[s], grp_of[s])
                            if sf_kind == "ue8m0":
                                # the unused bytes of the row's last int32 are zero (as in the reference)
                                for e in T.unroll(1, 4):
                                    if grp_of[s] == groups - 1 and grp_of[s] % 4 + e < 4:
                                        out_sf[grp_of[s] // 4, row_of[s] * 4 + grp_of[s] % 4 + e] = T.uint8(0)
                        if col_of[s] < hidden:
                            quantize_store(out, act, q, q8, s, sf_inverse(bits, amax, sf_clamp_min, round_sf),
                                           row_of[s], col_of[s], rows, hidden)
            if count_clamp:
                flush_counts(cnt, red, clamped_count, tid)

    return main


def _full_row(in_dtype: str, count_clamp: bool):
    rows, hidden = T.dynamic("num_rows"), T.dynamic("hidden")
    sf_d0, sf_d1, sf_stride = T.dynamic("sf_d0"), T.dynamic("sf_d1"), T.dynamic("sf_stride")
    n_ptt, n_p2e, n_tok, n_topk = T.dynamic("n_ptt"), T.dynamic("n_p2e"), T.dynamic("n_tok"), T.dynamic("n_topk")
    chunk = THREADS * 8
    warps = THREADS // 32

    @T.prim_func
    def main(
        x: T.Tensor((rows, hidden * 2), in_dtype),
        out: T.Tensor((rows, hidden), "float8_e4m3fn"),
        out_sf: T.StridedTensor((sf_d0, sf_d1), (sf_stride, 1), "float32"),
        pos_to_token_topk: T.Tensor((n_ptt,), "int32"),
        topk_weights: T.Tensor((n_tok, n_topk), "float32"),
        pos_to_expert: T.Tensor((n_p2e,), "int32"),
        clamped_count: T.Tensor((3,), "int64"),
        clamp_value: T.float32,
        sf_clamp_min: T.float32,
        round_sf: T.int32,
        with_weight: T.int32,
        with_p2e: T.int32,
        num_blocks: T.int32,
    ):
        with T.Kernel(num_blocks, threads=THREADS) as bx:
            tid = T.get_thread_binding()
            raw_g = T.alloc_local((ROW_CHUNKS, 8), in_dtype)
            raw_u = T.alloc_local((ROW_CHUNKS, 8), in_dtype)
            act = T.alloc_local((ROW_CHUNKS, 8), "float32")
            tmp = T.alloc_local((1, 8), "float32")
            q = T.alloc_local((8,), "float32")
            q8 = T.alloc_local((8,), "float8_e4m3fn")
            w = T.alloc_local((1,), "float32")
            masked = T.alloc_local((1,), "int32")
            cnt = T.alloc_local((3,), "int32")
            red = T.alloc_shared((3, warps), "int32")
            amax_sh = T.alloc_shared((2, warps), "float32")
            amax = T.alloc_var("float32")
            for i in T.unroll(3):
                cnt[i] = 0
            extra = T.max(T.ceildiv(hidden, chunk) - ROW_CHUNKS, 0)  # passes past the register-resident ones
            for it in T.serial(T.truncdiv(rows - bx + num_blocks - 1, num_blocks)):
                row = it * num_blocks + bx
                row_weight(w, masked, 0, row, pos_to_token_topk, topk_weights, pos_to_expert, with_weight, with_p2e)
                for c in T.unroll(ROW_CHUNKS):
                    if masked[0] == 0 and c * chunk + tid * 8 < hidden:
                        load_halves(x, in_dtype, raw_g, raw_u, c, row, c * chunk + tid * 8, rows, hidden)
                amax = T.float32(0.0)
                for c in T.unroll(ROW_CHUNKS):
                    if masked[0] == 0 and c * chunk + tid * 8 < hidden:
                        activate(raw_g, raw_u, act, c, clamp_value, w[0], cnt, count_clamp)
                        for k in T.unroll(8):
                            amax = T.max(amax, T.abs(act[c, k]))
                    else:
                        for k in T.unroll(8):
                            act[c, k] = T.float32(0.0)
                for e in T.serial(extra):
                    if masked[0] == 0 and (ROW_CHUNKS + e) * chunk + tid * 8 < hidden:
                        load_halves(x, in_dtype, raw_g, raw_u, 0, row, (ROW_CHUNKS + e) * chunk + tid * 8, rows, hidden)
                        activate(raw_g, raw_u, tmp, 0, clamp_value, w[0], cnt, count_clamp)
                        for k in T.unroll(8):
                            amax = T.max(amax, T.abs(tmp[0, k]))
                for r in T.unroll(5):
                    amax = T.max(amax, T.shfl_xor(amax, 16 >> r))
                if tid % 32 == 0:
                    amax_sh[it % 2, tid // 32] = amax
                T.sync_threads()
                amax = T.float32(0.0)
                for j in T.unroll(warps):
                    amax = T.max(amax, amax_sh[it % 2, j])
                bits = sf_bits(amax, sf_clamp_min, round_sf)
                inv = sf_inverse(bits, amax, sf_clamp_min, round_sf)
                if tid == 0:
                    out_sf[row, 0] = T.reinterpret(bits, "float32")
                for c in T.unroll(ROW_CHUNKS):
                    if c * chunk + tid * 8 < hidden:
                        quantize_store(out, act, q, q8, c, inv, row, c * chunk + tid * 8, rows, hidden)
                for e in T.serial(extra):
                    if (ROW_CHUNKS + e) * chunk + tid * 8 < hidden:
                        if masked[0] == 0:
                            load_halves(x, in_dtype, raw_g, raw_u, 0, row, (ROW_CHUNKS + e) * chunk + tid * 8, rows,
                                        hidden)
                            activate(raw_g, raw_u, tmp, 0, clamp_value, w[0], cnt, False)
                        else:
                            for k in T.unroll(8):
                                tmp[0, k] = T.float32(0.0)
                        quantize_store(out, tmp, q, q8, 0, inv, row, (ROW_CHUNKS + e) * chunk + tid * 8, rows, hidden)
            if count_clamp:
                flush_counts(cnt, red, clamped_count, tid)

    return main


def swiglu_forward_and_per_token_cast(in_dtype: str, sf_kind: str, count_clamp: bool):
    """Build the PrimFunc of one variant: input dtype (torch naming), scale layout (``row``, ``col``,
    ``ue8m0``: 128 channels per scale; ``full_row``: one row-major scale per row), clamp counting."""
    if in_dtype not in IN_DTYPES or sf_kind not in SF_KINDS:
        raise ValueError(f"swiglu_forward_and_per_token_cast: unsupported variant in_dtype={in_dtype!r} "
                         f"sf_kind={sf_kind!r}")
    if sf_kind == "full_row":
        return _full_row(in_dtype, bool(count_clamp))
    return _per_group(in_dtype, sf_kind, bool(count_clamp))


def _grid():
    return tuple({"in_dtype": d, "sf_kind": k, "count_clamp": c}
                 for d in IN_DTYPES for k in SF_KINDS for c in (False, True))


KERNELS = (
    KernelDecl(
        name="quant.swiglu_forward_and_per_token_cast",
        factory=swiglu_forward_and_per_token_cast,
        grid=_grid(),
        outputs=("out", "out_sf", "clamped_count"),
        pass_configs=PASS_CONFIGS,
        doc="e4m3(silu(gate) * up * w) with one scale per 128 channels (row/col/ue8m0) or per row.",
    ),
)

__all__ = ["KERNELS", "swiglu_forward_and_per_token_cast"]
