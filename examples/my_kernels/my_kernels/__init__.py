"""my_kernels: two TileLang kernels, prebuilt into this package's own cubins, launched by tilebin's
runtime with no TileLang, TVM or nvcc installed.

    import torch, my_kernels
    y = my_kernels.scale_rows(torch.randn(4, 64, device="cuda"), 2.0)
"""

from __future__ import annotations

from tilebin.runtime import Registry

__all__ = ["registry", "scale_rows", "add_bias"]


def registry() -> Registry:
    """This package's own kernels (``my_kernels/_artifacts``), loaded once, apart from tilebin's."""
    return Registry.for_package("my_kernels")


def scale_rows(x, alpha: float):
    """``x * alpha`` for a 2-D CUDA tensor (float32 or bfloat16) whose last dim is a multiple of 8."""
    import torch

    y = torch.empty_like(x)
    registry().launch("my_kernels.scale_rows", x, y, float(alpha))
    return y


def add_bias(x, bias=None):
    """``x + bias`` (``bias`` of shape ``[x.shape[1]]``), or a copy of ``x`` when ``bias`` is None."""
    import torch

    y = torch.empty_like(x)
    registry().launch("my_kernels.add_bias", x, bias, 0 if bias is None else 1, y)
    return y
