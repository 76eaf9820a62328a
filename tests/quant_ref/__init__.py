"""Torch references for the quantization family (test-only; never shipped).

Plain torch, deterministic, identical bits on CPU and CUDA; the semantics (and output layouts) of
``tile_kernels.torch`` 1.0.0, which the ``tilebin.ops.quant`` kernels must match bit for bit.
Import as ``quant_ref`` (tests/ is on sys.path).  Checked by tests/ops/test_quant_ref_cpu.py.
"""

from .cast import (
    E2M1_MAGNITUDES,
    FMT_CLAMP_MIN,
    FMT_DTYPES,
    FMT_MAX,
    QuantPair,
    cast,
    cast_back,
    dequantize,
    e2m1_bits,
    pack_e2m1,
    scales_from_amax,
    sf_to_fp32,
    unpack_e2m1,
)
from .e5m6 import (
    E5M6_MAX,
    cast_back_from_e5m6,
    cast_to_e5m6,
    e5m6_bits,
    pack_e5m6,
    unpack_e5m6,
)
from .numeric import (
    assert_all_written,
    assert_equal,
    calc_diff,
    check_bias,
    clear_unused_sf,
    describe_mismatch,
    poison_,
    poison_like,
)

# References of the fused ops live one file per op group and are used as submodules
# (``from quant_ref import swiglu``).
from . import per_channel, swiglu  # noqa: E402,F401

__all__ = [
    "E2M1_MAGNITUDES",
    "E5M6_MAX",
    "FMT_CLAMP_MIN",
    "FMT_DTYPES",
    "FMT_MAX",
    "QuantPair",
    "assert_all_written",
    "assert_equal",
    "calc_diff",
    "cast",
    "cast_back",
    "cast_back_from_e5m6",
    "cast_to_e5m6",
    "check_bias",
    "clear_unused_sf",
    "dequantize",
    "describe_mismatch",
    "e2m1_bits",
    "e5m6_bits",
    "pack_e2m1",
    "pack_e5m6",
    "poison_",
    "poison_like",
    "scales_from_amax",
    "sf_to_fp32",
    "unpack_e2m1",
    "unpack_e5m6",
]
