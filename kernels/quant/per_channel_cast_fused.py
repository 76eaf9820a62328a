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

Design: a block of 256 threads owns a 128-token x 128-channel tile (token tiles on
``blockIdx.x``, channel tiles on ``blockIdx.y``).  Lane ``% 8`` picks a run of 16 channels,
``lane // 8`` and the warp pick 4 of the 128 rows (rows ``32 i + 4 warp + lane // 8``), so a
load instruction reads 4 rows x 256 contiguous bytes (bf16) and a store writes 4 rows x 128
bytes.  Each thread keeps its 4 x 16 source values in registers as fp32 (one pass over
global memory): amax over its rows, a butterfly over the 4 lanes of a warp that share the
channels, then the 8 warps' partial maxima meet in shared memory, where 128 threads each
finish one channel, write its sf and publish ``sf_inv``; then every thread scales,
converts (``cvt.rn.satfinite.e4m3x2.f32``) and stores 16 bytes per row.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from ._formats import sf_from_amax, to_e4m3

TILE_T = 128  # tokens per tile = tokens per scale (num_per_tokens)
TILE_H = 128  # channels per tile
VEC = 16  # channels per thread
THREADS = 256
ROWS = TILE_T * (TILE_H // VEC) // THREADS  # rows per thread: 4
IN_GROUP = 128  # channels per input scale of a quantized input (num_per_channels)
_IN_DTYPES = ("bfloat16", "float32", "float8_e4m3fn")
_E4M3, _F32, _I32 = "float8_e4m3fn", "float32", "int32"  # (names, not string annotations)
# Blocks per SM to keep resident (caps registers at 80 / 128): fp32 holds 64 source registers
# per thread and spills at 80; bf16 and e4m3 fit in 80 without spills.  Not measured yet.
_MIN_BLOCKS = {"bfloat16": 3, "float32": 2, "float8_e4m3fn": 3}


def _value(raw, row_sf, i, j, with_sf: bool):
    """The fp32 source value: the loaded element, times its row's input scale when quantized."""
    if with_sf:
        return T.Cast("float32", raw[i, j]) * row_sf[i]
    return T.Cast("float32", raw[i, j])


def per_channel_cast_fused(in_dtype: str, expand: bool):
    """Build the PrimFunc for one input dtype (torch naming) with or without ``pos_to_token``."""
    if in_dtype not in _IN_DTYPES:
        raise ValueError(f"per_channel_cast_fused: in_dtype must be one of {_IN_DTYPES} (got {in_dtype!r})")
    with_sf = in_dtype == "float8_e4m3fn"
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
            T.assume(hidden % VEC == 0)
            T.annotate_min_blocks_per_sm(_MIN_BLOCKS[in_dtype])
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            col = bh * TILE_H + (lane % 8) * VEC  # first channel of this thread
            raw = T.alloc_local((ROWS, VEC), in_dtype)  # the source, as loaded
            row_sf = T.alloc_local((ROWS,), "float32")  # input scale per row (quantized input)
            amax = T.alloc_local((VEC,), "float32")
            inv = T.alloc_local((VEC,), "float32")
            q = T.alloc_local((VEC,), "float8_e4m3fn")
            src = T.alloc_var("int32")
            sf = T.alloc_local((1,), "float32")
            sf_inv = T.alloc_local((1,), "float32")
            m = T.alloc_var("float32")
            partial = T.alloc_shared((THREADS // 32, TILE_H), "float32")
            inv_shared = T.alloc_shared((TILE_H,), "float32")

            for j in T.vectorized(VEC):
                amax[j] = T.float32(0)
            for i in T.unroll(ROWS):
                row = bt * TILE_T + i * 32 + warp * 4 + lane // 8
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
                    amax[j] = T.max(amax[j], T.abs(_value(raw, row_sf, i, j, with_sf)))

            # Lanes l, l ^ 8, l ^ 16, l ^ 24 hold the same channels.
            for j in T.unroll(VEC):
                amax[j] = T.max(amax[j], T.shfl_xor(amax[j], 8))
                amax[j] = T.max(amax[j], T.shfl_xor(amax[j], 16))
            if lane < 8:
                for j in T.vectorized(VEC):
                    partial[warp, lane * VEC + j] = amax[j]
            T.sync_threads()
            if tid < TILE_H:
                m = partial[0, tid]
                for w in T.unroll(1, THREADS // 32):
                    m = T.max(m, partial[w, tid])
                sf[0], sf_inv[0] = sf_from_amax(m, "e4m3", round_sf)
                inv_shared[tid] = sf_inv[0]
                if bh * TILE_H + tid < hidden:
                    out_sf[bt, bh * TILE_H + tid] = sf[0]
            T.sync_threads()

            for j in T.vectorized(VEC):
                inv[j] = inv_shared[(lane % 8) * VEC + j]
            for i in T.unroll(ROWS):
                row = bt * TILE_T + i * 32 + warp * 4 + lane // 8
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
        grid=tuple({"in_dtype": d, "expand": e} for e in (False, True) for d in _IN_DTYPES),
        outputs=("out", "out_sf"),
        doc="e4m3 cast with (128 tokens x 1 channel) scales; optional input scales and pos_to_token gather.",
    ),
)

__all__ = ["KERNELS", "per_channel_cast_fused"]
