"""``quant.per_channel_cast_fused``: e4m3 cast with one scale per (128 tokens x 1 channel) block.

Parameters, in order: ``x [num_tokens, hidden]`` (the variant's ``in_dtype``: bfloat16,
float32, or float8_e4m3fn for a quantized input), ``out [num_tokens_out, hidden]`` e4m3,
``out_sf [ceil(num_tokens_out / 128), hidden]`` fp32 (the dequantization scales),
``x_sf [num_tokens, ceil(hidden / 128)]`` fp32 (the input's per-token scales, one per 128
channels; read only by the ``float8_e4m3fn`` variants), ``pos_to_token [num_tokens_out]``
int32 (read only by the ``expand`` variants), and the int32 scalar ``round_sf`` (non-zero:
power-of-two scales).  Without ``expand``, ``num_tokens_out`` is ``num_tokens``; unused tensor
parameters may be any tensor (the op passes a small dummy).

Semantics (those of ``tile_kernels.torch.cast(x, "e4m3", block_size=(128, 1))``):
row ``r`` of the source is ``x[r]`` (``x[r] * x_sf[r, c // 128]`` in fp32 for a quantized
input), or with ``expand`` ``x[pos_to_token[r]]``, and a row of zeros where
``pos_to_token[r]`` is negative (or, rather than reading out of bounds, ``>= num_tokens``).
Per block: ``amax = max(|v|)`` over the block's rows that exist, ``sf = max(amax, 1e-4) /
448`` and ``sf_inv = 448 / max(amax, 1e-4)`` (two fp32 divisions), or with ``round_sf`` the
sf rounded up to a power of two through its bits and ``sf_inv = 1 / sf``; ``out = e4m3(v *
sf_inv)`` (round to nearest even, saturating at 448).  A last partial block of tokens takes
its amax over the rows present.

Runtime: num_tokens, num_tokens_out, hidden (``hidden % 16 == 0``, checked by the op).

Variants: ``in_dtype`` x ``expand``, except plain bf16 without ``expand``: that case is
``quant.per_channel_cast_bf16`` (same parameters and bits, an integer amax on the bf16 words;
see that module), which the op launches instead.

Design: a block owns a 128-token x 128-channel tile (token tiles on ``blockIdx.x``, channel
tiles on ``blockIdx.y``); the layout per input dtype is ``_LAYOUT``.  A thread owns ``VEC``
channels, exactly one 16-byte load per row (8 bf16, 4 fp32, 16 e4m3), and ``ROWS`` rows:
``LPR = 128 / VEC`` consecutive lanes cover a tile row, so a warp's load instruction reads
``32 / LPR`` rows x 256 / 512 / 128 contiguous bytes, and thread ``tid`` reads rows
``i * (THREADS / LPR) + tid // LPR``.  bf16: 8 ch x 8 rows, 256 threads, 4 blocks/SM (64
registers); fp32: 4 ch x 16 rows, 256 threads, 3 blocks/SM (80 registers); e4m3: 16 ch x 8 rows,
128 threads, 6 blocks/SM (80 registers): 128 / 192 / 96 KB of loads in flight per SM (before:
16 channels x 4 rows, 256 threads, 3 / 2 / 3 blocks/SM, 96 / 128 / 48 KB; bf16 and fp32 took
two / four 16-byte loads per row, each instruction reading 16 of every 32 / 64 bytes).  Each
thread issues all its loads first, keeps the source in registers (one pass over global
memory), takes the amax over its rows, a butterfly over the
lanes of a warp that share its channels (xor ``LPR`` .. 16; none for fp32), then the warps'
partial maxima meet in shared memory, where 128 threads each finish one channel, write its sf
and publish ``sf_inv``; then every thread scales, converts (``cvt.rn.satfinite.e4m3x2.f32``)
and stores ``VEC`` bytes per row (a warp's store covers whole 128-byte rows).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from ._formats import sf_from_amax, to_e4m3

TILE_T = 128  # tokens per tile = tokens per scale (num_per_tokens)
TILE_H = 128  # channels per tile
IN_GROUP = 128  # channels per input scale of a quantized input (num_per_channels)
_IN_DTYPES = ("bfloat16", "float32", "float8_e4m3fn")
_E4M3, _F32, _I32 = "float8_e4m3fn", "float32", "int32"  # (names, not string annotations)
# Per input dtype: (VEC channels per thread = one 16-byte load, ROWS rows per thread, THREADS per
# block, blocks per SM to keep resident); VEC * ROWS * THREADS = TILE_T * TILE_H.  A thread holds
# ROWS * 16 source bytes in registers; the min blocks cap the registers at 64 / 80 / 80 (ptxas
# keeps at most 8-16 bytes of stack around the sf division) for 128 / 192 / 96 KB of loads in
# flight per SM.  (bf16 with 16 rows x 128 threads spills 160 bytes at 96 registers.)  Not
# measured on a GPU yet.
_LAYOUT = {
    "bfloat16": (8, 8, 256, 4),
    "float32": (4, 16, 256, 3),
    "float8_e4m3fn": (16, 8, 128, 6),
}


def _value(raw, row_sf, i, j, with_sf: bool):
    """The fp32 source value: the loaded element, times its row's input scale when quantized."""
    if with_sf:
        return T.Cast("float32", raw[i, j]) * row_sf[i]
    return T.Cast("float32", raw[i, j])


@T.macro
def publish_scale(m: T.Ref, round_sf, sf, sf_inv, inv_shared, out_sf, bt, bh, tid, hidden):
    """Channel ``tid`` of the tile, whose amax is ``m``: its sf into ``out_sf``, its sf_inv into
    ``inv_shared`` (also ``quant.per_channel_cast_bf16``'s).  Callers pass their own names (a macro
    binds its arguments by name); ``m`` goes by reference, which spares the kernel a copy of it."""
    sf[0], sf_inv[0] = sf_from_amax(m, "e4m3", round_sf)
    inv_shared[tid] = sf_inv[0]
    if bh * TILE_H + tid < hidden:
        out_sf[bt, bh * TILE_H + tid] = sf[0]


def per_channel_cast_fused(in_dtype: str, expand: bool):
    """Build the PrimFunc for one input dtype (torch naming) with or without ``pos_to_token``."""
    if in_dtype not in _IN_DTYPES:
        raise ValueError(f"per_channel_cast_fused: in_dtype must be one of {_IN_DTYPES} (got {in_dtype!r})")
    with_sf = in_dtype == "float8_e4m3fn"
    VEC, ROWS, THREADS, MIN_BLOCKS = _LAYOUT[in_dtype]
    WARPS = THREADS // 32
    LPR = TILE_H // VEC  # lanes per tile row (8, 16 or 32)
    STRIDE = THREADS // LPR  # rows between a thread's rows (the block covers this many per step)
    assert VEC * ROWS * THREADS == TILE_T * TILE_H and 32 % LPR == 0 and THREADS >= TILE_H
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    num_out = T.dynamic("num_tokens_out") if expand else num_tokens
    # Shapes of parameters a variant does not read: free symbols of their own.
    x_sf_shape = (num_tokens, T.ceildiv(hidden, IN_GROUP)) if with_sf else (T.dynamic("x_sf_rows"), T.dynamic("x_sf_cols"))
    pos_shape = (num_out,) if expand else (T.dynamic("pos_len"),)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), in_dtype),
        out: T.Tensor((num_out, hidden), _E4M3),
        out_sf: T.Tensor((T.ceildiv(num_out, TILE_T), hidden), _F32),
        x_sf: T.Tensor(x_sf_shape, _F32),
        pos_to_token: T.Tensor(pos_shape, _I32),
        round_sf: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_out, TILE_T), T.ceildiv(hidden, TILE_H), threads=THREADS) as (bt, bh):
            T.assume(hidden % 16 == 0)
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            col = bh * TILE_H + (lane % LPR) * VEC  # first channel of this thread
            raw = T.alloc_local((ROWS, VEC), in_dtype)  # the source, as loaded
            row_sf = T.alloc_local((ROWS,), "float32")  # input scale per row (quantized input)
            amax = T.alloc_local((VEC,), "float32")
            inv = T.alloc_local((VEC,), "float32")
            q = T.alloc_local((VEC,), "float8_e4m3fn")
            src = T.alloc_var("int32")
            sf = T.alloc_local((1,), "float32")
            sf_inv = T.alloc_local((1,), "float32")
            m = T.alloc_var("float32")
            partial = T.alloc_shared((WARPS, TILE_H), "float32")
            inv_shared = T.alloc_shared((TILE_H,), "float32")

            # Every load of the thread first (ROWS x 16 bytes in flight), then the maxima.
            for i in T.unroll(ROWS):
                row = bt * TILE_T + i * STRIDE + tid // LPR
                src = -1
                if row < num_out and col < hidden:
                    if expand:
                        src = pos_to_token[row]
                        if src >= num_tokens:
                            src = -1
                    else:
                        src = row
                if src >= 0:
                    for j in T.vectorized(VEC):
                        raw[i, j] = x[src, col + j]
                    if with_sf:
                        row_sf[i] = x_sf[src, col // IN_GROUP]
                else:
                    for j in T.vectorized(VEC):
                        raw[i, j] = T.Cast(in_dtype, 0)
                    if with_sf:
                        row_sf[i] = T.float32(0)
            for j in T.vectorized(VEC):
                amax[j] = T.float32(0)
            for i in T.unroll(ROWS):
                for j in T.vectorized(VEC):
                    amax[j] = T.max(amax[j], T.abs(_value(raw, row_sf, i, j, with_sf)))

            # Lanes l ^ (k * LPR) hold the same channels.
            for d in T.unroll(5):
                if (1 << d) >= LPR:
                    for j in T.unroll(VEC):
                        amax[j] = T.max(amax[j], T.shfl_xor(amax[j], 1 << d))
            if lane < LPR:
                for j in T.vectorized(VEC):
                    partial[warp, lane * VEC + j] = amax[j]
            T.sync_threads()
            if tid < TILE_H:
                m = partial[0, tid]
                for w in T.unroll(1, WARPS):
                    m = T.max(m, partial[w, tid])
                publish_scale(m, round_sf, sf, sf_inv, inv_shared, out_sf, bt, bh, tid, hidden)
            T.sync_threads()

            for j in T.vectorized(VEC):
                inv[j] = inv_shared[(lane % LPR) * VEC + j]
            for i in T.unroll(ROWS):
                row = bt * TILE_T + i * STRIDE + tid // LPR
                for j in T.vectorized(VEC):
                    q[j] = to_e4m3(_value(raw, row_sf, i, j, with_sf) * inv[j])
                if row < num_out and col < hidden:
                    for j in T.vectorized(VEC):
                        out[row, col + j] = q[j]

    return main


KERNELS = (
    KernelDecl(
        name="quant.per_channel_cast_fused",
        factory=per_channel_cast_fused,
        # plain bf16 without expand is quant.per_channel_cast_bf16
        grid=tuple({"in_dtype": d, "expand": e} for e in (False, True) for d in _IN_DTYPES
                   if (d, e) != ("bfloat16", False)),
        outputs=("out", "out_sf"),
        doc="e4m3 cast with (128 tokens x 1 channel) scales; optional input scales and pos_to_token gather.",
    ),
)

__all__ = ["KERNELS", "TILE_H", "TILE_T", "per_channel_cast_fused", "publish_scale"]
