"""Scale-factor layouts of tilebin.ops.quant (CPU): kernel-side allocation, the tensors ops return,
and reading a user's (data, sf) pair back; the shapes and strides tile_kernels returns."""

from __future__ import annotations

import pytest
import torch

from tilebin.ops.quant._sf import SfLayout, check_fmt, input_sf, output_layout
from tilebin.runtime import ArgumentError


@pytest.mark.parametrize("rows", [0, 1, 7, 4001])
def test_row_layout(rows):
    lay = output_layout("op", (1, 128), False, False, False)
    raw = lay.alloc(rows, 576, "cpu")
    assert lay.kind == "row" and raw.shape == (rows, 5) and raw.dtype == torch.float32
    out = lay.finish(raw, rows)
    assert out.shape == (rows, 5) and out.is_contiguous()


@pytest.mark.parametrize("rows", [1, 7, 4001])
def test_col_layout_is_tma_aligned(rows):
    lay = output_layout("op", (1, 128), True, False, True)
    raw = lay.alloc(rows, 7168, "cpu")
    pad = -(-rows // 4) * 4
    assert raw.shape == (56, rows) and raw.stride() == (pad, 1)
    out = lay.finish(raw, rows)
    assert out.shape == (rows, 56) and out.stride() == (1, pad) and out.dtype == torch.float32


@pytest.mark.parametrize("rows", [0, 1, 7, 4001])
def test_packed_ue8m0_layout(rows):
    lay = output_layout("op", (1, 128), True, True, True)
    raw = lay.alloc(rows, 576, "cpu")  # 5 groups -> 2 int32 per token
    assert lay.kind == "ue8m0" and raw.dtype == torch.uint8 and raw.shape == (2, 4 * rows)
    out = lay.finish(raw, rows)
    assert out.dtype == torch.int32 and out.shape == (rows, 2)
    if rows:
        assert out.stride() == (1, -(-rows // 4) * 4)
        back, kernel_sf, lay2 = input_sf("op", (torch.zeros(rows, 576, dtype=torch.float8_e4m3fn), out), (1, 128))
        assert lay2.kind == "ue8m0" and kernel_sf.shape == raw.shape and kernel_sf.data_ptr() == raw.data_ptr()


def test_block_layout_rows():
    lay = output_layout("op", (128, 128), False, False, False)
    assert lay.finish(lay.alloc(4001, 7168, "cpu"), 4001).shape == (32, 56)


def test_bad_layouts_and_formats():
    with pytest.raises(ArgumentError, match="needs use_tma_aligned_col_major_sf"):
        output_layout("quant.x", (1, 128), False, True, True)
    with pytest.raises(ArgumentError, match="needs round_sf"):
        output_layout("quant.x", (1, 128), True, True, False)
    with pytest.raises(ArgumentError, match="quant.x: fmt='e5m2' is not supported; supported: 'e4m3', 'e2m1'"):
        check_fmt("quant.x", "e5m2")
    with pytest.raises(ArgumentError, match="row-major input sf must be float32"):
        input_sf("op", (torch.zeros(4, 256, dtype=torch.float8_e4m3fn), torch.zeros(4, 2, dtype=torch.int32)), (1, 128))
    with pytest.raises(ArgumentError, match="quantized data has dtype"):
        input_sf("op", (torch.zeros(4, 256), torch.zeros(4, 2)), (1, 128))
