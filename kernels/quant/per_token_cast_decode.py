"""``quant.per_token_cast_decode``: ``quant.per_token_cast`` for decode batches: the op launches
it for at most ``meta["max_tokens"]`` (256) tokens of plain bf16 / fp32 input cast to e4m3 with
fp32 scales (row- or column-major) and 16..128 channels per scale, and ``quant.per_token_cast``
for everything else (more tokens, e2m1, packed UE8M0, one scale per row).

Same parameters, in the same order, and the same bits as ``quant.per_token_cast`` (see
``per_token_cast.py`` for the contract): ``x [num_tokens, hidden]`` (bf16 / fp32, row stride a
multiple of 16 bytes), ``out`` e4m3, ``out_sf`` fp32 (row- or column-major by ``sf_col``),
``group_shift`` (4..7: 16..128 channels per scale), ``whole_row`` (must be 0), ``round_sf``,
``sf_col``, ``col_blocks`` = the grid's y extent, ``ceil(hidden / meta["chunk_<dtype>"])``.
Variants: ``in_dtype`` bfloat16 / float32 with ``fmt="e4m3", sf="f32", mode="cast",
in_sf="none"``.

Why two kernels: at decode sizes ``quant.per_token_cast`` is latency-bound.  Its warp owns one
row and four 16-byte vectors per lane (1024 bf16 channels), so after the loads land each lane
walks four scale groups one after another: per group 8 maxima, up to 4 dependent shuffles and two
IEEE divisions whose slow-path branches keep nvcc from interleaving the groups (~4 x 300 cycles
on the critical path), and 7 of a block's 8 warps are idle at one token.  Here a block is 4 warps
on one row and a lane owns one vector (``chunk`` = 1024 bf16 / 512 fp32 channels per block):
the same loads spread over 4x the lanes, one group per lane, a chain of one load, one group
reduction and one store.  Grid ``(num_tokens, col_blocks)``.  The fp32 expressions (the max
order within a lane, the xor-shuffle order, ``sf_from_amax``, ``v * sf_inv``) are
``quant.per_token_cast``'s, so the results are bit-identical.

Measured (H200, CUPTI kernel time, L2 flushed; ``quant.per_token_cast`` -> this, tile_kernels
1.0.0 in parentheses), bf16 x 7168, 1x128 scales: 1 token 2.3 -> 1.6 (1.8), 4: 2.3 -> 1.7 (1.9),
16: 2.5 -> 1.9 (2.0), 64: 2.8 -> 2.1 (2.3), 128: 3.3 -> 2.6 (2.8) us (compare_peer, 2026-12-02);
256: 4.19 -> 3.42 us, and fp32 x 2048 and bf16 x 576 gain the same ~0.6 us (an earlier A/B run).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl
from . import _formats as F

# input dtype (torch name) -> (elements per 16-byte vector, log2 of it)
_INPUTS = {"bfloat16": (8, 3), "float32": (4, 2)}
WARPS = 4  # warps per block, all on one row
MAX_TOKENS = 256  # the op uses this kernel up to this many tokens (decode); quant.per_token_cast above


def chunk_elems(in_dtype: str) -> int:
    """Channels one block covers (the op's ``col_blocks = ceil(hidden / this)``)."""
    return WARPS * 32 * _INPUTS[in_dtype][0]


def per_token_cast_decode(in_dtype: str, fmt: str, sf: str, mode: str, in_sf: str = "none"):
    """Build the PrimFunc of one variant (only e4m3 output, fp32 scales, plain input)."""
    if in_dtype not in _INPUTS or (fmt, sf, mode, in_sf) != ("e4m3", "f32", "cast", "none"):
        raise ValueError(f"per_token_cast_decode: unsupported variant {in_dtype!r} {fmt!r} {sf!r} {mode!r}")
    V, LV = _INPUTS[in_dtype]
    NW = 4  # uint32 words per vector
    tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    xs = T.dynamic("x_stride")  # row stride of x in its own elements
    sd0, sd1, ss = T.dynamic("sf_d0"), T.dynamic("sf_d1"), T.dynamic("sf_stride")
    xw_shape = (tokens, (xs // V) * NW)  # x as uint32 words: proves 16-byte alignment of a vector
    o8_shape = (tokens, (hidden // V) * V)

    @T.prim_func
    def main(
        x: T.StridedTensor((tokens, hidden), (xs, 1), in_dtype),
        out: T.Tensor((tokens, hidden), "float8_e4m3fn"),
        out_sf: T.StridedTensor((sd0, sd1), (ss, 1), "float32"),
        group_shift: T.int32,
        whole_row: T.int32,
        round_sf: T.int32,
        sf_col: T.int32,
        col_blocks: T.int32,
    ):
        with T.Kernel(tokens, col_blocks, threads=32 * WARPS) as (row, bc):
            tid = T.get_thread_binding()
            lane = tid % 32
            words = T.alloc_local((NW,), "uint32")
            vals = T.alloc_local((V,), "float32")
            o8 = T.alloc_local((V,), "float8_e4m3fn")
            amax = T.alloc_var("float32")
            col = bc * (WARPS * 32 * V) + tid * V  # this lane's first channel
            if col < hidden:
                for w in T.vectorized(NW):
                    words[w] = T.Tensor(xw_shape, "uint32", x.data)[row, (col // V) * NW + w]
            else:
                for w in T.unroll(NW):
                    words[w] = T.uint32(0)
            for w in T.unroll(NW):
                if in_dtype == "bfloat16":
                    vals[2 * w] = F.bf16_lo(words[w])
                    vals[2 * w + 1] = F.bf16_hi(words[w])
                else:
                    vals[w] = T.reinterpret(words[w], "float32")
            amax = T.float32(0)
            for k in T.unroll(V):
                amax = T.max(amax, T.abs(vals[k]))
            for d in T.unroll(5):
                if d + LV < group_shift:
                    amax = T.max(amax, T.shfl_xor(amax, 1 << d))
            sfv, sf_inv = F.sf_from_amax(amax, fmt, round_sf)
            if col < hidden:
                if (lane & ((1 << (group_shift - LV)) - 1)) == 0:
                    out_sf[F.sf_index("f32", row, col >> group_shift, sf_col)] = sfv
                for k in T.unroll(V):
                    vals[k] = vals[k] * sf_inv
                for k in T.vectorized(V):
                    o8[k] = F.to_e4m3(vals[k])
                for k in T.vectorized(V):
                    T.Tensor(o8_shape, "float8_e4m3fn", out.data)[row, col + k] = o8[k]

    return main


KERNELS = (
    KernelDecl(
        name="quant.per_token_cast_decode",
        factory=per_token_cast_decode,
        grid=tuple(dict(in_dtype=d, fmt="e4m3", sf="f32", mode="cast", in_sf="none") for d in _INPUTS),
        outputs=("out", "out_sf"),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # the kernel guards every access itself
        doc="quant.per_token_cast (plain x -> e4m3, fp32 scales) at decode sizes: one vector and one group per lane.",
        meta={"max_tokens": MAX_TOKENS, **{f"chunk_{d}": chunk_elems(d) for d in _INPUTS}},
    ),
)

__all__ = ["KERNELS", "MAX_TOKENS", "chunk_elems", "per_token_cast_decode"]
