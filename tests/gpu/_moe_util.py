"""Helpers shared by the MoE GPU tests: the op module (checked against the wheel), seeding,
poisoning the caching allocator's free memory, and top-k indices made like tile_kernels' tests."""

from __future__ import annotations

import zlib

import pytest
import torch


def load_moe_ops(require, ops: tuple[str, ...], owner: str):
    """``tilebin.ops.moe``, failing the test when the wheel lacks a kernel or the module an op."""
    for name in ops:
        require(f"moe.{name}")
    from tilebin.ops import moe

    missing = [name for name in ops if not callable(getattr(moe, name, None))]
    if missing:
        pytest.fail(f"tilebin.ops.moe does not export {missing} (re-export them from {owner})")
    return moe


def seed(*key) -> None:
    torch.manual_seed(zlib.crc32(repr(key).encode()))


def poison_cache(nbytes: int) -> None:
    """Fill (at least) ``nbytes`` of the caching allocator's free memory with 0xFF."""
    blob = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device="cuda")
    blob.fill_(0xFF)
    del blob


def topk_idx(tokens: int, topk: int, experts: int, ep_ranks: int) -> torch.Tensor:
    """int64 [rows, topk] like tile_kernels' generate_topk_idx (rows <= tokens * ep_ranks)."""
    if tokens == 0:
        return torch.empty((0, topk), dtype=torch.int64, device="cuda")
    scores = torch.rand((tokens * ep_ranks, experts * ep_ranks), dtype=torch.bfloat16, device="cuda")
    idx = torch.topk(scores, k=topk, dim=-1, sorted=False).indices
    idx[idx >= experts] = -1
    return idx[(idx >= 0).any(dim=1)].contiguous()
