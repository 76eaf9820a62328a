"""``quant.swiglu_forward_and_per_channel_cast_and_transpose``: ``act = bf16(silu(gate) * up)``
(optionally clamped), quantized to e4m3 with one scale per channel and ``num_per_tokens`` tokens;
the output is written transposed (``[hidden, num_tokens]``) or as is (``[num_tokens, hidden]``).

``x`` is bf16 ``[num_tokens, 2 * hidden]`` (gate, up), contiguous.  The activation follows the
forward kernel's fp32 steps (``swiglu_forward_and_per_token_cast``: clamp as ``torch.clamp``,
``g / (1 + expf(-g)) * u`` each step rounded on its own; ``c`` = +inf means no clamp), then is
rounded to bf16, as the reference does (``swiglu_forward(...).bfloat16()`` then ``cast``).
Scales: ``sf = max(amax, 1e-4) / 448`` over each ``num_per_tokens x 1`` block of the bf16
activation (rounded up to a power of two with ``round_sf``), data ``e4m3(act * sf_inv)``.

Parameters, in order: ``x``, ``out`` (e4m3, ``[hidden, num_tokens]`` when ``transpose`` else
``[num_tokens, hidden]``), ``out_sf`` (fp32 ``[num_tokens / num_per_tokens, hidden]``), then
``clamp_value`` and ``round_sf`` (0/1).  Rules the op checks: ``num_tokens % 128 == 0``,
``hidden % 64 == 0``, contiguous 16-byte aligned tensors.

Design: a block owns 128 tokens x 64 channels.  Phase 1: each thread loads 4 x (16 bytes of
gate + 16 of up) (all issued first), computes the activation and stores it as bf16 into a
row-major shared tile (16-byte stores, conflict-free).  Phase 2: a thread owns one channel and
32 tokens (lanes run over channels, so each shared load of a warp reads 64 contiguous bytes):
the block amax (partial amaxes meet in shared memory when ``num_per_tokens`` is 128), the scale,
and for the transposed output its 32 bytes of one output row (two 16-byte stores).  Without
transpose the scale inverses go to shared memory and a third phase writes 8-byte row pieces.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl
from .swiglu_forward_and_per_token_cast import PASS_CONFIGS, clamp_gate, clamp_up, rn, sf_bits, sf_inverse, silu_mul

THREADS = 256
TILE_T, TILE_C = 128, 64  # tokens x channels per block
SEG = 32  # tokens per thread in phase 2
CLAMP_MIN = 1e-4
NUM_PER_TOKENS = (32, 128)


def _view(buf, shape, dtype: str):
    """A reinterpreting view of ``buf``'s data; build it inline at each use."""
    return T.Tensor(shape, dtype, buf.data)


def swiglu_forward_and_per_channel_cast_and_transpose(num_per_tokens: int, transpose: bool):
    """Build the PrimFunc for one (tokens per scale, output orientation)."""
    if num_per_tokens not in NUM_PER_TOKENS:
        raise ValueError(f"swiglu_forward_and_per_channel_cast_and_transpose: num_per_tokens must be one of "
                         f"{NUM_PER_TOKENS} (got {num_per_tokens!r})")
    npt = num_per_tokens
    tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    out_shape = (hidden, tokens) if transpose else (tokens, hidden)
    rows_per_pass = THREADS // (TILE_C // 8)  # 32 token rows per phase-1 pass
    segs = TILE_T // SEG  # 4
    blocks = TILE_T // npt  # scale blocks per tile: 4 or 1

    @T.prim_func
    def main(
        x: T.Tensor((tokens, hidden * 2), "bfloat16"),
        out: T.Tensor(out_shape, "float8_e4m3fn"),
        out_sf: T.Tensor((tokens // npt, hidden), "float32"),
        clamp_value: T.float32,
        round_sf: T.int32,
    ):
        with T.Kernel(tokens // TILE_T, hidden // TILE_C, threads=THREADS) as (bt, bc):
            tid = T.get_thread_binding()
            tile = T.alloc_shared((TILE_T, TILE_C), "bfloat16")
            part = T.alloc_shared((segs, TILE_C), "float32")  # partial amax per 32-token segment
            inv_sh = T.alloc_shared((blocks, TILE_C), "float32")
            raw_g = T.alloc_local((TILE_T // rows_per_pass, 8), "bfloat16")
            raw_u = T.alloc_local((TILE_T // rows_per_pass, 8), "bfloat16")
            a16 = T.alloc_local((8,), "bfloat16")
            vals = T.alloc_local((SEG,), "float32")
            q8 = T.alloc_local((SEG,), "float8_e4m3fn")
            f8 = T.alloc_local((8,), "float32")
            o8 = T.alloc_local((8,), "float8_e4m3fn")
            amax = T.alloc_var("float32")
            r1 = tid // (TILE_C // 8)
            c8 = tid % (TILE_C // 8)
            t0 = bt * TILE_T
            ch0 = bc * TILE_C
            # phase 1: activation tile
            for p in T.unroll(TILE_T // rows_per_pass):
                for k in T.vectorized(8):
                    raw_g[p, k] = _view(x, (tokens * hidden * 2,), "bfloat16")[
                        ((t0 + p * rows_per_pass + r1) * (hidden // 4) + bc * (TILE_C // 8) + c8) * 8 + k]
                for k in T.vectorized(8):
                    raw_u[p, k] = _view(x, (tokens * hidden * 2,), "bfloat16")[
                        ((t0 + p * rows_per_pass + r1) * (hidden // 4) + hidden // 8 + bc * (TILE_C // 8) + c8) * 8 + k]
            for p in T.unroll(TILE_T // rows_per_pass):
                for k in T.unroll(8):
                    a16[k] = T.Cast("bfloat16", silu_mul(clamp_gate(T.Cast("float32", raw_g[p, k]), clamp_value),
                                                         clamp_up(T.Cast("float32", raw_u[p, k]), clamp_value)))
                for k in T.vectorized(8):
                    tile[p * rows_per_pass + r1, c8 * 8 + k] = a16[k]
            T.sync_threads()
            # phase 2: one channel x 32 tokens per thread
            ch = (tid // 32) % (TILE_C // 32) * 32 + tid % 32
            seg = tid // 32 // (TILE_C // 32)
            amax = T.float32(0.0)
            for i in T.unroll(SEG):
                vals[i] = T.Cast("float32", tile[seg * SEG + i, ch])
                amax = T.max(amax, T.abs(vals[i]))
            if npt == 128:
                part[seg, ch] = amax
                T.sync_threads()
                amax = T.max(T.max(part[0, ch], part[1, ch]), T.max(part[2, ch], part[3, ch]))
            bits = sf_bits(amax, T.float32(CLAMP_MIN), round_sf)
            inv = sf_inverse(bits, amax, T.float32(CLAMP_MIN), round_sf)
            if npt == SEG or seg == 0:
                out_sf[bt * blocks + seg * blocks // segs, ch0 + ch] = T.reinterpret(bits, "float32")
            if transpose:
                for i in T.unroll(SEG):
                    vals[i] = rn("__fmul_rn", vals[i], inv)
                for i in T.vectorized(SEG):
                    q8[i] = T.Cast("float8_e4m3fn", vals[i])
                for v in T.unroll(SEG // 16):
                    for k in T.vectorized(16):
                        _view(out, (tokens * hidden,), "float8_e4m3fn")[
                            ((ch0 + ch) * (tokens // 16) + bt * (TILE_T // 16) + seg * (SEG // 16) + v) * 16 + k
                        ] = q8[v * 16 + k]
            else:
                if npt == SEG or seg == 0:
                    inv_sh[seg * blocks // segs, ch] = inv
                T.sync_threads()
                # phase 3: 8-byte pieces of output rows
                for p in T.unroll(TILE_T // rows_per_pass):
                    for k in T.vectorized(8):
                        a16[k] = tile[p * rows_per_pass + r1, c8 * 8 + k]
                    for k in T.unroll(8):
                        f8[k] = rn("__fmul_rn", T.Cast("float32", a16[k]),
                                   inv_sh[(p * rows_per_pass + r1) // npt, c8 * 8 + k])
                    for k in T.vectorized(8):
                        o8[k] = T.Cast("float8_e4m3fn", f8[k])
                    for k in T.vectorized(8):
                        _view(out, (tokens * hidden,), "float8_e4m3fn")[
                            ((t0 + p * rows_per_pass + r1) * (hidden // 8) + bc * (TILE_C // 8) + c8) * 8 + k] = o8[k]

    return main


KERNELS = (
    KernelDecl(
        name="quant.swiglu_forward_and_per_channel_cast_and_transpose",
        factory=swiglu_forward_and_per_channel_cast_and_transpose,
        grid=tuple({"num_per_tokens": n, "transpose": t} for n in NUM_PER_TOKENS for t in (True, False)),
        outputs=("out", "out_sf"),
        pass_configs=PASS_CONFIGS,
        doc="e4m3(bf16(silu(gate) * up)) with one scale per channel and 32/128 tokens; output transposed or not.",
    ),
)

__all__ = ["KERNELS", "swiglu_forward_and_per_channel_cast_and_transpose"]
