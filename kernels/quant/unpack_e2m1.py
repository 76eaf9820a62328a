"""``quant.unpack_e2m1``: decode packed e2m1 bytes (two values per byte, low nibble first) to floats.

``out[r, 2 c + j] = e2m1(nibble j of x[r, c])``, exact in every output dtype (e2m1 values are
0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6; nibble 8 is -0.0).  Parameters, in order:

* ``x``: ``[rows, cols]`` int8 or uint8 (the variant's ``in_dtype``), contiguous;
* ``out``: ``[rows, out_cols]`` with ``out_cols == 2 * cols`` (the op allocates it), contiguous.

Design: the bytes are one flat sequence cut into units of 16 output bytes (4 fp32 or 8 bf16/fp16
values, 2 or 4 input bytes); a thread decodes one unit: one vector load, one 16-byte store, so a
warp's accesses are contiguous.  A last unit that the bytes do not fill (``rows * cols`` not a
multiple of the unit) is decoded byte by byte.
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl, product
from ._formats import e2m1_nibble_to_float

THREADS = 256
OUT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
IN_DTYPES = ("int8", "uint8")


def _view(buf, shape, dtype: str):
    """A reinterpreting view of ``buf``'s data (built inline at each use: a name would rename the
    kernel parameter)."""
    return T.Tensor(shape, dtype, buf.data)


def unpack_e2m1(in_dtype: str, out_dtype: str):
    """Build the PrimFunc for one (input byte dtype, output dtype)."""
    if in_dtype not in IN_DTYPES or out_dtype not in OUT_BYTES:
        raise ValueError(f"unpack_e2m1: unsupported variant in_dtype={in_dtype!r} out_dtype={out_dtype!r}")
    ov = 16 // OUT_BYTES[out_dtype]  # values per unit
    in_bytes = ov // 2  # 2 or 4
    in_elem = "uint16" if in_bytes == 2 else "uint32"
    rows, cols, out_cols = T.dynamic("rows"), T.dynamic("cols"), T.dynamic("out_cols")
    num_bytes = rows * cols
    full_units = num_bytes // in_bytes
    num_units = T.ceildiv(num_bytes, in_bytes)

    @T.prim_func
    def main(
        x: T.Tensor((rows, cols), in_dtype),
        out: T.Tensor((rows, out_cols), out_dtype),
    ):
        with T.Kernel(T.ceildiv(num_units, THREADS), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            res = T.alloc_local((ov,), out_dtype)
            word = T.alloc_var("uint32")
            code = T.alloc_var("uint32")
            q = bx * THREADS + tid
            if q < full_units:
                word = T.Cast("uint32", _view(x, (full_units,), in_elem)[q])
                for v in T.unroll(ov):
                    code = (word >> T.uint32(4 * v)) & T.uint32(0xF)
                    res[v] = T.Cast(out_dtype, e2m1_nibble_to_float(code))
                for v in T.vectorized(ov):
                    _view(out, (full_units * ov,), out_dtype)[q * ov + v] = res[v]
            elif q < num_units:  # the partial last unit, byte by byte
                for b in T.serial(in_bytes):
                    if q * in_bytes + b < num_bytes:
                        word = T.Cast("uint32", _view(x, (num_bytes,), "uint8")[q * in_bytes + b])
                        for j in T.unroll(2):
                            code = (word >> T.uint32(4 * j)) & T.uint32(0xF)
                            _view(out, (num_bytes * 2,), out_dtype)[(q * in_bytes + b) * 2 + j] = T.Cast(
                                out_dtype, e2m1_nibble_to_float(code))

    return main


KERNELS = (
    KernelDecl(
        name="quant.unpack_e2m1",
        factory=unpack_e2m1,
        grid=product(in_dtype=list(IN_DTYPES), out_dtype=list(OUT_BYTES)),
        outputs=("out",),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        conditions=("out_cols == 2 * cols",),
        doc="out[r, 2c + j] = e2m1 value of nibble j of x[r, c] (low first); int8/uint8 -> fp32/bf16/fp16, exact.",
    ),
)

__all__ = ["IN_DTYPES", "KERNELS", "OUT_BYTES", "unpack_e2m1"]
