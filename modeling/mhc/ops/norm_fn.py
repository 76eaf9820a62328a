"""``mhc_pre_norm_fn``: RMSNorm of the flattened mHC residual fused with the projection ``fn``
(tile_kernels 1.0.0 ``tile_kernels.modeling.mhc.ops.norm_fn``), differentiable.

``out[..., j] = (sum_k x[k] * fn_eff[j, k]) * rsqrt(mean_k(x[k]**2) + eps)`` with ``x`` the
residual ``[..., M, H]`` flattened to ``K = M * H`` values (bf16, widened to fp32), ``fn_eff =
tf32(fn * norm_weight)`` (or ``tf32(fn)``) and ``out`` fp32 ``[..., M * (M + 2)]``.  The GEMM runs
on TF32 tensor cores (exact products, fp32 accumulation); the norm factor is applied after it.

``n_splits`` is the most split-K partitions of K the forward uses: it takes
``min(n_splits, K / 128, ceil(256 / ceil(tokens / 128)))`` (enough blocks to fill the GPU; one
split once the tokens alone do), so the rounding of a token's sums depends on its call's token
count and K only (never on timing); tile_kernels 1.0.0 always uses one split.

Backward: the gradients of the residual (bf16), of ``fn`` and of ``norm_weight`` (fp32; the
TF32 rounding counts as the identity).  ``fuse_grad_acc`` (default True, as tile_kernels):
when the residual's storage carries ``grad_from_mhc_post`` (the residual gradient ``mhc_post``'s
backward leaves there), the residual gradient is added into that tensor in place, the attribute
is removed and None is returned for the residual; otherwise (or with ``fuse_grad_acc=False``)
a fresh gradient is returned.  With a norm weight, the ``main_grad`` convention holds for
``fn`` and ``norm_weight``: a ``main_grad`` attribute (contiguous fp32 of the parameter's
shape) receives the gradient in place and None is returned for that parameter.

OpSpec ops: ``tilebin::mhc_pre_norm_fn`` (which also returns the TF32 ``fn`` and the backward's
saved sums) and ``tilebin::mhc_pre_norm_fn_bwd`` (which writes or adds into its gradient buffers).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.compiler import is_compiling

from tilebin.ops._common import aligned_input, check_tensor, fail, launcher
from tilebin.ops._spec import FlagParam, IntParam, OpSpec, TensorParam

from ._rows import FP32, STASH, Rows, Streams, float_param, ordered, schema_args, shapes, torch_ops

_OP = "mhc_pre_norm_fn"
MULTS = (4, 2, 8)  # mhc_mult values with prebuilt kernels
KB = 128  # K granularity of the split-K GEMM (kernels/mhc/norm_fn.py: KB)
TB = 128  # tokens per block of the forward GEMM (kernels/mhc/norm_fn.py: TB)
TARGET_BLOCKS = 256  # split K (tokens) until the forward (backward) GEMM has about this many blocks
TB_BWD = 64  # tokens per step of the backward GEMM (kernels/mhc/norm_fn.py: TB_BWD)


def num_splits(num_tokens: int, mhc_hidden: int, n_splits: int) -> int:
    """The split-K count the forward uses (see the module docstring)."""
    token_blocks = max(1, -(-num_tokens // TB))
    want = max(1, -(-TARGET_BLOCKS // token_blocks))
    return max(1, min(n_splits, mhc_hidden // KB, want))


def num_token_splits(num_tokens: int, mhc_hidden: int) -> int:
    """The token-split count of the backward GEMM: ``min(ceil(tokens / 64), ceil(256 / (K / 128)))``
    (at least 1); its partial ``d fn`` are summed in split order."""
    token_blocks = -(-num_tokens // TB_BWD)
    want = -(-TARGET_BLOCKS // max(1, mhc_hidden // KB))
    return max(1, min(token_blocks, want))


def check_residual(op: str, residual: Any) -> tuple[int, int, tuple[int, ...]]:
    """bf16 ``[..., M, H]`` (its dtype checked by its parameter) contiguous with M in MULTS, H a positive
    multiple of 64: (M, H, outer)."""
    if residual.dim() < 2:
        raise fail(op, f"residual must be [..., mhc_mult, hidden], got shape {tuple(residual.shape)}")
    *outer, mult, hidden = residual.shape
    if mult not in MULTS:
        raise fail(op, f"residual has mhc_mult={mult} (shape {tuple(residual.shape)}); supported: "
                       f"{', '.join(map(str, MULTS))}")
    if hidden <= 0 or hidden % 64:
        raise fail(op, f"residual has hidden={hidden}; supported: a positive multiple of 64 (e.g. 4096, 7168)")
    if not residual.is_contiguous():
        raise fail(op, f"residual must be contiguous (strides {tuple(residual.stride())}); call .contiguous()")
    if residual.numel() >= 2**31:
        raise fail(op, f"residual has {residual.numel()} elements; supported: < 2**31 (split the tokens)")
    return mult, hidden, tuple(outer)


def check_fn(op: str, fn: Any, mult: int, hidden: int) -> None:
    n, k = mult * (mult + 2), mult * hidden
    if tuple(fn.shape) != (n, k):
        raise fail(op, f"fn has shape {tuple(fn.shape)}; want [mhc_mult * (mhc_mult + 2), mhc_mult * hidden] = "
                       f"{[n, k]} for residual's mhc_mult={mult}, hidden={hidden}")
    if not fn.is_contiguous():
        raise fail(op, f"fn must be contiguous (strides {tuple(fn.stride())}); call .contiguous()")


def _check(op: str, residual: torch.Tensor, fn: torch.Tensor, norm_weight: Any, *_: Any) -> None:
    """Every check of the forward but the dtypes, the scalars and the device, in today's order."""
    mult, hidden, _ = check_residual(op, residual)
    check_fn(op, fn, mult, hidden)
    if norm_weight is None:
        return
    if norm_weight.shape[0] != mult * hidden:
        raise fail(op, f"mhc_norm_weight has shape {tuple(norm_weight.shape)}; want [mhc_mult * hidden] = "
                       f"[{mult * hidden}]")
    if not norm_weight.is_contiguous():
        raise fail(op, "mhc_norm_weight must be contiguous; call .contiguous()")


def _plain(residual: torch.Tensor, fn: Any = None, norm_weight: Any = None, *_: Any) -> bool:
    """What the memo key leaves out holds: contiguity, and the residual's size."""
    return (residual.is_contiguous() and residual.numel() < 2**31 and (fn is None or fn.is_contiguous())
            and (norm_weight is None or norm_weight.is_contiguous()))


def _main_grad_of(param: torch.Tensor, name: str) -> torch.Tensor | None:
    grad = getattr(param, "main_grad", None)
    if grad is None:
        return None
    check_tensor(_OP, f"{name}.main_grad", grad, (torch.float32,), param.dim())
    if tuple(grad.shape) != tuple(param.shape) or not grad.is_contiguous() or grad.device != param.device:
        raise fail(_OP, f"{name}.main_grad is {tuple(grad.shape)} (strides {tuple(grad.stride())}) on {grad.device}; "
                        f"supported: a contiguous float32 tensor of shape {tuple(param.shape)} on {param.device}")
    return grad


def prep_fn(fn: torch.Tensor, norm_weight: torch.Tensor | None) -> torch.Tensor:
    """``tf32(fn * norm_weight)`` (or ``tf32(fn)``): the fn the GEMM kernels read."""
    n, k = fn.shape
    fn_eff = torch.empty(n, k, dtype=torch.float32, device=fn.device)
    w = norm_weight if norm_weight is not None else fn.new_empty((0,))
    launcher("mhc.norm_fn_prep")(fn, w, fn_eff, 1 if norm_weight is not None else 0)
    return fn_eff


def forward_partials(x: torch.Tensor, fn_eff: torch.Tensor, mult: int, n_splits: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K partials ``part_mul [S, T, N]``, ``part_sq [S, T]`` of x ``[T, K]`` (T > 0)."""
    t, k = x.shape
    n = fn_eff.shape[0]
    s = num_splits(t, k, n_splits)
    part_mul = torch.empty(s, t, n, dtype=torch.float32, device=x.device)
    part_sq = torch.empty(s, t, dtype=torch.float32, device=x.device)
    launcher("mhc.norm_fn_fwd_mul", mhc_mult=mult)(x, fn_eff, part_mul, part_sq)
    return part_mul, part_sq


def _plan_fwd(values: dict):
    mult, hidden = values["residual"].shape[-2:]
    eps, splits, k, n = values["mhc_norm_eps"], values["n_splits"], mult * hidden, values["fn"].shape[0]

    def run(residual, fn, norm_weight, *_):
        x, dev = aligned_input(residual.view(-1, k)), residual.device
        t = x.shape[0]
        fn_eff = prep_fn(aligned_input(fn), aligned_input(norm_weight))
        out, out_mul = (torch.empty(t, n, dtype=torch.float32, device=dev) for _ in range(2))
        sqrsum = torch.empty(t, dtype=torch.float32, device=dev)
        if t:
            part_mul, part_sq = forward_partials(x, fn_eff, mult, splits)
            launcher("mhc.norm_fn_fwd_norm", mhc_mult=mult)(part_mul, part_sq, out, out_mul, sqrsum, k, eps)
        return out.view(*residual.shape[:-2], n), fn_eff, out_mul, sqrsum

    return run


def _plan_bwd(values: dict):
    mult, hidden = values["residual"].shape[-2:]
    eps, k, n = values["eps"], mult * hidden, values["fn"].shape[0]

    def run(out_grad, residual, fn, fn_eff, norm_weight, out_mul, sqrsum, _, x_grad, accumulate, fn_grad, w_grad,
            grad_acc) -> None:
        x, dev = aligned_input(residual.view(-1, k)), residual.device
        t = x.shape[0]
        part = torch.empty(num_token_splits(t, k), n, k, dtype=torch.float32, device=dev)
        g_mul = torch.empty(t, n, dtype=torch.float32, device=dev)
        g_sq = torch.empty(t, dtype=torch.float32, device=dev)
        # the read-only inputs as the kernels read them: contiguous, 16-byte aligned (copied if not); the
        # written ones (x_grad, fn_grad, w_grad) are checked aligned by their parameters
        fn, fn_eff, norm_weight = aligned_input(fn), aligned_input(fn_eff), aligned_input(norm_weight)
        if t:
            launcher("mhc.norm_fn_bwd_norm", mhc_mult=mult)(aligned_input(out_grad.reshape(t, n).contiguous()),
                                                            aligned_input(out_mul), aligned_input(sqrsum), g_mul, g_sq,
                                                            k, eps)
        launcher("mhc.norm_fn_bwd_mul", mhc_mult=mult)(g_mul, g_sq, x, fn_eff, x_grad.view(t, k), part,
                                                       1 if accumulate else 0)
        if norm_weight is None:
            empty = fn_grad.new_empty((0,))
            launcher("mhc.norm_fn_grad_reduce")(part, fn, empty, fn_grad, empty, 0, 0)
        else:
            launcher("mhc.norm_fn_grad_reduce")(part, fn, norm_weight, fn_grad, w_grad, 1, 1 if grad_acc else 0)

    return run


def _bwd_shapes(out_grad, residual, fn, fn_eff, norm_weight, out_mul, sqrsum, eps, x_grad, accumulate, fn_grad,
                w_grad, grad_acc) -> tuple:
    t, n = residual.numel() // (residual.shape[-1] * residual.shape[-2]), fn.shape[0]
    if (norm_weight is None) != (w_grad is None):
        raise fail(_OP + "_bwd", f"w_grad is {'None' if w_grad is None else 'a tensor'} but mhc_norm_weight is "
                                 f"{'None' if norm_weight is None else 'a tensor'}; pass w_grad exactly when the "
                                 "forward had a norm weight")
    return (("out_grad", out_grad, (*residual.shape[:-2], n)), ("out_mul", out_mul, (t, n)), ("sqrsum", sqrsum, (t,)),
            ("x_grad", x_grad, residual.shape), ("fn_eff", fn_eff, fn.shape), ("fn_grad", fn_grad, fn.shape),
            ("w_grad", w_grad, (fn.shape[1],)))


def _param(name: str, ndim: int, rows: bool = False, optional: bool = False, mutated: bool = False) -> TensorParam:
    """An fp32 parameter (contiguous, as the kernels read it; of a fixed shape unless ``rows``)."""
    return TensorParam(name, FP32, ndim, True, optional=optional, mutated=mutated, rows_vary=rows,
                       ptr_align=16 if mutated else 0)


NORM_FN = OpSpec(_OP, (Streams("residual", (torch.bfloat16,)), TensorParam("fn", FP32, 2, rows_vary=False),
                       TensorParam("mhc_norm_weight", FP32, 1, optional=True, rows_vary=False),
                       float_param("mhc_norm_eps"), FlagParam("fuse_grad_acc", "True"),
                       IntParam("n_splits", 1, default="16")),
                 "(Tensor, Tensor, Tensor, Tensor)", _plan_fwd, **ordered(_check, _plain))
_BWD_PARAMS = (Rows("out_grad", FP32), Streams("residual", (torch.bfloat16,), contiguous=True), _param("fn", 2),
               _param("fn_eff", 2), _param("mhc_norm_weight", 1, optional=True), _param("out_mul", 2, True),
               _param("sqrsum", 1, True), float_param("eps"),
               Streams("x_grad", (torch.bfloat16,), contiguous=True, mutated=True, ptr_align=16),
               FlagParam("accumulate"),
               _param("fn_grad", 2, mutated=True), _param("w_grad", 1, optional=True, mutated=True),
               FlagParam("grad_acc"))
NORM_FN_BWD = OpSpec(_OP + "_bwd", _BWD_PARAMS, "()", _plan_bwd, schema_args=schema_args(_BWD_PARAMS),
                     **shapes(_bwd_shapes, lambda op, g, residual, fn, fn_eff, w, *_: _check(op, residual, fn, w)))


def _stash(residual: torch.Tensor) -> torch.Tensor | None:
    """The residual gradient mhc_post's backward left on the residual's storage, if any (eager only)."""
    storage = residual.untyped_storage()
    if is_compiling() or not hasattr(storage, STASH):
        return None
    stash = getattr(storage, STASH)
    if (not isinstance(stash, torch.Tensor) or stash.dtype != torch.bfloat16 or stash.numel() != residual.numel()
            or not stash.is_contiguous() or stash.device != residual.device):
        raise fail(_OP, "the residual's grad_from_mhc_post must be a contiguous bfloat16 tensor of the "
                        f"residual's shape {tuple(residual.shape)} on {residual.device}")
    return stash


class MHCPreNormFn(torch.autograd.Function):
    """``apply(residual, fn, norm_eps, fuse_grad_acc, n_splits[, norm_weight])`` -> fp32 ``[..., N]``."""

    @staticmethod
    def forward(ctx: Any, residual: torch.Tensor, fn: torch.Tensor, norm_eps: float, fuse_grad_acc: bool,
                n_splits: int, norm_weight: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(norm_weight, torch.Tensor) and isinstance(fn, torch.Tensor):  # main_grad misuse fails early
            _main_grad_of(fn, "mhc_fn")
            _main_grad_of(norm_weight, "mhc_norm_weight")
        out, fn_eff, out_mul, sqrsum = NORM_FN(residual, fn, norm_weight, norm_eps, fuse_grad_acc, n_splits)
        ctx.save_for_backward(residual, fn, fn_eff, norm_weight, out_mul, sqrsum)
        ctx.scalars = (norm_eps, fuse_grad_acc)
        return out

    @staticmethod
    def backward(ctx: Any, out_grad: torch.Tensor) -> tuple:
        residual, fn, fn_eff, norm_weight, out_mul, sqrsum = ctx.saved_tensors
        eps, fuse = ctx.scalars
        stash = _stash(residual) if fuse else None
        x_grad = stash.view(residual.shape) if stash is not None else torch.empty_like(residual)
        main_fn = main_w = None
        if norm_weight is not None:
            main_fn, main_w = _main_grad_of(fn, "mhc_fn"), _main_grad_of(norm_weight, "mhc_norm_weight")
        acc = main_fn is not None or main_w is not None
        new = torch.zeros if acc else torch.empty
        fn_grad = main_fn if main_fn is not None else new(fn.shape, dtype=torch.float32, device=fn.device)
        w_grad = None if norm_weight is None else (
            main_w if main_w is not None else new(norm_weight.shape, dtype=torch.float32, device=fn.device))
        NORM_FN_BWD(out_grad.float(), residual, fn, fn_eff, norm_weight, out_mul, sqrsum, eps, x_grad,
                    stash is not None, fn_grad, w_grad, acc)
        if stash is not None:
            delattr(residual.untyped_storage(), STASH)
        return (None if stash is not None else x_grad, None if main_fn is not None else fn_grad, None, None, None,
                None if main_w is not None else w_grad)


def mhc_pre_norm_fn(
    residual: torch.Tensor,
    mhc_fn: torch.Tensor,
    mhc_norm_weight: torch.Tensor | None,
    mhc_norm_eps: float,
    fuse_grad_acc: bool = True,
    n_splits: int = 16,
) -> torch.Tensor:
    """The mixes ``[..., M * (M + 2)]`` (fp32) of an mHC residual ``[..., M, H]`` (bf16); see the module."""
    return MHCPreNormFn.apply(residual, mhc_fn, mhc_norm_eps, fuse_grad_acc, n_splits, mhc_norm_weight)


SPECS = (NORM_FN, NORM_FN_BWD)
TORCH_OPS = torch_ops(*SPECS)

__all__ = ["MHCPreNormFn", "mhc_pre_norm_fn"]
