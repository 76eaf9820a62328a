"""``engram_hash`` and ``fused_weight`` (``tile_kernels.engram`` 1.0.0 API).

Both validate every argument before touching the GPU (device last) and raise
:class:`tilebin.runtime.ArgumentError` naming the op, the argument, what is supported and the
fix.  Outputs are fresh contiguous tensors on the inputs' device; launches go on torch's current
stream, asynchronously.  Every extent is a run-time value (one cubin per op).
"""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from .._common import TRACING, check_cuda, fail, launcher
from .._torch import TorchOp, traced
from ._checks import BF16, check_contiguous, check_hidden

_INT32 = (torch.int32,)
_INT64 = (torch.int64,)


def engram_hash(ngram_token_ids: torch.Tensor, multipliers: torch.Tensor, vocab_sizes: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:
    """Embedding-table indices of each token's n-grams, per n-gram layer.

    ngram_token_ids: int32 ``[num_tokens, n]`` (``n >= 2``: the token and its predecessors);
    multipliers: int64 ``[layers, n]``; vocab_sizes: int32 ``[layers, n - 1, tables]`` (positive);
    offsets: int32 ``[layers, (n - 1) * tables]``; all contiguous.  Returns int32 ``[layers,
    num_tokens, (n - 1) * tables]``: column ``(j - 1) * tables + e`` holds
    ``floormod(h_j, vocab_sizes[l, j - 1, e]) + offsets[l, col]`` with ``h_j`` the XOR of
    ``int64(id[t, i]) * multipliers[l, i]`` over ``i <= j`` (int64 wrap-around, int32 result
    wrapping like torch's).  Bit-exact with the torch reference; any n, layer and table count.
    """
    if is_compiling() and not TRACING.on:
        return traced("engram_hash", ngram_token_ids, multipliers, vocab_sizes, offsets)
    op = "engram_hash"
    check_contiguous(op, "ngram_token_ids", ngram_token_ids, _INT32, ndim=2)
    num_tokens, n = ngram_token_ids.shape
    if n < 2:
        raise fail(op, f"ngram_token_ids has {n} column(s); supported: n >= 2 (a token and its predecessors)")
    check_contiguous(op, "multipliers", multipliers, _INT64, ndim=2)
    layers = multipliers.shape[0]
    if multipliers.shape[1] != n or layers < 1:
        raise fail(op, f"multipliers has shape {tuple(multipliers.shape)}, want (num_ngram_layers >= 1, {n}) "
                       f"(one multiplier per n-gram position of ngram_token_ids)")
    check_contiguous(op, "vocab_sizes", vocab_sizes, _INT32, ndim=3)
    tables = vocab_sizes.shape[2]
    if vocab_sizes.shape[:2] != (layers, n - 1) or tables < 1:
        raise fail(op, f"vocab_sizes has shape {tuple(vocab_sizes.shape)}, want ({layers}, {n - 1}, "
                       "num_embed_table_per_ngram >= 1)")
    cols = (n - 1) * tables
    check_contiguous(op, "offsets", offsets, _INT32, shape=(layers, cols))
    if layers * num_tokens * cols > 2**31 - 1:
        raise fail(op, f"the output would have {layers} x {num_tokens} x {cols} entries, more than 2**31 - 1; "
                       "split the tokens")
    check_cuda(op, ngram_token_ids=ngram_token_ids, multipliers=multipliers, vocab_sizes=vocab_sizes,
               offsets=offsets)
    output = torch.empty((layers, num_tokens, cols), dtype=torch.int32, device=ngram_token_ids.device)
    if num_tokens:
        launcher("engram.engram_hash")(ngram_token_ids, multipliers, vocab_sizes, offsets, output)
    return output


def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """``weight_hidden.float() * weight_embed.float()`` as a new fp32 ``[hc_mult, hidden]`` tensor.

    Both bf16 ``[hc_mult, hidden]``, contiguous, hidden a multiple of 8 (any size; tile_kernels
    needs a multiple of 256).  Exact (bf16 products are exact in fp32).
    """
    if is_compiling() and not TRACING.on:
        return traced("fused_weight", weight_hidden, weight_embed)
    op = "fused_weight"
    check_contiguous(op, "weight_hidden", weight_hidden, BF16, ndim=2)
    hc, hidden = weight_hidden.shape
    check_contiguous(op, "weight_embed", weight_embed, BF16, shape=(hc, hidden))
    check_hidden(op, "weight_hidden", hidden, None)
    check_cuda(op, weight_hidden=weight_hidden, weight_embed=weight_embed)
    out = torch.empty((hc, hidden), dtype=torch.float32, device=weight_hidden.device)
    if hc:
        launcher("engram.fused_weight")(weight_hidden, weight_embed, out)
    return out


TORCH_OPS = (
    TorchOp("engram_hash", "(Tensor ngram_token_ids, Tensor multipliers, Tensor vocab_sizes, Tensor offsets) -> Tensor",
            engram_hash),
    TorchOp("fused_weight", "(Tensor weight_hidden, Tensor weight_embed) -> Tensor", fused_weight),
)


__all__ = ["engram_hash", "fused_weight"]
