"""Constants and TileLang helpers of ``engram.engram_gate_bwd`` (``engram_gate_bwd.py``): the
thread layout and staging constants, the fp32 cast, the exact bf16 -> fp32 widening of either half
of a 32-bit word, and the (zero-fill) cp.async into shared memory.  Declares no kernels."""

# No ``from __future__ import annotations``: TileLang evaluates the kernels' annotations.
import tilelang.language as T

from .engram_gate_fwd import PASS_CONFIGS, THREADS, U, V

HALF = THREADS // 2  # threads per segment (as in the forward)
SEG = HALF * U  # vectors per segment
HEADS_IN_FLIGHT = 4  # grad_v: grad_out vectors of this many heads loaded before the token's wait
PASS_CONFIGS_BWD = dict(PASS_CONFIGS, **{"tl.disable_thread_storage_sync": True})  # private shared slots
W = V // 2  # 32-bit words (bf16 pairs) per 16-byte vector
GO, VV, XX, KK = 0, 1, 2, 3  # the staged streams
NS = 4 + HEADS_IN_FLIGHT  # per-half staged fp32 scalars: dot, gate, rstd_x, rstd_k of the row, then gate[t, q]


def f32(x):
    """``x`` cast to fp32."""
    return T.Cast("float32", x)


def bf16_lo(w):
    """The bf16 in the low half of a 32-bit word, as fp32 (exact)."""
    return T.reinterpret(w << T.uint32(16), "float32")


def bf16_hi(w):
    """The bf16 in the high half of a 32-bit word, as fp32 (exact)."""
    return T.reinterpret(w & T.uint32(0xFFFF0000), "float32")


def cp_async(dst, src, n, pred=None):
    """One cp.async of ``n`` elements (16 bytes of 32-bit words, or one fp32) into shared memory;
    with ``pred``, the zero-fill form (``pred`` false: nothing is read, the slot gets zeros), so
    the copies of all slots are straight-line code on one address plus immediates."""
    return T.ptx_cp_async(T.access_ptr(dst, "w", n), T.access_ptr(src, "r", n), n, pred)


__all__ = ["GO", "HALF", "HEADS_IN_FLIGHT", "KK", "NS", "PASS_CONFIGS_BWD", "SEG", "VV", "W", "XX", "bf16_hi",
           "bf16_lo", "cp_async", "f32"]
