"""``quant.cast_back``: dequantize e4m3 or packed e2m1 data with block scales to bf16 / fp32.

``out[t, c] = decode(x[t, c]) * sf(t >> shift_t, c >> shift_c)``, the product rounded once to the
output dtype (fp32 multiply, then round-to-nearest-even to bf16 where asked), exactly as the torch
reference does it.  Parameters, in order:

* ``x``: ``[num_tokens, hidden]`` float8_e4m3fn, or ``[num_tokens, hidden // 2]`` int8 holding two
  e2m1 values per byte (low nibble = even channel); contiguous.
* ``x_sf``: the scales in kernel orientation (see ``ops/quant/_sf.py``):
  ``row``: fp32 ``[sf_m, sf_k]``; ``col``: fp32 ``[sf_k, sf_m]``; ``ue8m0``: uint8 ``[sf_k4, sf_m4]``
  where byte ``4 * m + k % 4`` of row ``k // 4`` holds the exponent of block ``(m, k)``.  Every
  layout has a runtime row stride ``sf_stride`` and unit column stride.
* ``out``: ``[num_tokens, hidden]`` bfloat16 or float32, contiguous.
* ``shift_t``, ``shift_c``: block index = index >> shift.  A block size is a power of two
  (shift = log2), or covers the whole dimension (shift 30: every index maps to block 0); the op
  turns ``x_block_size`` into these shifts.

Rules the op checks: ``hidden % 64 == 0``; 16-byte aligned pointers; int32 element counts.

Design: the problem is flattened into units of 16 output bytes (8 bf16 or 4 fp32 values); a
thread owns ``UNROLL`` units spaced ``THREADS`` apart, so every warp-wide access is contiguous:
its 16-byte stores cover 512 bytes, its loads (2 to 8 bytes each) 64 to 256 bytes.  The block
index of the unit's row and of each channel comes from shifts; when ``shift_c`` is at least
log2(values per unit) a unit has one scale, loaded in the first loop with the unit's data (every
load of a thread issued before the first use), otherwise one per value, loaded where it is used
(small channel blocks, e.g. (128, 1)).
"""

# No ``from __future__ import annotations``: TileLang evaluates the tensor annotations.
import tilelang.language as T

from .._declare import KernelDecl, product
from ._formats import e2m1_nibble_to_float, e4m3_byte_to_float, load_sf_f32

THREADS = 256
UNROLL = 4
SF_KINDS = ("row", "col", "ue8m0")
_IN_DTYPES = {"e4m3": "float8_e4m3fn", "e2m1": "int8"}
_OUT_BYTES = {"bfloat16": 2, "float32": 4}
_LOG2 = {4: 2, 8: 3}


def _view(buf, shape, dtype: str):
    """A reinterpreting view of ``buf``'s data.  Build it inline at each use: binding it to a name
    in the PrimFunc renames the data pointer, hence the kernel parameter."""
    return T.Tensor(shape, dtype, buf.data)


def cast_back(in_fmt: str, out_dtype: str, sf_kind: str):
    """Build the PrimFunc for one (input format, output dtype, scale layout)."""
    if in_fmt not in _IN_DTYPES or out_dtype not in _OUT_BYTES or sf_kind not in SF_KINDS:
        raise ValueError(f"cast_back: unsupported variant in_fmt={in_fmt!r} out_dtype={out_dtype!r} sf_kind={sf_kind!r}")
    ov = 16 // _OUT_BYTES[out_dtype]  # values per unit (16 output bytes)
    log2_ov = _LOG2[ov]
    per_byte = 1 if in_fmt == "e4m3" else 2
    in_bytes = ov // per_byte  # input bytes per unit: 8, 4 or 2
    in_elem = "uint16" if in_bytes == 2 else "uint32"
    in_n = max(1, in_bytes // 4)  # input elements per unit
    in_elem_bytes = in_bytes // in_n
    num_tokens, hidden = T.dynamic("num_tokens"), T.dynamic("hidden")
    x_cols = T.dynamic("x_cols")  # hidden // 2 for e2m1 (TileLang binds symbols from plain dims only)
    sf_stride = T.dynamic("sf_stride")
    if sf_kind == "row":
        sf_shape, sf_dtype = (T.dynamic("sf_m"), T.dynamic("sf_k")), "float32"
    elif sf_kind == "col":
        sf_shape, sf_dtype = (T.dynamic("sf_k"), T.dynamic("sf_m")), "float32"
    else:
        sf_shape, sf_dtype = (T.dynamic("sf_k4"), T.dynamic("sf_m4")), "uint8"
    units_per_row = hidden // ov
    num_units = num_tokens * units_per_row
    per_block = THREADS * UNROLL

    @T.prim_func
    def main(
        x: T.Tensor((num_tokens, x_cols), _IN_DTYPES[in_fmt]),
        x_sf: T.StridedTensor(sf_shape, (sf_stride, 1), sf_dtype),
        out: T.Tensor((num_tokens, hidden), out_dtype),
        shift_t: T.int32,
        shift_c: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_units, per_block), threads=THREADS) as bx:
            tid = T.get_thread_binding()
            raw = T.alloc_local((UNROLL, in_n), in_elem)
            vals = T.alloc_local((ov,), "float32")
            res = T.alloc_local((ov,), out_dtype)
            q = T.alloc_var("int32")
            m = T.alloc_var("int32")
            c0 = T.alloc_var("int32")
            sfu = T.alloc_local((UNROLL,), "float32")
            code = T.alloc_var("uint32")
            for u in T.unroll(UNROLL):
                q = bx * per_block + u * THREADS + tid
                if q < num_units:
                    for w in T.vectorized(in_n):
                        raw[u, w] = _view(x, (num_units * in_n,), in_elem)[q * in_n + w]
                    if shift_c >= log2_ov:  # the unit's one scale, loaded with its data
                        m = T.truncdiv(q, units_per_row) >> shift_t  # (in 32-bit variables: an index
                        c0 = T.truncmod(q, units_per_row) * ov  # expression would divide in 64 bits)
                        sfu[u] = load_sf_f32(x_sf, sf_kind, m, c0 >> shift_c)
            for u in T.unroll(UNROLL):
                q = bx * per_block + u * THREADS + tid
                if q < num_units:
                    m = T.truncdiv(q, units_per_row) >> shift_t
                    c0 = T.truncmod(q, units_per_row) * ov
                    for v in T.unroll(ov):
                        # the code in a variable keeps the decode expression small
                        code = (T.Cast("uint32", raw[u, v // per_byte // in_elem_bytes])
                                >> T.Cast("uint32", 8 * ((v // per_byte) % in_elem_bytes))) & T.uint32(0xFF)
                        if per_byte == 1:
                            vals[v] = e4m3_byte_to_float(code)
                        else:
                            code = (code >> T.Cast("uint32", 4 * (v % 2))) & T.uint32(0xF)
                            vals[v] = e2m1_nibble_to_float(code)
                    if shift_c >= log2_ov:
                        for v in T.unroll(ov):
                            res[v] = T.Cast(out_dtype, vals[v] * sfu[u])
                    else:
                        for v in T.unroll(ov):
                            res[v] = T.Cast(out_dtype, vals[v] * load_sf_f32(x_sf, sf_kind, m, (c0 + v) >> shift_c))
                    for v in T.vectorized(ov):
                        _view(out, (num_units * ov,), out_dtype)[q * ov + v] = res[v]

    return main


KERNELS = (
    KernelDecl(
        name="quant.cast_back",
        factory=cast_back,
        grid=product(in_fmt=["e4m3", "e2m1"], out_dtype=["bfloat16", "float32"], sf_kind=list(SF_KINDS)),
        outputs=("out",),
        pass_configs={"tl.disable_safe_memory_legalize": True},  # every access is guarded above
        doc="out = decode(x) * block scale; e4m3 / packed e2m1 -> bf16 / fp32, scales row / col / ue8m0.",
    ),
)

__all__ = ["KERNELS", "SF_KINDS", "cast_back"]
