"""Torch reference of ``engram_hash`` (semantics of ``tile_kernels.engram`` 1.0.0).

For n-gram layer ``l``, token ``t`` and n-gram order ``j = 1 .. n-1`` the running hash is the XOR
of ``int64(id[t, i]) * multipliers[l, i]`` for ``i = 0 .. j`` (int64 products wrap modulo
2**64); each of the layer's ``tables`` tables of that order maps it to
``floormod(hash, vocab_sizes[l, j-1, e])`` (the remainder takes the divisor's sign, as torch's
``%``), cast to int32, plus the table's int32 offset (wrapping).  Columns are ordered by n-gram
order, then table.  ``make_offsets`` gives each layer's exclusive prefix sums of its sizes (the
tables of a layer packed into one embedding).
"""

from __future__ import annotations

import torch


def make_offsets(vocab_sizes: torch.Tensor) -> torch.Tensor:
    """int32 ``[layers, (n-1) * tables]``: per layer, the exclusive running sum of its sizes."""
    flat = vocab_sizes.reshape(vocab_sizes.shape[0], -1).to(torch.int64)
    return (torch.cumsum(flat, dim=1) - flat).to(torch.int32)


def engram_hash(ngram_token_ids: torch.Tensor, multipliers: torch.Tensor, vocab_sizes: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:
    """int32 ``[layers, num_tokens, (n-1) * tables]`` (see the module docstring)."""
    ids = ngram_token_ids.to(torch.int64)
    layers, n = multipliers.shape
    cols = []
    running = torch.zeros((layers, ids.shape[0]), dtype=torch.int64, device=ids.device)
    for i in range(n):
        running = running ^ (ids[:, i].unsqueeze(0) * multipliers[:, i].unsqueeze(1))
        if i == 0:
            continue
        sizes = vocab_sizes[:, i - 1, :].to(torch.int64)           # [layers, tables]
        cols.append(torch.remainder(running.unsqueeze(-1), sizes.unsqueeze(1)).to(torch.int32))
    out = torch.cat(cols, dim=-1) if cols else torch.empty((layers, ids.shape[0], 0), dtype=torch.int32,
                                                             device=ids.device)
    return out + offsets.unsqueeze(1)


def engram_hash_python(ngram_token_ids, multipliers, vocab_sizes, offsets) -> list:
    """The same with Python integers (slow; for small CPU cross-checks of :func:`engram_hash`)."""
    def wrap(v: int, bits: int) -> int:
        v &= (1 << bits) - 1
        return v - (1 << bits) if v >> (bits - 1) else v

    ids, mul, sizes, offs = (a.tolist() for a in (ngram_token_ids, multipliers, vocab_sizes, offsets))
    layers, n, tables = len(mul), len(mul[0]), len(sizes[0][0]) if sizes and sizes[0] else 0
    out = []
    for lyr in range(layers):
        rows = []
        for row in ids:
            h, vals = 0, []
            for i in range(n):
                h ^= wrap(row[i] * mul[lyr][i], 64)
                if i:
                    for e in range(tables):
                        rem = wrap(h % sizes[lyr][i - 1][e], 32)
                        vals.append(wrap(rem + offs[lyr][(i - 1) * tables + e], 32))
            rows.append(vals)
        out.append(rows)
    return out
