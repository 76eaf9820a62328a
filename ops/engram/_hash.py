"""``engram_hash`` and ``fused_weight`` (``tile_kernels.engram`` 1.0.0 API), each declared by an
:class:`~tilebin.ops._spec.OpSpec`.

Both validate every argument before touching the GPU (device last) and raise
:class:`tilebin.runtime.ArgumentError` naming the op, the argument, what is supported and the
fix.  Outputs are fresh contiguous tensors on the inputs' device; launches go on torch's current
stream, asynchronously.  Every extent is a run-time value (one cubin per op).

Checks: each tensor's dtype and rank (its parameter), then today's checks in today's order
(``_hash_checks`` / ``_fused_checks``: shapes, contiguity, size, alignment) once per
configuration; the facts the memo key leaves out (strides, data pointers, the token count) are
tested on every call by a cheap test (``engram_hash``: at the top of its ``run``; ``fused_weight``:
its ``per_call``) that, where one fails, runs those ordered
checks, so a bad call gets the same message whether or not its configuration is memoized.
"""

from __future__ import annotations

from typing import Callable

import torch

from .._common import TRACING, fail, launcher
from .._spec import OpSpec, TensorParam
from ._checks import BF16, MAX_ELEMENTS, check_contiguous, check_hidden

_INT32 = (torch.int32,)
_INT64 = (torch.int64,)


def _hash_checks(op: str, ngram_token_ids, multipliers, vocab_sizes, offsets) -> None:
    """Every check of :func:`engram_hash` but the device, in today's order (the first failure raises)."""
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


def _hash_relations(op: str, values: dict) -> None:
    _hash_checks(op, values["ngram_token_ids"], values["multipliers"], values["vocab_sizes"], values["offsets"])


def _plan_hash(values: dict) -> Callable[..., torch.Tensor]:
    layers, cols = values["multipliers"].shape[0], values["offsets"].shape[1]
    device = values["ngram_token_ids"].device  # every tensor's device is part of the configuration
    fn = launcher("engram.engram_hash")
    most_tokens = MAX_ELEMENTS // max(1, layers * cols)  # the output's element limit, as a token count

    def run(ngram_token_ids: torch.Tensor, multipliers: torch.Tensor, vocab_sizes: torch.Tensor,
            offsets: torch.Tensor) -> torch.Tensor:
        # per call (here, not a spec per_call: relations run every check on a first call): what the
        # key leaves out, contiguity, alignment and the token count's limits, in one test; where it
        # fails, the ordered checks raise today's first error (or pass: the test is stricter)
        num_tokens = ngram_token_ids.shape[0]
        if not (ngram_token_ids.is_contiguous() and multipliers.is_contiguous() and vocab_sizes.is_contiguous()
                and offsets.is_contiguous()
                and (TRACING.on or not (ngram_token_ids.data_ptr() | multipliers.data_ptr() | vocab_sizes.data_ptr()
                                        | offsets.data_ptr()) % 16)
                and ngram_token_ids.numel() <= MAX_ELEMENTS and num_tokens <= most_tokens):
            _hash_checks("engram_hash", ngram_token_ids, multipliers, vocab_sizes, offsets)
        output = torch.empty(layers, num_tokens, cols, dtype=torch.int32, device=device)
        if num_tokens:
            fn(ngram_token_ids, multipliers, vocab_sizes, offsets, output)
        return output

    return run


ENGRAM_HASH = OpSpec(
    "engram_hash",
    (TensorParam("ngram_token_ids", _INT32, 2), TensorParam("multipliers", _INT64, 2, rows_vary=False),
     TensorParam("vocab_sizes", _INT32, 3, rows_vary=False), TensorParam("offsets", _INT32, 2, rows_vary=False)),
    "Tensor", _plan_hash, relations=_hash_relations)


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
    return ENGRAM_HASH.call(ngram_token_ids, multipliers, vocab_sizes, offsets)


def _fused_checks(op: str, weight_hidden, weight_embed) -> None:
    """Every check of :func:`fused_weight` but the device, in today's order."""
    check_contiguous(op, "weight_hidden", weight_hidden, BF16, ndim=2)
    hc, hidden = weight_hidden.shape
    check_contiguous(op, "weight_embed", weight_embed, BF16, shape=(hc, hidden))
    check_hidden(op, "weight_hidden", hidden, None)


def _fused_relations(op: str, values: dict) -> None:
    _fused_checks(op, values["weight_hidden"], values["weight_embed"])


def _fused_per_call(op: str, args: tuple) -> None:
    """What the key leaves out: contiguity and alignment."""
    weight_hidden, weight_embed = args
    if not (weight_hidden.is_contiguous() and weight_embed.is_contiguous()
            and (TRACING.on or not (weight_hidden.data_ptr() | weight_embed.data_ptr()) % 16)):  # aligned(), inline
        _fused_checks(op, weight_hidden, weight_embed)


def _plan_fused(values: dict) -> Callable[..., torch.Tensor]:
    shape = tuple(values["weight_hidden"].shape)  # [hc, hidden]: part of the configuration
    device = values["weight_hidden"].device
    fn = launcher("engram.fused_weight") if shape[0] else None

    def run(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
        out = torch.empty(*shape, dtype=torch.float32, device=device)
        if fn is not None:
            fn(weight_hidden, weight_embed, out)
        return out

    return run


FUSED_WEIGHT = OpSpec(
    "fused_weight",
    (TensorParam("weight_hidden", BF16, 2, rows_vary=False), TensorParam("weight_embed", BF16, 2, rows_vary=False)),
    "Tensor", _plan_fused, relations=_fused_relations, per_call=_fused_per_call)


def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """``weight_hidden.float() * weight_embed.float()`` as a new fp32 ``[hc_mult, hidden]`` tensor.

    Both bf16 ``[hc_mult, hidden]``, contiguous, hidden a multiple of 8 (any size; tile_kernels
    needs a multiple of 256).  Exact (bf16 products are exact in fp32).
    """
    return FUSED_WEIGHT.call(weight_hidden, weight_embed)


SPECS = (ENGRAM_HASH, FUSED_WEIGHT)
TORCH_OPS = tuple(spec.torch_op(fn) for spec, fn in ((ENGRAM_HASH, engram_hash), (FUSED_WEIGHT, fused_weight)))


__all__ = ["engram_hash", "fused_weight"]
