"""Scalar kernel arguments: the C types the manifest names, their ranges, and their 8-byte slots.

A leaf module shared by validation (``_plan``), the layout compiler (``_layout``) and the hot
path (``_launcher``): converting a Python number to a C type is the same wherever it happens.
"""

from __future__ import annotations

import math
import numbers
import struct
from typing import Any

from ._errors import ArgumentError

# scalar dtype -> (kind, min, max); kind: "i" integer, "f" floating, "b" bool
SCALAR_DTYPES: dict[str, tuple[str, int, int]] = {
    **{f"int{b}": ("i", -(1 << (b - 1)), (1 << (b - 1)) - 1) for b in (8, 16, 32, 64)},
    **{f"uint{b}": ("i", 0, (1 << b) - 1) for b in (8, 16, 32, 64)},
    **{f: ("f", 0, 0) for f in ("float16", "bfloat16", "float32", "float64")},
    "bool": ("b", 0, 1),
}
_FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}
# struct format of one 8-byte slot per dtype (little-endian, value then zero padding)
SLOT_FORMAT = {
    "int8": "b7x", "int16": "h6x", "int32": "i4x", "int64": "q",
    "uint8": "B7x", "uint16": "H6x", "uint32": "I4x", "uint64": "Q",
    "float32": "f4x", "float64": "d", "float16": "H6x", "bfloat16": "H6x", "bool": "B7x",
}
CONVERTED = frozenset(("float16", "bfloat16", "bool"))  # stored as bits after convert_scalar's checks
# the compiled hot path's dtype codes (csrc/_hot_eval.h: T_I8 ...)
DTYPE_CODE = {d: i for i, d in enumerate(("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                          "float32", "float64", "float16", "bfloat16", "bool"))}


def convert_scalar(value: Any, dtype: str, what: str) -> Any:
    """Check a scalar against a C type and return it as a Python int/float/bool.

    Accepts Python (and numpy) numbers only, never tensors (reading one would synchronise).
    Raises :class:`ArgumentError` naming ``what``, the value and the type's range.
    """
    kind, lo, hi = SCALAR_DTYPES.get(dtype, ("?", 0, 0))
    if kind == "i" and value.__class__ is int and lo <= value <= hi:
        return value  # the common case, without the ABC checks below
    if kind == "?":
        raise ArgumentError(f"{what}: unsupported scalar dtype {dtype!r} in the manifest; rebuild the artifacts")
    if isinstance(value, numbers.Number):
        if kind == "f" and isinstance(value, numbers.Real):
            v = float(value)
            if abs(v) <= _FLOAT_MAX.get(dtype, math.inf) or v != v or abs(v) == math.inf:
                return v
            raise ArgumentError(f"{what} = {v!r} does not fit {dtype} (max {_FLOAT_MAX[dtype]:g}); scale it down")
        if kind == "b" and isinstance(value, numbers.Integral) and value in (0, 1):
            return bool(value)
        if kind == "i" and isinstance(value, numbers.Integral):
            v = int(value)
            if lo <= v <= hi:
                return v
            raise ArgumentError(
                f"{what} = {v} does not fit {dtype} [{lo}, {hi}]; split the input or use smaller values"
            )
    want = {"f": "float", "b": "bool", "i": "int"}[kind]
    raise ArgumentError(f"{what}: expected a Python {want} (packed as {dtype}), got {value!r} ({type(value).__name__})")


def scalar_bits(dtype: str, value: Any) -> Any:
    """The value to pack with ``SLOT_FORMAT[dtype]`` (half types become their bit patterns)."""
    if dtype == "float16":
        try:
            return struct.unpack("<H", struct.pack("<e", value))[0]
        except (OverflowError, struct.error):
            raise ArgumentError(f"{value!r} does not fit float16 (max 65504)") from None
    if dtype == "bfloat16":
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        if value != value:  # NaN: keep it a quiet NaN
            return 0x7FC0
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF  # round to nearest even
    return value


def slot_bytes(dtype: str, value: Any, what: str) -> bytes:
    """The 8 bytes of a scalar argument (checked: :class:`ArgumentError` if it does not fit)."""
    return struct.pack("<" + SLOT_FORMAT[dtype], scalar_bits(dtype, convert_scalar(value, dtype, what)))
