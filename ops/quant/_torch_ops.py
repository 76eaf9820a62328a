"""``tilebin::<op>`` declarations of the ``tilebin.ops.quant`` ops (see ``ops/_torch.py``).

One :class:`TorchOp` per public op: its schema, and where the public signature differs, the
conversions.  A ``fake=`` names the op's checked path that never consults its memo (the memo
lookups of these ops are not behind ``memo_table()``).
"""

from __future__ import annotations

from typing import Any

from .._torch import TorchOp, pair_to_public, pair_to_schema
from ._cast_back import _cast_back_checked, cast_back, per_token_cast_back, unpack_from_e2m1fn_x2
from ._e5m6 import per_token_cast_to_e5m6
from ._per_block import (_per_block, per_block_cast, per_block_cast_lossless, per_block_cast_with_precomputed_sf,
                         per_block_cast_with_sf_only)
from ._per_channel import per_channel_cast, per_channel_cast_and_transpose, per_channel_cast_fused
from ._per_token import _run, per_token_cast, per_token_cast_with_precomputed_sf, per_token_cast_with_sf_only
from ._swiglu import (_forward_checked, swiglu_backward_and_per_token_cast,
                      swiglu_forward_and_per_channel_cast_and_transpose, swiglu_forward_and_per_token_cast)


def _cast_checked(x: Any, fmt: Any, num_per_channels: Any, x_block_size: Any, col: Any, rnd: Any, packed: Any) -> Any:
    """per_token_cast without its memo (the fake implementation)."""
    if fmt == "e5m6":
        return per_token_cast(x, fmt, num_per_channels, x_block_size, col, rnd, packed)
    return _run("per_token_cast", "cast", x, fmt, num_per_channels, x_block_size, col, rnd, packed)


def _bwd_result(result: Any) -> tuple:
    out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad = result
    return out, x_grad_fp8, x_grad_sf, x_grad, weight_grad


_FLAGS = "bool use_tma_aligned_col_major_sf=False, bool round_sf=False, bool use_packed_ue8m0=False"
TORCH_OPS = (
    TorchOp("per_token_cast", f"(Tensor x, Tensor? x_sf, str fmt, int num_per_channels, int[]? x_block_size=None, "
                              f"{_FLAGS}) -> (Tensor, Tensor)",
            per_token_cast, _cast_checked, pair_to_schema, pair_to_public),
    TorchOp("per_token_cast_with_sf_only", f"(Tensor x, str fmt, int num_per_channels, int[]? x_block_size=None, "
                                           f"{_FLAGS}) -> Tensor",
            per_token_cast_with_sf_only),
    TorchOp("per_token_cast_with_precomputed_sf", f"(Tensor x, str fmt, int num_per_channels, Tensor sf, "
                                                  f"int[]? x_block_size=None, {_FLAGS}) -> Tensor",
            per_token_cast_with_precomputed_sf),
    TorchOp("per_block_cast", f"(Tensor x, str fmt, int[] block_size, {_FLAGS}) -> (Tensor, Tensor)", per_block_cast,
            fake=lambda *a: _per_block("per_block_cast", *a)),
    TorchOp("per_block_cast_with_sf_only", f"(Tensor x, str fmt, int[] block_size, {_FLAGS}) -> Tensor",
            per_block_cast_with_sf_only),
    TorchOp("per_block_cast_with_precomputed_sf", f"(Tensor x, str fmt, int[] block_size, Tensor sf, {_FLAGS}) -> Tensor",
            per_block_cast_with_precomputed_sf),
    TorchOp("per_block_cast_lossless", f"(Tensor x, Tensor x_sf, str fmt, int[] x_block_size, int[] out_block_size, "
                                       f"{_FLAGS}) -> (Tensor, Tensor)",
            per_block_cast_lossless, to_schema=pair_to_schema, to_public=pair_to_public),
    TorchOp("per_channel_cast", "(Tensor x, str fmt, int num_per_tokens, bool round_sf=False) -> (Tensor, Tensor)",
            per_channel_cast),
    TorchOp("per_channel_cast_fused", "(Tensor x, Tensor? x_sf, str fmt, int num_per_tokens, bool round_sf=False, "
                                      "int? num_per_channels=None, Tensor? pos_to_token=None) -> (Tensor, Tensor)",
            per_channel_cast_fused, to_schema=pair_to_schema, to_public=pair_to_public),
    TorchOp("per_channel_cast_and_transpose", "(Tensor x, str fmt, int num_per_tokens, bool round_sf=False) -> "
                                              "(Tensor, Tensor)", per_channel_cast_and_transpose),
    TorchOp("swiglu_forward_and_per_token_cast",
            "(Tensor x, str fmt, int num_per_channels, Tensor? pos_to_token_topk=None, Tensor? topk_weights=None, "
            "Tensor? pos_to_expert=None, bool use_tma_aligned_col_major_sf=False, bool round_sf=False, "
            "bool use_packed_ue8m0=False, float? swiglu_clamp_value=None, Tensor(a!)? clamped_count=None, "
            "float? sf_clamp_min=None) -> (Tensor, Tensor)",
            swiglu_forward_and_per_token_cast, lambda *a: _forward_checked(*a, None)),
    TorchOp("swiglu_backward_and_per_token_cast",
            "(Tensor x, Tensor x_sf, Tensor grad_out, Tensor weight, Tensor pos_to_token_topk, Tensor token_topk_to_pos, "
            "int num_per_channels, bool round_sf=False, float? swiglu_clamp_value=None) "
            "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
            swiglu_backward_and_per_token_cast, to_schema=pair_to_schema, to_public=pair_to_public,
            result_to_schema=_bwd_result, result_to_public=lambda r: (r[0], (r[1], r[2]), r[3], r[4])),
    TorchOp("swiglu_forward_and_per_channel_cast_and_transpose",
            "(Tensor x, str fmt, int num_per_tokens, bool round_sf=False, bool without_transpose=False, "
            "float? swiglu_clamp_value=None) -> (Tensor, Tensor)", swiglu_forward_and_per_channel_cast_and_transpose),
    TorchOp("cast_back", "(Tensor x, Tensor x_sf, str fmt, int[] x_block_size, str? x_special_fmt=None) -> Tensor",
            cast_back, lambda *a: _cast_back_checked(*a, None), pair_to_schema, pair_to_public),
    TorchOp("per_token_cast_back", "(Tensor x, Tensor x_sf, str fmt, int num_per_channels, str? x_special_fmt=None) "
                                   "-> Tensor", per_token_cast_back,
            lambda x, fmt, n, special: _cast_back_checked(x, fmt, (1, n), special, None), pair_to_schema,
            pair_to_public),
    TorchOp("unpack_from_e2m1fn_x2", "(Tensor x, ScalarType out_dtype) -> Tensor", unpack_from_e2m1fn_x2),
    TorchOp("per_token_cast_to_e5m6", "(Tensor x, int num_per_channels, bool use_tma_aligned_col_major_sf=False, "
                                      "bool round_sf=False, bool use_packed_ue8m0=False) -> (Tensor, Tensor)",
            per_token_cast_to_e5m6),
)
