"""TMA descriptors (CUtensorMap) for a prepared plan, re-encoded only when the tensor moves.

Each TMA kernel argument owns a few 64-byte-aligned, 128-byte descriptor buffers: one per
recently seen global address (:data:`RECENT`).  A call whose tensor pointer equals the last
one costs one comparison; a pointer seen recently costs a dict lookup; a new one costs one
``cuTensorMapEncodeTiled`` (the oldest buffer is reused).  Kernel parameters are copied by
the driver when a launch is issued, so a buffer may be rewritten right after the launch
call returns.

Encoding writes straight into our aligned buffer through the driver entry point that
cuda-python's ``cuGetProcAddress`` returns, called with ctypes: cuda-python's own
``CUtensorMap`` objects live in Python-allocated memory that is only 16-byte aligned,
while the driver requires 64.  If the entry point cannot be had, cuda-python's
``cuTensorMapEncodeTiled`` (with ``cuuint32_t``/``cuuint64_t`` wrappers) is used and its
128 bytes copied over.  Not thread-safe by itself: the Launcher's lock guards it.
"""

from __future__ import annotations

import ctypes
from typing import Any

from . import _driver
from ._record import record

RECENT = 8
DESC_BYTES = 128
_ALIGN = 64
_STATE: dict[str, Any] = {}  # "raw": the ctypes function, or None when unavailable



@record
class BoundTma:
    """Geometry of one TMA descriptor (validated by ``_plan``); only the global address changes between calls."""

    tensor_index: int
    dtype: int
    rank: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    elem_strides: tuple[int, ...]
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int


_u64p, _u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
_PROTO = ctypes.CFUNCTYPE(
    ctypes.c_int,  # CUresult
    ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,  # tensorMap, dataType, rank, globalAddress
    _u64p, _u64p, _u32p, _u32p,  # globalDim, globalStrides, boxDim, elementStrides
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,  # interleave, swizzle, l2Promotion, oobFill
)


def raw_encoder() -> Any:
    """The driver's ``cuTensorMapEncodeTiled`` as a ctypes function, or ``None`` if unavailable."""
    if "raw" not in _STATE:
        mod = _driver.driver()
        fn = None
        try:
            flags = mod.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
            pfn, _status = _driver.check(mod.cuGetProcAddress(b"cuTensorMapEncodeTiled", 12000, flags),
                                         "cuGetProcAddress(cuTensorMapEncodeTiled)")
            fn = _PROTO(int(pfn)) if pfn else None
        except Exception:  # DeviceError, or another cuda-python spelling: use the bindings' wrapper instead
            fn = None
        _STATE["raw"] = fn
    return _STATE["raw"]


class TmaArg:
    """One TMA kernel argument of a plan: geometry fixed, global address patched per call."""

    def __init__(self, bound: BoundTma, where: str) -> None:
        self.bound, self.where = bound, where
        r = bound.rank
        self._dims = (ctypes.c_uint64 * r)(*bound.dims)
        self._strides = (ctypes.c_uint64 * max(r - 1, 1))(*bound.strides)
        self._box = (ctypes.c_uint32 * r)(*bound.box)
        self._estr = (ctypes.c_uint32 * r)(*bound.elem_strides)
        self._recent: dict[int, tuple[Any, int]] = {}  # pointer -> (buffer, aligned address)
        self.last_ptr = -1
        self.last_addr = 0

    def address(self, ptr: int) -> int:
        """Address of the descriptor for global address ``ptr`` (encoding it if not recent)."""
        hit = self._recent.get(ptr)
        if hit is None:
            if len(self._recent) >= RECENT:
                old = next(iter(self._recent))
                buf = self._recent.pop(old)
            else:
                raw = (ctypes.c_char * (DESC_BYTES + _ALIGN))()
                buf = (raw, (ctypes.addressof(raw) + _ALIGN - 1) & ~(_ALIGN - 1))
            self._encode(buf[1], ptr)
            hit = self._recent[ptr] = buf
        self.last_ptr, self.last_addr = ptr, hit[1]
        return hit[1]

    def _encode(self, out: int, ptr: int) -> None:
        b = self.bound
        fn = raw_encoder()
        if fn is None:
            self._encode_bindings(out, ptr)
            return
        err = fn(out, b.dtype, b.rank, ptr, self._dims, self._strides, self._box, self._estr,
                 b.interleave, b.swizzle, b.l2_promotion, b.oob_fill)
        if err:
            _driver.check((_driver.result(err),), "cuTensorMapEncodeTiled", self._describe(ptr))

    def _encode_bindings(self, out: int, ptr: int) -> None:
        _driver.driver()
        mod, b = _driver.bindings(), self.bound
        u64, u32 = mod.cuuint64_t, mod.cuuint32_t
        result = mod.cuTensorMapEncodeTiled(
            mod.CUtensorMapDataType(b.dtype), b.rank, ptr,
            [u64(x) for x in b.dims], [u64(x) for x in b.strides],
            [u32(x) for x in b.box], [u32(x) for x in b.elem_strides],
            mod.CUtensorMapInterleave(b.interleave), mod.CUtensorMapSwizzle(b.swizzle),
            mod.CUtensorMapL2promotion(b.l2_promotion), mod.CUtensorMapFloatOOBfill(b.oob_fill),
        )
        tmap = _driver.check(result, "cuTensorMapEncodeTiled", self._describe(ptr))
        ctypes.memmove(out, tmap.getPtr(), DESC_BYTES)

    def _describe(self, ptr: int) -> str:
        b = self.bound
        return (f"{self.where}; descriptor: dtype={b.dtype} rank={b.rank} address={ptr:#x} dims={b.dims} "
                f"byte strides={b.strides} box={b.box} element strides={b.elem_strides} "
                f"interleave={b.interleave} swizzle={b.swizzle} l2={b.l2_promotion} oob={b.oob_fill}")
