"""``mhc_multilayer_recompute``: rebuild the layer inputs and residuals of consecutive mHC layers from
the first residual, for activation recomputation (``tile_kernels.modeling.mhc.ops.multilayer_recompute``
1.0.0 API; not differentiable, writes its outputs in place and returns None).

With ``L = len(pre_mix_list)`` layers and ``P = len(layer_output_list)`` (``L - 1`` or ``L``)
completed ones, starting from ``r = initial_residual`` (bf16 ``[..., M, hidden]``), for each
``i < P``::

    layer_input_list[i] = bf16(sum_j pre_mix_list[i][..., j] * r[..., j, :])
    residual_list[i]    = bf16(post_mix_list[i][..., o] * layer_output_list[i]
                               + sum_j comb_mix_list[i][..., j, o] * r[..., j, :])   for every o
    r = residual_list[i]

and, when ``P == L - 1``, ``layer_input_list[L - 1]`` from ``pre_mix_list[L - 1]`` and the last
``r``.  fp32 arithmetic, each product and sum rounded on its own, j ascending (kernel
``mhc.multilayer_recompute``).  Tensors (all contiguous, 16-byte aligned, on one GPU; any
leading dims as long as the element counts match ``tokens = initial_residual.numel() / (M *
hidden)``): pre/post mixes fp32 with ``tokens * M`` elements (``[..., M, 1]`` as
``mhc_pre_split_mixes`` returns them, or ``[..., M]``), comb mixes fp32 ``tokens * M * M``,
layer outputs and inputs bf16 ``tokens * hidden``, residuals bf16 ``tokens * M * hidden``.
``M`` in 2, 4, 8; ``hidden`` a multiple of 8.  The written tensors may not overlap each other or
any input.  Bad arguments raise :class:`tilebin.runtime.ArgumentError` before any GPU work.

The per-layer tensors reach the kernel as a table of data pointers, copied to the GPU from pinned
host memory on the current stream (as tile_kernels does); under CUDA-graph capture that copy is
captured with its host buffer, so capture this op only with tensors that outlive the graph.

An OpSpec op, ``tilebin::mhc_multilayer_recompute`` (it mutates ``layer_input_list`` and
``residual_list``); every call runs every check (its lists are never memoized).
"""

from __future__ import annotations

from typing import Any

import torch

from tilebin.ops._common import TRACING, check_cuda, check_tensor, fail, launcher, ptr
from tilebin.ops._spec import OpSpec, Param, TensorParam

from ._rows import schema_args, torch_ops

_OP = "mhc_multilayer_recompute"
_KERNEL = "mhc.multilayer_recompute"
MULTS = (2, 4, 8)
_INT32_MAX = 2**31 - 1
_BF16, _FP32 = (torch.bfloat16,), (torch.float32,)


def _list_param(name: str, written: bool = False) -> Param:
    """A list of tensors; its memo-key part raises: such a call takes the checked path every time."""
    def check(op: str, items: Any) -> list:
        if not isinstance(items, (list, tuple)):
            raise fail(op, f"{name} must be a list of tensors, got {type(items).__name__}")
        return list(items)

    return Param(name, "Tensor(a!)[]" if written else "Tensor[]", check, key_of=_never)


def _never(value: Any) -> Any:
    raise TypeError


def _check_member(name: str, t: Any, dtypes: tuple, numel: int, shape_note: str) -> None:
    check_tensor(_OP, name, t, dtypes)
    if t.numel() != numel:
        raise fail(_OP, f"{name} has shape {tuple(t.shape)} ({t.numel()} elements); supported: {numel} elements "
                        f"({shape_note})")
    if not t.is_contiguous():
        raise fail(_OP, f"{name} is not contiguous (strides {tuple(t.stride())}); pass {name}.contiguous()")
    if numel and ptr(t) % 16:
        raise fail(_OP, f"{name}'s data pointer {ptr(t):#x} is not 16-byte aligned (vector access); "
                        f"pass {name}.clone()")


def _check_disjoint(spans: list[tuple[int, int, str, bool]]) -> None:
    """No written span overlaps any other span (read spans may share memory)."""
    end_any, end_written = (0, ""), (0, "")
    for start, end, name, written in sorted(s for s in spans if s[1] > s[0]):
        other = end_any if written else end_written
        if start < other[0]:
            raise fail(_OP, f"{name} overlaps {other[1]} in memory; the outputs (layer_input_list, residual_list) "
                            f"must not share memory with each other or with any input")
        if end > end_any[0]:
            end_any = (end, name)
        if written and end > end_written[0]:
            end_written = (end, name)


def _check(op: str, initial_residual: torch.Tensor, *lists: list) -> None:
    """Every check but initial_residual's dtype and the lists' types, in today's order; the devices last."""
    shape = tuple(initial_residual.shape)
    if len(shape) < 2 or shape[-2] not in MULTS or shape[-1] < 8 or shape[-1] % 8:
        raise fail(_OP, f"initial_residual has shape {shape}; supported: [..., M, hidden] with M (mhc_mult) in "
                        f"{', '.join(map(str, MULTS))} and hidden a positive multiple of 8")
    m, hidden = shape[-2:]
    if initial_residual.numel() > _INT32_MAX:
        raise fail(_OP, f"initial_residual has {initial_residual.numel()} elements; supported: at most "
                        f"{_INT32_MAX} (split the tokens)")
    n = initial_residual.numel() // (m * hidden)
    _check_member("initial_residual", initial_residual, _BF16, n * m * hidden, "[..., M, hidden]")
    lists = dict(zip(_LISTS, lists))
    layers, post = len(lists["pre_mix_list"]), len(lists["layer_output_list"])
    if layers < 1:
        raise fail(_OP, "pre_mix_list is empty; supported: at least one layer")
    if len(lists["layer_input_list"]) != layers:
        raise fail(_OP, f"layer_input_list has {len(lists['layer_input_list'])} tensors but pre_mix_list has "
                        f"{layers}; pass one layer input per pre mix")
    for name in ("post_mix_list", "comb_mix_list", "residual_list"):
        if len(lists[name]) != post:
            raise fail(_OP, f"{name} has {len(lists[name])} tensors but layer_output_list has {post}; "
                            f"pass one per completed layer")
    if post not in (layers - 1, layers):
        raise fail(_OP, f"layer_output_list has {post} tensors for {layers} layers; supported: {layers - 1} or "
                        f"{layers} (num_layers - 1 or num_layers)")
    spec = {"pre_mix_list": (_FP32, n * m, "[..., M] fp32", False),
            "layer_output_list": (_BF16, n * hidden, "[..., hidden] bf16", False),
            "post_mix_list": (_FP32, n * m, "[..., M] fp32", False),
            "comb_mix_list": (_FP32, n * m * m, "[..., M, M] fp32", False),
            "layer_input_list": (_BF16, n * hidden, "[..., hidden] bf16", True),
            "residual_list": (_BF16, n * m * hidden, "[..., M, hidden] bf16", True)}
    spans = [(ptr(initial_residual), ptr(initial_residual) + 2 * initial_residual.numel(),
              "initial_residual", False)]
    tensors = {"initial_residual": initial_residual}
    for name, items in lists.items():
        dtypes, numel, note, written = spec[name]
        for i, t in enumerate(items):
            _check_member(f"{name}[{i}]", t, dtypes, numel, note)
            spans.append((ptr(t), ptr(t) + t.element_size() * t.numel(), f"{name}[{i}]", written))
            tensors[f"{name}[{i}]"] = t
    if not TRACING.on:  # fake tensors have no memory to overlap
        _check_disjoint(spans)
    check_cuda(_OP, **tensors)


_LISTS = ("pre_mix_list", "layer_output_list", "post_mix_list", "comb_mix_list", "layer_input_list", "residual_list")
_ROWS = ("pre_mix_list", "layer_input_list", "layer_output_list", "post_mix_list", "comb_mix_list", "residual_list")


def _plan(values: dict):
    m, hidden = values["initial_residual"].shape[-2:]

    def run(initial_residual: torch.Tensor, *lists: list) -> None:
        n = initial_residual.numel() // (m * hidden)
        if not n or TRACING.on:
            return
        by_name = dict(zip(_LISTS, lists))
        layers, post = len(by_name["pre_mix_list"]), len(by_name["layer_output_list"])
        table = []
        for name in _ROWS:
            table += [t.data_ptr() for t in by_name[name]] + [0] * (layers - len(by_name[name]))
        dev = initial_residual.device
        host = torch.tensor(table, dtype=torch.int64, pin_memory=dev.type == "cuda")
        ptrs = host.to(dev, non_blocking=True).view(6, layers)
        launcher(_KERNEL, mhc_mult=m)(initial_residual.view(n, m, hidden), ptrs, post)

    return run


_PARAMS = (TensorParam("initial_residual", _BF16), *(_list_param(n, n in _LISTS[4:]) for n in _LISTS))
RECOMPUTE = OpSpec(_OP, _PARAMS, "()", _plan, relations=lambda op, values: _check(op, *values.values()),
                   schema_args=schema_args(_PARAMS))


def mhc_multilayer_recompute(initial_residual: torch.Tensor, pre_mix_list: list[torch.Tensor],
                             layer_output_list: list[torch.Tensor], post_mix_list: list[torch.Tensor],
                             comb_mix_list: list[torch.Tensor], layer_input_list: list[torch.Tensor],
                             residual_list: list[torch.Tensor]) -> None:
    """Write ``layer_input_list`` and ``residual_list`` in place: see the module docstring."""
    return RECOMPUTE(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list,
                     layer_input_list, residual_list)


SPECS = (RECOMPUTE,)
TORCH_OPS = torch_ops(*SPECS)

__all__ = ["MULTS", "mhc_multilayer_recompute"]
