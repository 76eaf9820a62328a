"""``quant.per_channel_cast_and_transpose``: bf16 ``x [T, H]`` -> e4m3 ``out [H, T]`` with one
scale per (``num_per_tokens`` tokens x 1 channel) block.

Parameters, in order: ``x [num_tokens, hidden]`` bfloat16, ``out [hidden, num_tokens]`` e4m3,
``out_sf [ceil(num_tokens / num_per_tokens), hidden]`` fp32 (dequantization scales), and the
int32 scalar ``round_sf`` (non-zero: power-of-two scales).  Compile time: ``num_per_tokens`` in
{32, 128}.  Runtime: num_tokens (any, odd included), hidden (``hidden % 64 == 0``, checked by
the op).

Semantics: ``out = cast(x, "e4m3", block_size=(num_per_tokens, 1))[0].T`` (contiguous) and
``out_sf`` its scales, as ``tile_kernels.torch.cast`` computes them: ``sf = max(amax, 1e-4) /
448``, ``sf_inv = 448 / max(amax, 1e-4)`` (two fp32 divisions), or with ``round_sf`` the sf
rounded up to a power of two through its bits and ``sf_inv = 1 / sf``; ``out = e4m3(x *
sf_inv)``, round to nearest even, saturating.  A last partial block of tokens takes its amax
over the tokens present.

Design: a block of 256 threads owns 128 tokens x 64 channels (token tiles on ``blockIdx.x``,
channel tiles on ``blockIdx.y``) and transposes them through a 16 KB shared tile
``tile[channel, token]`` of bf16:

1. Load: lane ``% 8`` picks 8 channels (one 16-byte vector), ``lane // 8`` and the warp pick
   4 rows (``32 i + 4 warp + lane // 8``), so an instruction reads 4 rows x 128 contiguous
   bytes; rows past ``num_tokens`` read as zeros.  Each element is stored to its channel's
   row of the tile (2-byte stores).
2. Quantize: warp ``w`` owns channels ``8 w .. 8 w + 7`` (one per ``lane % 8``), ``lane // 8``
   picks 32 consecutive tokens: four 16-byte shared loads, amax (butterfly over the 4 lanes of
   a channel when ``num_per_tokens`` is 128), scales, and 32 bytes of ``out`` as two 16-byte
   stores (a warp writes 8 rows x 128 contiguous bytes) when ``num_tokens % 16 == 0``, byte
   stores otherwise.

Tile swizzle: element ``(c, t)`` sits at column ``((t // 8) ^ s(c)) * 8 + t % 8`` with
``s(c) = (c % 8) ^ (c // 8)``: 16-byte chunks keep their tokens together, the load-side stores
(8 channels 8 apart, same chunk) and the quantize-side loads (8 adjacent channels, same chunk)
each fall on distinct banks.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from ._formats import sf_from_amax, to_e4m3

TILE_T = 128  # tokens per tile
TILE_C = 64  # channels per tile (hidden % 64 == 0)
THREADS = 256
IN_VEC = 8  # bf16 per 16-byte load
LOAD_ROWS = TILE_T * (TILE_C // IN_VEC) // THREADS  # rows loaded per thread: 4
TOKENS = TILE_T * TILE_C // THREADS  # tokens quantized per thread: 32
NUM_PER_TOKENS = (32, 128)
# __launch_bounds__(256, 6): at most 40 registers (no spills), 6 blocks per SM where 64 registers
# allowed 4 (ncu on the H200: 66 % DRAM throughput at 50 % theoretical occupancy).  Measured at
# 8192 x 7168 (2026-12-03): 55.2 / 54.2 us -> 50.4 / 50.8 us (tile_kernels: 48.6-49.2 us).
MIN_BLOCKS = 6
_BF16, _E4M3, _F32 = "bfloat16", "float8_e4m3fn", "float32"  # (names, not string annotations)


def _view(buf, shape, dtype: str):
    """A view of ``buf``'s data with another shape.  Called inline, never bound to a name in
    the PrimFunc body: binding a view renames the data pointer, hence the kernel parameter."""
    return T.Tensor(shape, dtype, buf.data)


def per_channel_cast_and_transpose(num_per_tokens: int):
    """Build the PrimFunc for one scale block length along tokens (32 or 128)."""
    if num_per_tokens not in NUM_PER_TOKENS:
        raise ValueError(f"per_channel_cast_and_transpose: num_per_tokens must be one of {NUM_PER_TOKENS} "
                         f"(got {num_per_tokens!r})")
    lanes_per_block = num_per_tokens // TOKENS  # lanes sharing one scale: 1 or 4
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    # ``out`` with its row length rounded down to 16: equal to ``out`` on the vector path,
    # where it proves every row starts 16-byte aligned.
    out_aligned_shape = (hidden, num_tokens // 16 * 16)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), _BF16),
        out: T.Tensor((hidden, num_tokens), _E4M3),
        out_sf: T.Tensor((T.ceildiv(num_tokens, num_per_tokens), hidden), _F32),
        round_sf: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, TILE_T), T.ceildiv(hidden, TILE_C), threads=THREADS) as (bt, bc):
            T.assume(hidden % TILE_C == 0)
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            tile = T.alloc_shared((TILE_C, TILE_T), "bfloat16")
            row_in = T.alloc_local((IN_VEC,), "bfloat16")
            vals = T.alloc_local((TOKENS,), "bfloat16")
            amax = T.alloc_var("float32")
            sf = T.alloc_local((1,), "float32")
            sf_inv = T.alloc_local((1,), "float32")
            q = T.alloc_local((TOKENS,), "float8_e4m3fn")

            # 1. x tile -> tile[channel, token] (swizzled)
            lx = lane % 8
            for i in T.unroll(LOAD_ROWS):
                t = i * 32 + warp * 4 + lane // 8
                if bt * TILE_T + t < num_tokens:
                    for k in T.vectorized(IN_VEC):
                        row_in[k] = x[bt * TILE_T + t, bc * TILE_C + lx * IN_VEC + k]
                else:
                    for k in T.vectorized(IN_VEC):
                        row_in[k] = T.bfloat16(0)
                for k in T.unroll(IN_VEC):
                    tile[lx * IN_VEC + k, ((t // 8) ^ k ^ lx) * 8 + t % 8] = row_in[k]
            T.sync_threads()

            # 2. channel c = 8 warp + lane % 8, tokens t0 .. t0 + 31
            c = warp * 8 + lane % 8
            g = lane // 8
            t0 = bt * TILE_T + g * TOKENS
            for k in T.unroll(TOKENS // 8):
                for e in T.vectorized(8):
                    vals[k * 8 + e] = tile[c, ((g * 4 + k) ^ (lane % 8) ^ warp) * 8 + e]
            amax = T.float32(0)
            for e in T.unroll(TOKENS):
                amax = T.max(amax, T.abs(T.Cast("float32", vals[e])))
            if lanes_per_block == 4:
                amax = T.max(amax, T.shfl_xor(amax, 8))
                amax = T.max(amax, T.shfl_xor(amax, 16))
            sf[0], sf_inv[0] = sf_from_amax(amax, "e4m3", round_sf)
            if g % lanes_per_block == 0 and t0 < num_tokens:
                out_sf[(bt * TILE_T + g * TOKENS) // num_per_tokens, bc * TILE_C + c] = sf[0]
            for e in T.vectorized(TOKENS):
                q[e] = to_e4m3(T.Cast("float32", vals[e]) * sf_inv[0])
            if num_tokens % 16 == 0:
                for k in T.unroll(TOKENS // 16):
                    if t0 + k * 16 < num_tokens:
                        for e in T.vectorized(16):
                            _view(out, out_aligned_shape, "float8_e4m3fn")[bc * TILE_C + c, t0 + k * 16 + e] = q[k * 16 + e]
            else:
                for e in T.unroll(TOKENS):
                    if t0 + e < num_tokens:
                        out[bc * TILE_C + c, t0 + e] = q[e]

    return main


KERNELS = (
    KernelDecl(
        name="quant.per_channel_cast_and_transpose",
        factory=per_channel_cast_and_transpose,
        grid=tuple({"num_per_tokens": n} for n in NUM_PER_TOKENS),
        outputs=("out", "out_sf"),
        doc="bf16 [T, H] -> e4m3 [H, T] with (num_per_tokens x 1) scales [ceil(T / n), H].",
    ),
)

__all__ = ["KERNELS", "per_channel_cast_and_transpose"]
