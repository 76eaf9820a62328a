"""tilebin.aot: lower TileLang kernels for sm_90a into cubins plus a manifest, on a machine with no GPU.

Generic: it builds any importable module that exports ``KERNELS``, a sequence of
:class:`KernelDecl` (or objects with the same attributes: name, factory, grid,
outputs, align, pass_configs).  CLI: ``python -m tilebin.aot build --out DIR [MODULE ...]``.
"""

from tilebin.kernels._declare import KernelDecl, product

from ._build import BuildOptions, build, enumerate_jobs
from ._errors import AotError

__all__ = ["AotError", "BuildOptions", "KernelDecl", "build", "enumerate_jobs", "product"]
