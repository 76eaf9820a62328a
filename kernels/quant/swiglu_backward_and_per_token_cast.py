"""``quant.swiglu_backward_and_per_token_cast``: SwiGLU backward from an e4m3 forward input, with
the input gradient also quantized to e4m3 (one scale per ``num_per_channels`` channels).

Per row ``r`` of ``x`` (``[rows, 2 * hidden]`` e4m3 with row-major fp32 scales ``x_sf``), with
``w = weight.flat[pos_to_token_topk[r]]`` (0.0 for a position < 0 or past weight's end) and ``g = grad_out``,
element by element in fp32 and in the reference's order (each step rounded on its own, the one
fused multiply-add where the reference has one, ``fma(x, 1 - s, 1)``):

    x = e4m3(xq) * sf_x;  y = e4m3(yq) * sf_y                 (dequantized gate / up)
    cx = x > c;  cu = y > c;  cl = y < -c                      (c: runtime, +inf = no clamp)
    x = cx ? c : x;  y = cl ? -c : (cu ? c : y)
    t = 1 + expf(-x);  s = 1 / t
    gws = (g * w) * s
    dx = cx ? 0 : (gws * y) * fma(x, 1 - s, 1);  dy = (cu | cl) ? 0 : gws * x
    act = (x / t) * y;  out = bf16(act * w)
    x_grad = bf16([dx, dy]);  (x_grad_fp8, x_grad_sf) = per-token e4m3 cast of fp32 [dx, dy]
    weight_grad.flat[pos_to_token_topk[r]] = sum(g * act)     (fp32, any summation order)

``weight_grad`` entries whose ``token_topk_to_pos`` is negative are set to 0 (as tile_kernels).
Scales: ``sf = max(amax, 1e-4) / 448`` (rounded up to a power of two with ``round_sf``),
``sf_inv = 448 / max(amax, 1e-4)`` or ``1 / sf``; data ``e4m3(v * sf_inv)`` (RNE, saturating).

Parameters, in order: ``x``, ``x_sf``, ``grad_out`` (bf16 ``[rows, hidden]``), ``weight`` (fp32
``[tokens, topk]``), ``pos_to_token_topk`` (int32 ``[rows]``), ``token_topk_to_pos`` (int32
``[tokens, topk]``), outputs ``out`` (bf16 ``[rows, hidden]``), ``x_grad_fp8`` (e4m3
``[rows, 2 * hidden]``), ``x_grad_sf`` (fp32 ``[rows, 2 * hidden / npc]``), ``x_grad`` (bf16
``[rows, 2 * hidden]``), ``weight_grad`` (fp32 ``[tokens, topk]``), then ``clamp_value`` and
``round_sf`` (0/1).  All contiguous, 16-byte aligned; ``hidden % npc == 0``.


Design.  Why this shape (SASS, nvcc 13.0, npc 32): the kernel is issue-bound, not DRAM-bound.  An earlier
version's row loop was ~905 instructions per 8 channels (peer: ~667), at 108 registers (4 blocks of 128
threads, 16 warps per SM; peer 63 registers, 32 warps per SM).  Where its extra instructions were:
- ``1 / t`` was a general division (``__fdiv_rn``: FCHK + slow-path branch per element); a
  correctly rounded reciprocal (``__frcp_rn``) gives the same bits for every input, cheaper;
- the clamp selects (4 compares, 4 selects per element) ran even when ``clamp_value`` is +inf (no
  clamp): a uniform test now picks a copy of the row loop without them (with +inf they keep every
  value, NaN included, so the bits are the same);
- the scale's ``round_sf`` variants were each computed (two divisions per scale) and selected;
  now a uniform branch computes one (1 / sf is ``__frcp_rn`` too);
- the second unit's bf16 stores came out as 4-byte ``STG.E`` (12 per step): ``T.stg128`` now.
One unit (8 channels) per thread per step and ``__launch_bounds__(128, 8)``: 64 registers, no
spills, 8 blocks (32 warps) per SM, so as many loads in flight per SM as before (16 warps x 2
units) and twice the warps to hide the math's latency.  SASS (npc 32, nvcc 13.0): the row loop
without clamp is 717 instructions per 8 channels (was 906; peer 662), with clamp 873; 12 ``FCHK``
per unit (was 22); 3 ``STG.E.128`` + 2 ``STG.E.64`` per unit, no 4-byte data stores.
Each thread still owns channels ``tid * 8 + 1024 * j`` and visits them in the same order, so
``weight_grad``'s sum is the same too (up to nvcc's contraction choices, which the tests allow).
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl
from .swiglu_forward_and_per_token_cast import FP8_MAX, PASS_CONFIGS, no_clamp, rn

THREADS = 128
UNROLL = 1  # 2 needs > 64 registers (spills at 64 and at 80)
MIN_BLOCKS = 8  # blocks per SM: 64 registers per thread at most
CLAMP_MIN = 1e-4  # the e4m3 default of tile_kernels (the op has no sf_clamp_min)
NUM_PER_CHANNELS = (32, 128)


def _view(buf, shape, dtype: str):
    """A reinterpreting view of ``buf``'s data; build it inline at each use."""
    return T.Tensor(shape, dtype, buf.data)


def _flat(buf, dtype: str):
    return _view(buf, (buf.shape[0] * buf.shape[1],), dtype)


def _sf_bits(amax, round_sf):
    """fp32 bits of the group's scale ``max(amax, 1e-4) / 448`` (rounded up to a power of two)."""
    bits = T.reinterpret(rn("__fdiv_rn", T.max(amax, T.float32(CLAMP_MIN)), T.float32(FP8_MAX)), "int32")
    return T.if_then_else(round_sf != 0, (bits + 0x7FFFFF) & 0x7F800000, bits)


@T.macro
def _unit(x_grad_fp8, x_grad_sf, x_grad, out, xq, yq, go, sfs, dx, dy, ov, bq, q8, s, row, col, w, clamp_value,
          round_sf, acc, npc: int, clamp: bool):
    """Backward of one unit (8 channels of ``row`` from ``col``) whose inputs are loaded in slot ``s``;
    ``clamp=False`` only where ``clamp_value`` is +inf."""
    xmax = T.alloc_var("float32")
    ymax = T.alloc_var("float32")
    xmax = T.float32(0.0)
    ymax = T.float32(0.0)
    hidden = x_grad.shape[1] // 2
    if col < hidden:
        for k in T.unroll(8):
            xv0 = rn("__fmul_rn", T.Cast("float32", xq[s, k]), sfs[s, 0])
            yv0 = rn("__fmul_rn", T.Cast("float32", yq[s, k]), sfs[s, 1])
            xv = xv0
            yv = yv0
            if clamp:
                xv = T.Select(xv0 > clamp_value, clamp_value, xv0)
                yv = T.Select(yv0 < -clamp_value, -clamp_value, T.Select(yv0 > clamp_value, clamp_value, yv0))
            t = rn("__fadd_rn", T.float32(1.0), T.exp(-xv))
            sg = T.call_extern("float32", "__frcp_rn", t)  # == __fdiv_rn(1, t), bit for bit
            g = T.Cast("float32", go[s, k])
            gws = rn("__fmul_rn", rn("__fmul_rn", g, w), sg)
            fma = T.call_extern("float32", "__fmaf_rn", xv, rn("__fsub_rn", T.float32(1.0), sg), T.float32(1.0))
            if clamp:
                dx[k] = T.Select(xv0 > clamp_value, T.float32(0.0), rn("__fmul_rn", rn("__fmul_rn", gws, yv), fma))
                dy[k] = T.Select(T.Or(yv0 > clamp_value, yv0 < -clamp_value), T.float32(0.0), rn("__fmul_rn", gws, xv))
            else:
                dx[k] = rn("__fmul_rn", rn("__fmul_rn", gws, yv), fma)
                dy[k] = rn("__fmul_rn", gws, xv)
            act = rn("__fmul_rn", rn("__fdiv_rn", xv, t), yv)
            acc[0] += g * act
            ov[k] = rn("__fmul_rn", act, w)
            xmax = T.max(xmax, T.abs(dx[k]))
            ymax = T.max(ymax, T.abs(dy[k]))
    lanes = npc // 8
    for r in T.unroll(lanes.bit_length() - 1):
        xmax = T.max(xmax, T.shfl_xor(xmax, lanes >> (r + 1)))
        ymax = T.max(ymax, T.shfl_xor(ymax, lanes >> (r + 1)))
    if col < hidden:
        xbits = _sf_bits(xmax, round_sf)
        ybits = _sf_bits(ymax, round_sf)
        if col % npc == 0:
            x_grad_sf[row, col // npc] = T.reinterpret(xbits, "float32")
            x_grad_sf[row, (hidden + col) // npc] = T.reinterpret(ybits, "float32")
        for k in T.vectorized(8):
            bq[k] = T.Cast("bfloat16", ov[k])
        T.stg128(_flat(out, "bfloat16")[(row * (hidden // 8) + col // 8) * 8], T.Tensor((1,), "uint32x4", bq.data)[0])
        for k in T.vectorized(8):
            bq[k] = T.Cast("bfloat16", dx[k])
        T.stg128(_flat(x_grad, "bfloat16")[(row * (hidden // 4) + col // 8) * 8],
                 T.Tensor((1,), "uint32x4", bq.data)[0])
        for k in T.vectorized(8):
            bq[k] = T.Cast("bfloat16", dy[k])
        T.stg128(_flat(x_grad, "bfloat16")[(row * (hidden // 4) + (hidden + col) // 8) * 8],
                 T.Tensor((1,), "uint32x4", bq.data)[0])
        xinv = T.alloc_var("float32")
        yinv = T.alloc_var("float32")
        if round_sf != 0:  # uniform: one division per scale, not both variants selected
            xinv = T.call_extern("float32", "__frcp_rn", T.reinterpret(xbits, "float32"))
            yinv = T.call_extern("float32", "__frcp_rn", T.reinterpret(ybits, "float32"))
        else:
            xinv = rn("__fdiv_rn", T.float32(FP8_MAX), T.max(xmax, T.float32(CLAMP_MIN)))
            yinv = rn("__fdiv_rn", T.float32(FP8_MAX), T.max(ymax, T.float32(CLAMP_MIN)))
        xinv = T.if_then_else(xbits == 0, T.float32(0.0), xinv)
        yinv = T.if_then_else(ybits == 0, T.float32(0.0), yinv)
        for k in T.unroll(8):
            dx[k] = rn("__fmul_rn", dx[k], xinv)
        for k in T.vectorized(8):
            q8[k] = T.Cast("float8_e4m3fn", dx[k])
        for k in T.vectorized(8):
            _flat(x_grad_fp8, "float8_e4m3fn")[(row * (hidden // 4) + col // 8) * 8 + k] = q8[k]
        for k in T.unroll(8):
            dy[k] = rn("__fmul_rn", dy[k], yinv)
        for k in T.vectorized(8):
            q8[k] = T.Cast("float8_e4m3fn", dy[k])
        for k in T.vectorized(8):
            _flat(x_grad_fp8, "float8_e4m3fn")[(row * (hidden // 4) + (hidden + col) // 8) * 8 + k] = q8[k]


@T.macro
def _row(x, x_sf, grad_out, out, x_grad_fp8, x_grad_sf, x_grad, xq, yq, go, sfs, dx, dy, ov, bq, q8, bx, tid, w,
         clamp_value, round_sf, acc, npc: int, clamp: bool):
    """Every step of row ``bx``: the ``UNROLL`` units' loads, then their math and stores."""
    hidden = x_grad.shape[1] // 2
    step = THREADS * 8 * UNROLL
    for p in T.serial(T.truncdiv(hidden + step - 1, step)):
        for s in T.unroll(UNROLL):
            col = p * step + s * THREADS * 8 + tid * 8
            if col < hidden:
                for k in T.vectorized(8):
                    xq[s, k] = _flat(x, "float8_e4m3fn")[(bx * (hidden // 4) + col // 8) * 8 + k]
                for k in T.vectorized(8):
                    yq[s, k] = _flat(x, "float8_e4m3fn")[(bx * (hidden // 4) + (hidden + col) // 8) * 8 + k]
                for k in T.vectorized(8):
                    go[s, k] = _flat(grad_out, "bfloat16")[(bx * (hidden // 8) + col // 8) * 8 + k]
                sfs[s, 0] = x_sf[bx, col // npc]
                sfs[s, 1] = x_sf[bx, (hidden + col) // npc]
        for s in T.unroll(UNROLL):
            _unit(x_grad_fp8, x_grad_sf, x_grad, out, xq, yq, go, sfs, dx, dy, ov, bq, q8, s, bx,
                  p * step + s * THREADS * 8 + tid * 8, w, clamp_value, round_sf, acc, npc, clamp)


def swiglu_backward_and_per_token_cast(num_per_channels: int):
    """Build the PrimFunc for one scale group size (32 or 128 channels)."""
    if num_per_channels not in NUM_PER_CHANNELS:
        raise ValueError(f"swiglu_backward_and_per_token_cast: num_per_channels must be one of "
                         f"{NUM_PER_CHANNELS} (got {num_per_channels!r})")
    npc = num_per_channels
    rows, hidden = T.dynamic("num_rows"), T.dynamic("hidden")
    n_tok, n_topk = T.dynamic("n_tok"), T.dynamic("n_topk")

    @T.prim_func
    def main(
        x: T.Tensor((rows, hidden * 2), "float8_e4m3fn"),
        x_sf: T.Tensor((rows, hidden * 2 // npc), "float32"),
        grad_out: T.Tensor((rows, hidden), "bfloat16"),
        weight: T.Tensor((n_tok, n_topk), "float32"),
        pos_to_token_topk: T.Tensor((rows,), "int32"),
        token_topk_to_pos: T.Tensor((n_tok, n_topk), "int32"),
        out: T.Tensor((rows, hidden), "bfloat16"),
        x_grad_fp8: T.Tensor((rows, hidden * 2), "float8_e4m3fn"),
        x_grad_sf: T.Tensor((rows, hidden * 2 // npc), "float32"),
        x_grad: T.Tensor((rows, hidden * 2), "bfloat16"),
        weight_grad: T.Tensor((n_tok, n_topk), "float32"),
        clamp_value: T.float32,
        round_sf: T.int32,
    ):
        with T.Kernel(T.max(rows, n_tok * n_topk), threads=THREADS) as bx:
            T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            tid = T.get_thread_binding()
            xq = T.alloc_local((UNROLL, 8), "float8_e4m3fn")
            yq = T.alloc_local((UNROLL, 8), "float8_e4m3fn")
            go = T.alloc_local((UNROLL, 8), "bfloat16")
            sfs = T.alloc_local((UNROLL, 2), "float32")
            dx = T.alloc_local((8,), "float32")
            dy = T.alloc_local((8,), "float32")
            ov = T.alloc_local((8,), "float32")
            bq = T.alloc_local((8,), "bfloat16")
            q8 = T.alloc_local((8,), "float8_e4m3fn")
            acc = T.alloc_local((1,), "float32")
            red = T.alloc_shared((THREADS // 32,), "float32")
            w = T.alloc_var("float32")
            idx = T.alloc_var("int32")
            if bx < n_tok * n_topk and tid == 0:
                if _flat(token_topk_to_pos, "int32")[bx] < 0:
                    _flat(weight_grad, "float32")[bx] = T.float32(0.0)
            if bx < rows:
                # a position outside weight (negative, or past its end) counts as no weight
                idx = T.if_then_else(pos_to_token_topk[bx] < n_tok * n_topk, pos_to_token_topk[bx], -1)
                w = T.if_then_else(idx >= 0, _flat(weight, "float32")[T.max(idx, 0)], T.float32(0.0))
                acc[0] = T.float32(0.0)
                if no_clamp(clamp_value):  # uniform: the clamp selects would keep every value
                    _row(x, x_sf, grad_out, out, x_grad_fp8, x_grad_sf, x_grad, xq, yq, go, sfs, dx, dy, ov, bq, q8,
                         bx, tid, w, clamp_value, round_sf, acc, npc, False)
                else:
                    _row(x, x_sf, grad_out, out, x_grad_fp8, x_grad_sf, x_grad, xq, yq, go, sfs, dx, dy, ov, bq, q8,
                         bx, tid, w, clamp_value, round_sf, acc, npc, True)
                for r in T.unroll(5):
                    acc[0] += T.shfl_xor(acc[0], 16 >> r)
                if tid % 32 == 0:
                    red[tid // 32] = acc[0]
                T.sync_threads()
                if tid == 0 and idx >= 0:
                    total = T.alloc_var("float32")
                    total = T.float32(0.0)
                    for j in T.unroll(THREADS // 32):
                        total += red[j]
                    _flat(weight_grad, "float32")[idx] = total

    return main


KERNELS = (
    KernelDecl(
        name="quant.swiglu_backward_and_per_token_cast",
        factory=swiglu_backward_and_per_token_cast,
        grid=tuple({"num_per_channels": n} for n in NUM_PER_CHANNELS),
        outputs=("out", "x_grad_fp8", "x_grad_sf", "x_grad", "weight_grad"),
        pass_configs=PASS_CONFIGS,
        doc="SwiGLU backward from e4m3 input: bf16 out, bf16 and per-token e4m3 input gradient, weight gradient.",
    ),
)

__all__ = ["KERNELS", "swiglu_backward_and_per_token_cast"]
