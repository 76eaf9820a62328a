"""Read every launch fact out of a lowered TileLang program into manifest specs.

Sources (TileLang 0.1.x): the original PrimFunc (parameters, buffers, dynamic symbols),
the device functions' attributes (thread_extent, dyn_shared_memory_buf,
use_cooperative_groups, has_cuda_pdl_sync, cluster_dims) and the host function
(tma_descriptor_args, l2_persistent_map, and the order and arguments of its
``tvm_call_packed`` kernel calls).  What cannot be expressed raises AotError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilelang import tvm
from tvm import tirx

from tilebin.runtime._manifest import ArgSpec, ConditionSpec, LaunchSpec, ParamSpec, ScalarSpec, TensorSpec, TmaSpec

from ._errors import AotError
from ._conditions import assumed_conditions, declared_condition
from ._tir_expr import host_lets, to_tree

_INT32_MAX = 2**31 - 1
# TileLang spells some dtypes differently from torch; the manifest uses torch's names.
_DTYPE_NAMES = {"float8_e4m3": "float8_e4m3fn"}
_KNOWN_HOST_CALLS = {"__tvm_set_device", "__tvm_tensormap_create_tiled"}
# item sizes (bytes) of the dtypes a tensor parameter may also take (KernelDecl.also_dtypes), by torch's name
_ITEM_SIZES = {**dict.fromkeys(("bool", "int8", "uint8", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"), 1),
               **dict.fromkeys(("int16", "uint16", "float16", "bfloat16"), 2),
               **dict.fromkeys(("int32", "uint32", "float32"), 4), **dict.fromkeys(("int64", "uint64", "float64"), 8)}


@dataclass(frozen=True)
class LaunchFacts:
    params: tuple[ParamSpec, ...]
    tensors: tuple[TensorSpec, ...]
    scalars: tuple[ScalarSpec, ...]
    tma: tuple[TmaSpec, ...]
    launches: tuple[LaunchSpec, ...]
    conditions: tuple[ConditionSpec, ...] = ()


def dtype_name(dtype: Any) -> str:
    name = str(dtype)
    return _DTYPE_NAMES.get(name, name)


def _contiguous_strides(shape: list[Any]) -> list[Any]:
    strides: list[Any] = [1]
    for dim in reversed(shape[1:]):
        prev = strides[0]
        strides.insert(0, dim if prev == 1 else (prev if dim == 1 else ["mul", dim, prev]))
    return strides


def _tensor_spec(buf: tirx.Buffer, where: str, outputs: tuple[str, ...], align: int) -> TensorSpec:
    shape = [to_tree(d, where) for d in buf.shape]
    strides = [to_tree(s, where) for s in buf.strides] if len(buf.strides) else _contiguous_strides(shape)
    return TensorSpec(name=buf.name, dtype=dtype_name(buf.dtype), shape=tuple(shape), strides=tuple(strides),
                      align=align, output=buf.name in outputs, max_elements=_INT32_MAX)


def signature(func: tirx.PrimFunc, where: str, outputs: tuple[str, ...], align: int):
    """Params in order, tensor specs, scalar specs, and data-var name -> tensor name."""
    params, tensors, scalars, data_names = [], [], [], {}
    for var in func.params:
        if var in func.buffer_map:
            buf = func.buffer_map[var]
            tensors.append(_tensor_spec(buf, where, outputs, align))
            params.append(ParamSpec(buf.name, "tensor", len(buf.shape)))
            data_names[buf.data.name] = buf.name
        else:
            scalars.append(ScalarSpec(var.name, dtype_name(var.dtype)))
            params.append(ParamSpec(var.name, "scalar"))
    unknown = set(outputs) - {t.name for t in tensors}
    if unknown:
        raise AotError(f"{where}: outputs {sorted(unknown)} are not tensor parameters of the kernel")
    return tuple(params), tuple(tensors), tuple(scalars), data_names


def _tma_spec(args: list[Any], data_names: dict[str, str], where: str, lets: dict) -> TmaSpec:
    kind = str(args[0].value) if hasattr(args[0], "value") else str(args[0])
    if kind != "__tvm_tensormap_create_tiled":
        raise AotError(f"{where}: TMA descriptor kind {kind!r} is not supported (only tiled descriptors)")
    dtype, rank, address, rest = int(args[2]), int(args[3]), args[4], list(args[5:])
    if not isinstance(address, tirx.Var) or address.name not in data_names:
        raise AotError(f"{where}: a TMA descriptor's global address must be a tensor argument, got `{address}`")
    if len(rest) != 4 * rank + 4:
        raise AotError(f"{where}: TMA descriptor has {len(rest)} fields, expected {4 * rank + 4}")
    tree = lambda e: to_tree(e, where, lets)  # noqa: E731
    return TmaSpec(
        param=data_names[address.name], dtype=dtype, rank=rank,
        dims=tuple(tree(e) for e in rest[:rank]),
        strides=tuple(tree(e) for e in rest[rank + 1:2 * rank]),  # first entry is the element size
        box=tuple(int(e) for e in rest[2 * rank:3 * rank]),
        elem_strides=tuple(int(e) for e in rest[3 * rank:4 * rank]),
        interleave=int(rest[4 * rank]), swizzle=int(rest[4 * rank + 1]),
        l2_promotion=int(rest[4 * rank + 2]), oob_fill=int(rest[4 * rank + 3]),
    )


def _packed_calls(host_func: tirx.PrimFunc) -> list[tuple[str, list[Any]]]:
    calls: list[tuple[str, list[Any]]] = []
    op = tvm.ir.Op.get("tirx.tvm_call_packed")

    def visit(node: Any) -> None:
        if isinstance(node, tirx.Call) and node.op.same_as(op):
            calls.append((str(node.args[0].value), list(node.args[1:])))

    tvm.tirx.stmt_functor.post_order_visit(host_func.body, visit)
    return calls  # post-order visits statements in program order


def _extent(attrs: Any, tag: str, where: str) -> Any:
    extents = attrs.get("thread_extent", {})
    for key, value in extents.items():
        if str(key) == tag:
            return to_tree(value, where)
    return 1


def _launch(fn: tirx.PrimFunc, name: str, call_args: list[Any], env: dict, where: str) -> LaunchSpec:
    attrs, lw = fn.attrs, f"{where} kernel {name}"
    if attrs.get("l2_persistent_map"):
        raise AotError(f"{lw}: L2 persistence windows are not expressible in the manifest")
    args = []
    for param, value in zip(fn.params, call_args[:len(fn.params)]):
        vname = value.name if isinstance(value, tirx.Var) else None
        if vname in env["data_names"]:
            args.append(ArgSpec(kind="ptr", param=env["data_names"][vname]))
        elif vname in env["tma_index"]:
            args.append(ArgSpec(kind="tma", tma=env["tma_index"][vname]))
        elif str(param.dtype).startswith("handle"):
            raise AotError(f"{lw}: pointer argument `{value}` is neither a tensor nor a TMA descriptor")
        else:
            args.append(ArgSpec(kind="scalar", dtype=dtype_name(param.dtype), value=to_tree(value, lw, env["lets"])))
    cluster = attrs.get("cluster_dims")
    return LaunchSpec(
        entry=name,
        grid=tuple(_extent(attrs, f"blockIdx.{a}", lw) for a in "xyz"),
        block=tuple(_extent(attrs, f"threadIdx.{a}", lw) for a in "xyz"),
        smem=int(attrs.get("dyn_shared_memory_buf", 0)),
        args=tuple(args),
        cluster=tuple(int(c) for c in cluster) + (1,) * (3 - len(cluster)) if cluster else (1, 1, 1),
        cooperative=bool(attrs.get("use_cooperative_groups", False)),
        pdl="has_cuda_pdl_sync" in attrs,
    )


def launch_facts(func: tirx.PrimFunc, host_mod: Any, device_mod: Any, where: str,
                 outputs: tuple[str, ...] = (), align: int = 16, *, optional: tuple[str, ...] = (),
                 conditions: tuple[str, ...] = (), key: Any = None, also_dtypes: Any = None) -> LaunchFacts:
    """All launch facts of one lowered variant; raises AotError for what the manifest can't express.

    ``optional``: tensor parameters a call may pass as None; ``conditions``: the declaration's
    condition texts (aot/_conditions.py), ``key`` the variant's compile-time values they may name;
    ``also_dtypes``: ``{tensor parameter: dtypes of its item size it also takes}``.
    """
    params, tensors, scalars, data_names = signature(func, where, outputs, align)
    params = _mark_optional(params, optional, where)
    tensors = _with_also_dtypes(tensors, dict(also_dtypes or {}), where)
    host_funcs = list(host_mod.functions.values())
    if len(host_funcs) != 1:
        raise AotError(f"{where}: expected one host function after lowering, got {len(host_funcs)}")
    host = host_funcs[0]
    if host.attrs.get("l2_persistent_map"):
        raise AotError(f"{where}: L2 persistence windows are not expressible in the manifest")
    symbols = {s.name for s in scalars}
    for t in tensors:
        symbols |= {e for e in (*t.shape, *t.strides) if isinstance(e, str)}
    lets = {k: v for k, v in host_lets(host).items() if k not in symbols}
    tma_args = host.attrs.get("tma_descriptor_args") or {}
    tma_index, tma = {}, []
    for var, args in tma_args.items():
        tma_index[var.name] = len(tma)
        tma.append(_tma_spec(list(args), data_names, where, lets))
    device = {gv.name_hint: fn for gv, fn in device_mod.functions.items()}
    env = {"data_names": data_names, "tma_index": tma_index, "lets": lets}
    launches = []
    for name, args in _packed_calls(host):
        if name in device:
            launches.append(_launch(device[name], name, args, env, where))
        elif name not in _KNOWN_HOST_CALLS:
            raise AotError(f"{where}: the host code calls `{name}`, which the runtime cannot replay")
    missing = set(device) - {ln.entry for ln in launches}
    if missing:
        raise AotError(f"{where}: device kernels {sorted(missing)} are never launched by the host code")
    conds = [ConditionSpec(t, "assume") for t in assumed_conditions(func, symbols, to_tree, where)]
    for text in conditions:
        tree = declared_condition(text, dict(key or {}), symbols, where)
        if all(tree != c.expr for c in conds):
            conds.append(ConditionSpec(tree, "declared"))
    return LaunchFacts(params, tensors, scalars, tuple(tma), tuple(launches), tuple(conds))


def _with_also_dtypes(tensors: tuple[TensorSpec, ...], also: dict, where: str) -> tuple[TensorSpec, ...]:
    """The tensors with the dtypes of the same item size that ``also`` lets each take as its bits."""
    unknown = [n for n in also if n not in {t.name for t in tensors}]
    if unknown:
        raise AotError(f"{where}: also_dtypes names {unknown}, which are not tensor parameters of the kernel "
                       f"({', '.join(t.name for t in tensors) or 'none'})")
    out = []
    for t in tensors:
        extra = tuple(d for d in also.get(t.name, ()) if d != t.dtype)
        for d in extra:
            if d not in _ITEM_SIZES or _ITEM_SIZES[d] != _ITEM_SIZES.get(t.dtype):
                raise AotError(f"{where}: also_dtypes lets {t.name!r} ({t.dtype}) take {d!r}, whose item size "
                               f"differs (or is unknown); only dtypes of the same item size share the parameter's "
                               f"strides: {', '.join(n for n, b in _ITEM_SIZES.items() if b == _ITEM_SIZES.get(t.dtype))}")
        out.append(TensorSpec(t.name, t.dtype, t.shape, t.strides, t.align, t.output, t.max_elements, extra)
                   if extra else t)
    return tuple(out)


def _mark_optional(params: tuple[ParamSpec, ...], optional: tuple[str, ...], where: str) -> tuple[ParamSpec, ...]:
    tensors = {p.name for p in params if p.kind == "tensor"}
    unknown = [n for n in optional if n not in tensors]
    if unknown:
        raise AotError(f"{where}: optional={list(optional)} names {unknown}, which are not tensor parameters of the "
                       f"kernel ({', '.join(sorted(tensors)) or 'none'})")
    return tuple(ParamSpec(p.name, p.kind, p.rank, p.name in optional) for p in params)
