"""``expand_to_mhc``: a hidden state copied into ``mhc_mult`` residual streams (tile_kernels 1.0.0
``tile_kernels.modeling.mhc.ops.expand``), differentiable.

Forward: ``hidden`` bf16 ``[..., H]`` -> bf16 ``[..., mhc_mult, H]`` with every stream equal to
``hidden`` (a bit copy), into ``out`` when given.  Backward: the stream sum, in fp32 in stream
order, rounded to bf16 once.  Any leading dims (0 tokens included: nothing is launched), ``H`` a
positive multiple of 8, ``mhc_mult`` from 1 to 1024 (one cubin serves every count and hidden size).
Bad arguments raise :class:`tilebin.runtime.ArgumentError` before any GPU work.
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import check_cuda, check_int, check_tensor, fail, launcher

from . import _rows
from ._rows import BF16, MAX_ELEMENTS, aligned_input, check_contiguous, check_hidden, check_out

_OP = "expand_to_mhc"


def _check(hidden: Any, mhc_mult: Any, out: Any) -> tuple[torch.Tensor, int, tuple]:
    check_tensor(_OP, "hidden", hidden, BF16)
    if hidden.dim() < 1:
        raise fail(_OP, "hidden must be [..., hidden_size], got a 0-D tensor; pass hidden.reshape(1, -1)")
    mhc = check_int(_OP, "mhc_mult", mhc_mult, 1, 1024)
    check_hidden(_OP, "hidden", hidden)
    check_contiguous(_OP, "hidden", hidden)
    shape = (*hidden.shape[:-1], mhc, hidden.shape[-1])
    if hidden.numel() * mhc > MAX_ELEMENTS:
        raise fail(_OP, f"the output would have {hidden.numel() * mhc} elements, more than 2**31 - 1; "
                        "split the tokens into chunks")
    if out is not None:
        check_out(_OP, out, shape, torch.bfloat16, hidden.device, {"hidden": hidden})
    check_cuda(_OP, hidden=hidden, out=out)
    return aligned_input(hidden), mhc, shape


def _plain(hidden: Any, mhc_mult: Any) -> bool:
    """True when :func:`_check` and the device check would accept the arguments (``out`` None)
    and ``hidden`` needs no copy; else False (the checked path)."""
    if not (isinstance(hidden, torch.Tensor) and hidden.dtype is torch.bfloat16 and hidden.dim() >= 1
            and type(mhc_mult) is int and 1 <= mhc_mult <= 1024):
        return False
    h = hidden.shape[-1]
    return (h > 0 and not h % 8 and hidden.numel() * mhc_mult <= MAX_ELEMENTS and _rows.plain(hidden))


class ExpandToMHCFn(torch.autograd.Function):
    """``apply(hidden, mhc_mult, out)``: see :func:`expand_to_mhc`."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None) -> torch.Tensor:
        if out is None and _plain(hidden, mhc_mult):  # the common case, one cheaper predicate
            x, mhc, shape = hidden, mhc_mult, (*hidden.shape[:-1], mhc_mult, hidden.shape[-1])
        else:
            x, mhc, shape = _check(hidden, mhc_mult, out)
        if out is None:
            out = torch.empty(shape, dtype=torch.bfloat16, device=hidden.device)
        else:
            ctx.mark_dirty(out)
        h = shape[-1]
        if x.numel():
            launcher("mhc.expand_fwd")(x.view(-1, h), out.view(-1, mhc, h))
        return out

    @staticmethod
    def backward(ctx: Any, out_grad: torch.Tensor) -> tuple:
        *lead, mhc, h = out_grad.shape
        g = aligned_input(out_grad.contiguous())  # autograd may hand an expanded or offset view
        grad = torch.empty((*lead, h), dtype=torch.bfloat16, device=g.device)
        if g.numel():
            launcher("mhc.expand_bwd")(g.view(-1, mhc, h), grad.view(-1, h))
        return grad, None, None


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``hidden`` ``[..., H]`` (bf16, contiguous) as ``mhc_mult`` equal streams ``[..., mhc_mult, H]``."""
    return ExpandToMHCFn.apply(hidden, mhc_mult, out)


__all__ = ["ExpandToMHCFn", "expand_to_mhc"]
