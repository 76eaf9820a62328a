"""``quant.per_channel_cast_bf16``: ``quant.per_channel_cast_fused`` for plain bf16 input without
``pos_to_token`` (what ``per_channel_cast`` and ``per_channel_cast_fused`` launch for a bf16
tensor and no gather; ``quant.per_channel_cast_fused`` serves fp32, quantized and gathered inputs).

Same parameters, in the same order, and the same bits as ``quant.per_channel_cast_fused``
(see that module for the contract): ``x [num_tokens, hidden]`` bf16, ``out`` e4m3, ``out_sf
[ceil(num_tokens / 128), hidden]`` fp32, ``x_sf`` and ``pos_to_token`` (not read: any tensor),
``round_sf`` (int32).  One variant: ``in_dtype="bfloat16", expand=False`` (the keys of the
matching ``quant.per_channel_cast_fused`` variant, which that kernel no longer builds).
Runtime: num_tokens, hidden (``hidden % 16 == 0``).

Same tiles and thread layout as ``quant.per_channel_cast_fused``'s bf16 variants (a block owns
128 tokens x 128 channels, 256 threads, a thread 8 channels x 8 rows, one 16-byte load per row,
all loads issued first); what differs is the work per element (that kernel's SASS spends ~2.5
instructions per element on the amax alone: a bf16 -> fp32 conversion, PRMT + IMAD for an upper
half, and an FMNMX):

* the amax is taken on the raw bf16 words: for non-negative values IEEE order is the unsigned
  integer order of the bits, so ``max(|v|)`` over a pair of channels is one ``LOP3`` (clear the
  two sign bits) and one ``__vmaxu2`` (per-16-bit unsigned max, ``VIMNMX.U16x2`` on sm_90) per
  two elements, and the fp32 amax is the exact conversion of the winning bf16 (equal to the fused
  kernel's fp32 maximum for every non-NaN input); the warp butterfly and the shared-memory
  reduction move words (two channels) instead of floats: 4 shuffles instead of 8 per thread;
* the upper bf16 of a word converts with one ``LOP3`` (``& 0xFFFF0000``), not ``PRMT`` + shift;
* row offsets are int32 ``row * hidden + col`` with one runtime step per row (the fused kernel
  rebuilds a 64-bit ``IMAD.WIDE`` address for each of its 8 loads and 8 stores);
* the source stays in registers as 32 words; ``__launch_bounds__(256, 4)``: 62 registers, no
  spills, 8 ``LDG.E.128`` issued before the first use, 616 SASS instructions (fused: 984).

Measured (H200, CUPTI kernel time, L2 flushed; ``quant.per_channel_cast_fused`` -> this,
tile_kernels 1.0.0 in parentheses; compare_peer, 2026-12-02): per_channel_cast 4096x2048 10.9 ->
9.5 (8.5), 8064x2048 18.4 -> 15.5 (15.1), 4096x6144 25.4 -> 21.8 (21.3), 8064x6144 44.1 -> 39.7
(39.4), per_channel_cast_fused 4096x4096 19.1 -> 15.6 (15.4) us; outputs bit-equal.

The scale arithmetic and its stores (``publish_scale``, the fused kernel's macro) and the scaling
``e4m3(v * sf_inv)`` are the fused kernel's expressions on the same fp32 values, so ``out`` and
``out_sf`` are bit-identical.  A NaN input differs (the integer maximum lets a NaN win; the fused
kernel's fmax ignores it): neither matches the torch reference, which propagates NaN.
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from ._formats import bf16_hi, bf16_lo, to_e4m3
from .per_channel_cast_fused import TILE_H, TILE_T, publish_scale

VEC = 8  # channels per thread (one 16-byte bf16 load per row)
WORDS = VEC // 2  # uint32 words per thread and row
ROWS = 8  # rows per thread
THREADS = 256
WARPS = THREADS // 32
LPR = TILE_H // VEC  # 16 lanes per tile row
STRIDE = THREADS // LPR  # 16 rows between a thread's rows
# Blocks of 256 threads per SM to keep resident: 4 caps ptxas at 64 registers (62 used, all 8 loads
# in flight).  5 (48 registers) made ptxas consume the first loads before issuing the last two, and
# measured 1-15 % slower than 4 on the H200 (e.g. 15.4 vs 16.9 us at 8064 x 2048).
MIN_BLOCKS = 4
_E4M3, _F32, _I32, _U32 = "float8_e4m3fn", "float32", "int32", "uint32"
_ABS2 = 0x7FFF7FFF  # clears the sign bit of both bf16 halves of a word


def _vmax2(a, b):
    """Per-16-bit-half unsigned maximum of two uint32 words."""
    return T.call_extern(_U32, "__vmaxu2", a, b)


def per_channel_cast_bf16(in_dtype: str, expand: bool):
    """Build the PrimFunc (only ``in_dtype="bfloat16", expand=False``)."""
    if in_dtype != "bfloat16" or expand:
        raise ValueError(f"per_channel_cast_bf16: only bfloat16 without expand (got {in_dtype!r}, {expand!r})")
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    x_sf_shape = (T.dynamic("x_sf_rows"), T.dynamic("x_sf_cols"))
    pos_shape = (T.dynamic("pos_len"),)
    x_words = (num_tokens * (hidden // 2),)  # x as uint32 words, flat
    out_flat = (num_tokens * hidden,)

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, hidden), "bfloat16"),
        out: T.Tensor((num_tokens, hidden), _E4M3),
        out_sf: T.Tensor((T.ceildiv(num_tokens, TILE_T), hidden), _F32),
        x_sf: T.Tensor(x_sf_shape, _F32),
        pos_to_token: T.Tensor(pos_shape, _I32),
        round_sf: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, TILE_T), T.ceildiv(hidden, TILE_H), threads=THREADS) as (bt, bh):
            T.assume(hidden % 16 == 0)
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            col = bh * TILE_H + (lane % LPR) * VEC  # first channel of this thread
            row0 = bt * TILE_T + tid // LPR  # first row of this thread
            words = T.alloc_local((ROWS * WORDS,), _U32)  # the source, as loaded
            mw = T.alloc_local((WORDS,), _U32)  # |v| maxima, two channels per word
            vals = T.alloc_local((VEC,), _F32)
            inv = T.alloc_local((VEC,), _F32)
            q = T.alloc_local((VEC,), _E4M3)
            vo = T.alloc_var(_I32)  # offset of (row0, col) in 8-channel vectors
            vstep = T.alloc_var(_I32)  # vectors between a thread's rows
            acc = T.alloc_var(_U32)
            m = T.alloc_var(_F32)
            sf = T.alloc_local((1,), _F32)
            sf_inv = T.alloc_local((1,), _F32)
            partial = T.alloc_shared((WARPS, TILE_H // 2), _U32)
            inv_shared = T.alloc_shared((TILE_H,), _F32)

            vo = row0 * (hidden // VEC) + col // VEC
            vstep = STRIDE * (hidden // VEC)
            # Every load first (8 x 16 bytes in flight per thread); rows past the end read as 0.
            for i in T.unroll(ROWS):
                if row0 + i * STRIDE < num_tokens and col < hidden:
                    for w in T.vectorized(WORDS):
                        words[i * WORDS + w] = T.Tensor(x_words, _U32, x.data)[
                            (vo + i * vstep) * WORDS + w]
                else:
                    for w in T.unroll(WORDS):
                        words[i * WORDS + w] = T.uint32(0)
            for w in T.unroll(WORDS):
                mw[w] = words[w] & T.uint32(_ABS2)
            for i in T.unroll(1, ROWS):
                for w in T.unroll(WORDS):
                    mw[w] = _vmax2(mw[w], words[i * WORDS + w] & T.uint32(_ABS2))
            # Lanes l and l ^ 16 hold the same channels.
            for w in T.unroll(WORDS):
                mw[w] = _vmax2(mw[w], T.shfl_xor(mw[w], 16))
            if lane < LPR:
                for w in T.vectorized(WORDS):
                    partial[warp, lane * WORDS + w] = mw[w]
            T.sync_threads()
            if tid < TILE_H:
                acc = partial[0, tid // 2]
                for p in T.unroll(1, WARPS):
                    acc = _vmax2(acc, partial[p, tid // 2])
                m = T.Select(tid % 2 == 0, bf16_lo(acc), bf16_hi(acc))
                publish_scale(m, round_sf, sf, sf_inv, inv_shared, out_sf, bt, bh, tid, hidden)
            T.sync_threads()

            for j in T.vectorized(VEC):
                inv[j] = inv_shared[(lane % LPR) * VEC + j]
            for i in T.unroll(ROWS):
                for w in T.unroll(WORDS):
                    vals[2 * w] = bf16_lo(words[i * WORDS + w])
                    vals[2 * w + 1] = bf16_hi(words[i * WORDS + w])
                for j in T.vectorized(VEC):
                    q[j] = to_e4m3(vals[j] * inv[j])
                if row0 + i * STRIDE < num_tokens and col < hidden:
                    for j in T.vectorized(VEC):
                        T.Tensor(out_flat, _E4M3, out.data)[(vo + i * vstep) * VEC + j] = q[j]

    return main


KERNELS = (
    KernelDecl(
        name="quant.per_channel_cast_bf16",
        factory=per_channel_cast_bf16,
        grid=({"in_dtype": "bfloat16", "expand": False},),
        outputs=("out", "out_sf"),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # the kernel guards every access itself
        doc="quant.per_channel_cast_fused for plain bf16 x (no pos_to_token): integer amax on bf16 words.",
    ),
)

__all__ = ["KERNELS", "per_channel_cast_bf16"]
