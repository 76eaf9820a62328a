"""``expand_to_mhc``: a hidden state copied into ``mhc_mult`` residual streams (tile_kernels 1.0.0
``tile_kernels.modeling.mhc.ops.expand``), differentiable.

Forward: ``hidden`` bf16 ``[..., H]`` -> bf16 ``[..., mhc_mult, H]`` with every stream equal to
``hidden`` (a bit copy), into ``out`` when given.  Backward: the stream sum, in fp32 in stream
order, rounded to bf16 once.  Any leading dims (0 tokens included: nothing is launched), ``H`` a
positive multiple of 8, ``mhc_mult`` from 1 to 1024 (one cubin serves every count and hidden size).
Bad arguments raise :class:`tilebin.runtime.ArgumentError` before any GPU work.  Both directions
are OpSpec ops (``tilebin::expand_to_mhc``, ``tilebin::expand_to_mhc_out``, ``tilebin::expand_to_mhc_bwd``).
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import aligned_input, fail, launcher
from tilebin.ops._spec import IntParam, OpSpec

from ._rows import (BF16, MAX_ELEMENTS, OUT, Rows, Streams, apply, check_contiguous, check_hidden, check_out,
                    ordered, out_spec, torch_ops)


def _check(op: str, hidden: torch.Tensor, mhc: int, out: Any) -> None:
    if hidden.dim() < 1:
        raise fail(op, "hidden must be [..., hidden_size], got a 0-D tensor; pass hidden.reshape(1, -1)")
    check_hidden(op, "hidden", hidden)
    check_contiguous(op, "hidden", hidden)
    if hidden.numel() * mhc > MAX_ELEMENTS:
        raise fail(op, f"the output would have {hidden.numel() * mhc} elements, more than 2**31 - 1; "
                       "split the tokens into chunks")
    if out is not None:
        check_out(op, out, (*hidden.shape[:-1], mhc, hidden.shape[-1]), torch.bfloat16, hidden.device,
                  {"hidden": hidden})


def _plain(hidden: torch.Tensor, mhc: int, out: Any) -> bool:
    return hidden.is_contiguous() and hidden.numel() * mhc <= MAX_ELEMENTS


def _plan(values: dict):
    mhc, fn = values["mhc_mult"], launcher("mhc.expand_fwd")

    def run(hidden: torch.Tensor, _: Any, out: Any) -> torch.Tensor:
        *lead, h = hidden.shape
        if out is None:
            out = torch.empty(*lead, mhc, h, dtype=torch.bfloat16, device=hidden.device)
        if hidden.numel():
            fn(aligned_input(hidden).view(-1, h), out.view(-1, mhc, h))
        return out

    return run


def _plan_bwd(values: dict):
    fn = launcher("mhc.expand_bwd")

    def run(out_grad: torch.Tensor) -> torch.Tensor:
        *lead, mhc, h = out_grad.shape
        grad = torch.empty(*lead, h, dtype=torch.bfloat16, device=out_grad.device)
        if out_grad.numel():  # autograd may hand an expanded or offset view
            fn(aligned_input(out_grad.contiguous()).view(-1, mhc, h), grad.view(-1, h))
        return grad

    return run


def _check_bwd(op: str, values: dict) -> None:
    if values["out_grad"].dim() < 2:
        raise fail(op, f"out_grad must be [..., mhc_mult, hidden], got shape {tuple(values['out_grad'].shape)}")


EXPAND = out_spec("expand_to_mhc", (Rows("hidden", BF16), IntParam("mhc_mult", 1, 1024), OUT), "Tensor", _plan,
                  **ordered(_check, _plain))
EXPAND_BWD = OpSpec("expand_to_mhc_bwd", (Streams("out_grad", BF16),), "Tensor", _plan_bwd, relations=_check_bwd)


class ExpandToMHCFn(torch.autograd.Function):
    """``apply(hidden, mhc_mult, out)``: see :func:`expand_to_mhc`."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None) -> torch.Tensor:
        if out is not None:
            ctx.mark_dirty(out)
        return EXPAND(hidden, mhc_mult, out)

    @staticmethod
    def backward(ctx: Any, out_grad: torch.Tensor) -> tuple:
        return EXPAND_BWD(out_grad), None, None


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``hidden`` ``[..., H]`` (bf16, contiguous) as ``mhc_mult`` equal streams ``[..., mhc_mult, H]``."""
    return apply(ExpandToMHCFn, EXPAND, hidden, mhc_mult, out)


SPECS = (EXPAND, EXPAND_BWD)
TORCH_OPS = torch_ops(*SPECS)

__all__ = ["ExpandToMHCFn", "expand_to_mhc"]
