"""``engram.engram_hash``: n-gram hashes of token ids into embedding-table rows.

Parameters, in order: ``ngram_token_ids`` int32 ``[num_tokens, n]``, ``multipliers`` int64
``[layers, n]``, ``vocab_sizes`` int32 ``[layers, n - 1, tables]``, ``offsets`` int32
``[layers, (n - 1) * tables]``, ``output`` int32 ``[layers, num_tokens, (n - 1) * tables]``; all
contiguous, every extent a runtime symbol (the op checks that they agree).  For layer ``l``,
token ``t`` and column ``c = (j - 1) * tables + e`` (``1 <= j < n``)::

    hash = (id[t, 0] * mul[l, 0]) ^ (id[t, 1] * mul[l, 1]) ^ ... ^ (id[t, j] * mul[l, j])
    output[l, t, c] = int32(floormod(hash, vocab_sizes[l, j - 1, e]) + offsets[l, c])

in int64 (products wrap modulo 2**64, ``floormod`` takes the sign of the divisor, as torch's
``%``; the sum is truncated to its low 32 bits, as torch's int32 addition wraps).  Bit-exact
with the torch reference.  A vocab size of 0 gives an unspecified value (no trap).

Design: one thread per (layer, token, n-gram order, chunk of ``E`` tables), in output order
(``layers * num_tokens * cols < 2**31``, checked by the op): it computes the n-gram's hash once
and its ``E`` independent modulos (ILP), and writes ``E`` consecutive int32 (a warp stores a
contiguous run); index math is 32-bit.  At 2 layers x 8001 tokens x 2 orders x 8 tables that is
64 K threads, one wave (a 64-bit modulo is a long dependent sequence: ``E`` trades threads in flight
against the chain per thread).
"""

# No ``from __future__ import annotations``: TileLang evaluates the PrimFunc's tensor
# annotations, which name closure variables of the factory.
import tilelang.language as T

from .._declare import KernelDecl

THREADS = 128
E = 4  # tables per thread: 4 modulos per thread, ~15 warps per SM in one wave at 2 x 8001 x 16


def engram_hash():
    """Build the PrimFunc (no compile-time parameters)."""
    num_tokens, n = T.dynamic("num_tokens"), T.dynamic("max_ngram_size")
    layers, ngrams, tables = T.dynamic("num_ngram_layers"), T.dynamic("num_ngrams"), T.dynamic("num_tables")
    cols = T.dynamic("num_cols")

    nch = T.ceildiv(tables, E)  # chunks of E tables per n-gram order

    @T.prim_func
    def main(
        ngram_token_ids: T.Tensor((num_tokens, n), "int32"),
        multipliers: T.Tensor((layers, n), "int64"),
        vocab_sizes: T.Tensor((layers, ngrams, tables), "int32"),
        offsets: T.Tensor((layers, cols), "int32"),
        output: T.Tensor((layers, num_tokens, cols), "int32"),
    ):
        with T.Kernel(T.ceildiv(layers * num_tokens * ngrams * nch, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            acc = T.alloc_var("int64")
            flat = T.alloc_var("int32")  # ((lyr * num_tokens + tok) * ngrams + j) * nch + chunk
            e0 = T.alloc_var("int32")
            j = T.alloc_var("int32")  # n-gram order - 2
            row = T.alloc_var("int32")  # lyr * num_tokens + tok
            lyr = T.alloc_var("int32")
            tok = T.alloc_var("int32")
            flat = bx * THREADS + tid
            if flat < layers * num_tokens * ngrams * nch:
                e0 = T.truncmod(flat, nch) * E
                row = T.truncdiv(flat, nch)
                j = T.truncmod(row, ngrams)
                row = T.truncdiv(row, ngrams)
                lyr = T.truncdiv(row, num_tokens)  # 32-bit index math: the 64-bit divisions are the hash's
                tok = row - lyr * num_tokens
                acc = T.int64(0)
                for i in T.serial(j + 2):
                    acc = T.bitwise_xor(acc, T.Cast("int64", ngram_token_ids[tok, i]) * multipliers[lyr, i])
                for e in T.unroll(E):  # independent modulos: instruction-level parallelism
                    if e0 + e < tables:
                        output[lyr, tok, j * tables + e0 + e] = T.Cast("int32", T.floormod(
                            acc, T.Cast("int64", vocab_sizes[lyr, j, e0 + e])) + T.Cast("int64", offsets[lyr, j * tables + e0 + e]))

    return main


KERNELS = (
    KernelDecl(
        name="engram.engram_hash",
        factory=engram_hash,
        grid=({},),
        outputs=("output",),
        align=4,  # no vector accesses
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="output[l, t, (j-1)*E+e] = floormod(xor_{i<=j} id[t,i]*mul[l,i], vocab[l,j-1,e]) + offsets[l, (j-1)*E+e].",
    ),
)

__all__ = ["KERNELS", "THREADS", "engram_hash"]
