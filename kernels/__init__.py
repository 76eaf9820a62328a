"""tilebin's TileLang kernels: one file per op, each exporting ``KERNELS`` (its declarations).

``tilebin.kernels.modules.ALL_MODULES`` lists the modules the wheel build lowers.
"""

from ._declare import KernelDecl, product

__all__ = ["KernelDecl", "product"]
