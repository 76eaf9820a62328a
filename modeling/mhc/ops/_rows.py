"""What the mHC ops share: argument checks, OpSpec parameters of token-major tensors, the ``out=``
convention and the ``grad_from_mhc_post`` stash.

Each raises :class:`tilebin.runtime.ArgumentError` through ``ops._common.fail``: the op, the
argument, the value received, what is supported and the fix.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.compiler import is_compiling

from tilebin.ops._common import SOLE_GPU, TRACING, aligned_input, check_float32, check_tensor, fail, ptr
from tilebin.ops._spec import OpSpec, Param, TensorParam
from tilebin.ops._torch import TorchOp, traced

BF16 = (torch.bfloat16,)
FP32 = (torch.float32,)
MHC_VALUES = (2, 4, 8)  # the compiled stream counts (mhc 4 is the model's)
HIDDEN_ALIGN = 8  # 16-byte vectors of bf16
MAX_ELEMENTS = 2**31 - 1  # the kernels index in int32
STASH = "grad_from_mhc_post"  # storage attribute: the residual gradient mhc_post's backward leaves


def check_mhc(op: str, name: str, mhc: int, supported: tuple = MHC_VALUES) -> int:
    """``mhc`` (a stream count read from a shape or passed as an int) is one of ``supported``."""
    if isinstance(mhc, bool) or not isinstance(mhc, int) or mhc not in supported:
        raise fail(op, f"{name}={mhc!r} is not supported; supported: mhc_mult in {supported} "
                       "(4 is the model's; other counts need a new kernel variant)")
    return mhc


def check_hidden(op: str, name: str, t: torch.Tensor) -> int:
    """The last dim of ``t`` is a positive multiple of 8 (16-byte vectors of bf16)."""
    hidden = t.shape[-1]
    if hidden <= 0 or hidden % HIDDEN_ALIGN:
        raise fail(op, f"{name} has shape {tuple(t.shape)}; its last dim (hidden={hidden}) must be a positive "
                       f"multiple of {HIDDEN_ALIGN} (1280, 2560, 4096, 7168 and every multiple of 64 up to 8192 "
                       "are tested)")
    return hidden


def check_size(op: str, name: str, t: torch.Tensor) -> None:
    """At most 2**31 - 1 elements (int32 indexing)."""
    if t.numel() > MAX_ELEMENTS:
        raise fail(op, f"{name} has {t.numel()} elements, more than 2**31 - 1; split the tokens into chunks")


def check_shape(op: str, name: str, t: torch.Tensor, shape: tuple, why: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise fail(op, f"{name} has shape {tuple(t.shape)}, want {tuple(shape)} ({why})")


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    """A bf16 stream input the kernels read in 16-byte vectors must be contiguous (a view that
    starts at a misaligned address is fine: :func:`aligned_input` copies it after the checks)."""
    if not t.is_contiguous():
        raise fail(op, f"{name} must be contiguous (shape {tuple(t.shape)}, strides {tuple(t.stride())}); "
                       f"call {name}.contiguous()")


def small_input(t: torch.Tensor) -> torch.Tensor:
    """A small fp32 mix tensor as the kernels read it: contiguous and 16-byte aligned (copied if
    not: a few bytes per token)."""
    return aligned_input(t.contiguous())


def check_out(op: str, out: Any, shape: tuple, dtype: torch.dtype, device: torch.device,
              inputs: dict) -> None:
    """A preallocated output: a contiguous tensor of ``shape`` and ``dtype`` on ``device``,
    16-byte aligned, overlapping no input."""
    check_tensor(op, "out", out, (dtype,), len(shape))
    check_shape(op, "out", out, shape, "the shape the op returns")
    if not out.is_contiguous():
        raise fail(op, f"out must be contiguous (strides {tuple(out.stride())}); pass a fresh torch.empty of shape "
                       f"{tuple(shape)}")
    if out.numel() and ptr(out) % 16:
        raise fail(op, f"out's data pointer {ptr(out):#x} is not 16-byte aligned; pass a fresh torch.empty")
    if out.device != device:
        raise fail(op, f"out is on {out.device} but the inputs are on {device}; allocate it on {device}")
    if out.numel() and not TRACING.on:  # fake tensors have no memory to overlap
        lo, hi = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        for name, t in inputs.items():
            if t is not None and t.numel() and t.device == out.device:
                a = t.data_ptr()
                if a < hi and lo < a + t.numel() * t.element_size():
                    raise fail(op, f"out overlaps {name} in memory; the op is not in place: pass a separate tensor")


class Rows(TensorParam):
    """A ``[..., H]`` tensor: its memo key holds dtype, device, rank and the last ``TAIL`` dims (the
    leading dims are token dims: they may vary between calls of one configuration, and the op's
    ``per_call`` checks they agree between tensors)."""

    TAIL = 1

    def key(self, t: Any) -> Any:
        s = t.shape  # (the last sizes by index: slicing a shape costs ~0.1 µs)
        tail = s[-1] if self.TAIL == 1 else (s[-2], s[-1])  # IndexError for fewer dims: the checked path
        return t.dtype, t.is_cuda if SOLE_GPU.on else t.device, len(s), tail


class Streams(Rows):
    """A ``[..., M, H]`` (or ``[..., M, M]``) tensor (see :class:`Rows`)."""

    TAIL = 2


def _out_key(out: Any) -> None:
    """A call with ``out`` takes the checked path every time (its pointer and overlap are per call)."""
    if out is not None:
        raise TypeError


# an op's optional output: judged by its relations (check_out); not in the schema of tilebin::<op>, whose
# tilebin::<op>_out twin mutates it and returns nothing (custom-op outputs may not alias an input)
OUT = Param("out", "Tensor(a!)?", key_of=_out_key, default="None")


def float_param(name: str, default: str | None = None) -> Param:
    """A float parameter checked by :func:`check_float32` (the float32 the kernel's scalar holds)."""
    return Param(name, "float", lambda op, value: check_float32(op, name, value), default=default)


def ordered(check: Callable[..., Any], plain: Callable[..., bool]) -> dict:
    """``relations`` and ``per_call`` of an op whose ordered checks are ``check(op, *args)``: every
    configuration's first call runs them, a later call only where ``plain(*args)`` (a cheap test
    of what the memo key leaves out: token dims that agree, contiguity, size) is False, so a bad
    call raises the same message memoized or not."""
    def per_call(op: str, args: tuple) -> None:
        if not plain(*args):
            check(op, *args)

    return dict(relations=lambda op, values: check(op, *values.values()), per_call=per_call)


def shapes(expected: Callable[..., tuple], check: Callable[..., Any]) -> dict:
    """``relations`` and ``per_call`` of a backward op: ``check(op, *args)`` (the forward's checks of
    its inputs) once per configuration, and on every call each ``(name, tensor, shape)`` of
    ``expected(*args)`` (what autograd's calls always satisfy: the forward's shapes)."""
    def per_call(op: str, args: tuple) -> None:
        try:
            pairs = expected(*args)
        except (IndexError, ZeroDivisionError) as exc:  # a malformed input: the forward's checks say which
            check(op, *args)
            raise fail(op, f"the gradients' shapes do not follow from these inputs ({exc}); pass the forward's "
                           "inputs and gradients of its outputs' shapes") from exc
        for name, t, shape in pairs:
            if t is not None and t.shape != tuple(shape):
                raise fail(op, f"{name} has shape {tuple(t.shape)}, want {tuple(shape)} (the forward's)")

    def relations(op: str, values: dict) -> None:
        check(op, *values.values())
        per_call(op, tuple(values.values()))

    return dict(relations=relations, per_call=per_call)


def schema_args(params: tuple, skip: tuple = ()) -> str:
    """The schema's argument list of ``params`` (but ``skip``), each mutated tensor with its own alias
    set (``(a!)``, ``(b!)``...): what ``OpSpec.schema`` writes, less its one shared ``(a!)``."""
    parts, sets = [], iter("abcdefgh")
    for p in params:
        if p.name not in skip:
            kind = p.schema_type.replace("(a!)", f"({next(sets)}!)") if "(a!)" in p.schema_type else p.schema_type
            parts.append(f"{kind} {p.name}" + ("" if p.default is None else f"={p.default}"))
    return ", ".join(parts)


def out_spec(name: str, params: tuple, *args: Any, **kwargs: Any) -> OpSpec:
    """An OpSpec whose last parameter is :data:`OUT`, left out of its ``tilebin::<name>`` schema."""
    return OpSpec(name, params, *args, schema_args=schema_args(params, ("out",)),
                  torch=dict(to_schema=lambda *a: a[:-1], to_public=lambda *a: (*a, None)), **kwargs)


def torch_ops(*specs: OpSpec) -> tuple:
    """The ``tilebin::<name>`` declarations of ``specs`` (each its own public function), with
    ``tilebin::<name>_out`` for an :func:`out_spec`."""
    ops = []
    for spec in specs:
        ops.append(spec.torch_op(spec))
        if spec.params[-1] is OUT:
            ops.append(TorchOp(spec.name + "_out", f"({schema_args(spec.params, ('out',))}, Tensor(a!) out) -> ()",
                               spec, spec.fake, result_to_schema=lambda result: None))
    return tuple(ops)


def call_out(spec: OpSpec, *args: Any) -> Any:
    """``spec(*args)`` (``out`` last); under torch.compile with ``out`` given, ``tilebin::<name>_out``."""
    out = args[-1]
    if out is not None and is_compiling() and not TRACING.on:
        traced(spec.name + "_out", *args)
        return out
    return spec(*args)


def apply(function: Any, spec: OpSpec, *args: Any) -> Any:
    """``function.apply(*args)`` (an autograd Function whose forward calls ``spec``, ``out`` last); with
    ``out`` under torch.compile, ``tilebin::<name>_out`` directly: dynamo cannot trace ``mark_dirty``,
    so there ``out=`` is not differentiable."""
    if args[-1] is not None and is_compiling():
        return call_out(spec, *args)
    return function.apply(*args)


def stash_of(x: torch.Tensor) -> torch.Tensor | None:
    """The residual gradient mhc_post's backward left on ``x``'s storage (``grad_from_mhc_post``)
    when ``x``'s gradient can be added into it in place (a contiguous bf16 tensor of ``x``'s size
    on its device, left for this very view), else None.  Never while compiling: a traced graph
    cannot see the storage attribute, so there every gradient is returned (the same sum, formed
    by autograd)."""
    if is_compiling():
        return None
    stash = getattr(x.untyped_storage(), STASH, None)
    if (isinstance(stash, torch.Tensor) and stash.dtype == torch.bfloat16 and stash.is_contiguous()
            and stash.numel() == x.numel() and stash.device == x.device
            and getattr(stash, "_mhc_residual_ptr", x.data_ptr()) == x.data_ptr()):
        return stash
    return None


__all__ = ["BF16", "FP32", "MAX_ELEMENTS", "MHC_VALUES", "OUT", "STASH", "Rows", "Streams", "aligned_input", "apply",
           "call_out", "check_contiguous", "check_hidden", "check_mhc", "check_out", "check_shape", "check_size",
           "float_param", "ordered", "out_spec", "schema_args", "shapes", "small_input", "stash_of", "torch_ops"]
