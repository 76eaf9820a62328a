"""References for the per-channel casts (``per_channel_cast``, ``per_channel_cast_fused`` with its
``pos_to_token`` gather, ``per_channel_cast_and_transpose``), built on :func:`quant_ref.cast.cast`.

Semantics of ``tile_kernels.torch.per_channel_cast_fused`` 1.0.0 and of tile_kernels' tests of the
other two, extended as tilebin's ops are: any token count (a last partial block of tokens takes
its amax over the tokens present, which :func:`cast` already does) and, with ``pos_to_token``, a
position outside ``[0, num_tokens)`` gives a row of zeros (tile_kernels: negative positions only;
larger ones are out-of-bounds reads there, so no tile_kernels caller passes them).
"""

from typing import Optional, Union

import torch

from .cast import QuantPair, cast

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def gather_rows(x: Union[torch.Tensor, QuantPair], pos_to_token: torch.Tensor) -> Union[torch.Tensor, QuantPair]:
    """Rows ``pos_to_token[r]`` of ``x`` (and of its sf for a pair), zeros (+0.0) where the position
    is outside ``[0, num_tokens)``; dtypes kept (e4m3 data stays e4m3, sf stays fp32)."""
    data = x[0] if isinstance(x, tuple) else x
    num_tokens = data.shape[0]
    pos = pos_to_token.to(torch.int64)
    valid = (pos >= 0) & (pos < num_tokens)
    index = torch.where(valid, pos, torch.zeros_like(pos))

    def take(t: torch.Tensor) -> torch.Tensor:
        # through an integer view of the same width: bit-exact for any dtype (e4m3 included, which
        # not every torch build can index), and all-zero bits are +0.0 in bf16, fp32 and e4m3
        if num_tokens == 0:  # nothing to gather: every position is out of range
            return torch.zeros((pos.shape[0], t.shape[1]), dtype=t.dtype, device=t.device)
        bits = t.view(_INT_OF_SIZE[t.element_size()])[index]
        return torch.where(valid.unsqueeze(1), bits, torch.zeros_like(bits)).view(t.dtype)

    if isinstance(x, tuple):
        return take(x[0]), take(x[1])
    return take(x)


def per_channel_cast_fused(
    x: Union[torch.Tensor, QuantPair],
    num_per_tokens: int,
    num_per_channels: Optional[int],
    round_sf: bool,
    pos_to_token: Optional[torch.Tensor],
) -> QuantPair:
    """``(out e4m3 [num_tokens_out, hidden], out_sf fp32 [ceil(num_tokens_out / num_per_tokens),
    hidden])``: the optional gather, then (for a ``(data, sf)`` pair) dequantization with
    ``(1, num_per_channels)`` input blocks, then ``cast(..., "e4m3", (num_per_tokens, 1))``.
    Same argument order as ``tile_kernels.torch.per_channel_cast_fused``."""
    quantized = isinstance(x, tuple)
    if pos_to_token is not None:
        x = gather_rows(x, pos_to_token)
    x_block_size = (1, num_per_channels) if quantized else None
    return cast(x, "e4m3", block_size=(num_per_tokens, 1), x_block_size=x_block_size, round_sf=round_sf)


def per_channel_cast(x: torch.Tensor, num_per_tokens: int, round_sf: bool) -> QuantPair:
    """``cast(x, "e4m3", (num_per_tokens, 1), round_sf=round_sf)``: the spec of ``per_channel_cast``."""
    return cast(x, "e4m3", block_size=(num_per_tokens, 1), round_sf=round_sf)


def per_channel_cast_and_transpose(x: torch.Tensor, num_per_tokens: int, round_sf: bool) -> QuantPair:
    """``(out.T.contiguous(), out_sf)`` of :func:`per_channel_cast`: e4m3 ``[hidden, num_tokens]``
    and fp32 ``[ceil(num_tokens / num_per_tokens), hidden]``."""
    out, out_sf = cast(x, "e4m3", block_size=(num_per_tokens, 1), round_sf=round_sf)
    return out.T.contiguous(), out_sf


__all__ = ["gather_rows", "per_channel_cast", "per_channel_cast_and_transpose", "per_channel_cast_fused"]
