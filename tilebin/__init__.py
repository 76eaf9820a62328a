"""tilebin: prebuilt TileLang GPU kernels, launched without compiling at deploy time.

Subpackages (nothing is imported here, so ``import tilebin`` costs nothing):

- ``tilebin.runtime``: loads the shipped cubins and launches them (cuda-python only);
- ``tilebin.aot``: the build step that lowers TileLang kernels into cubins + a manifest;
- ``tilebin.kernels``: the TileLang kernel declarations that ``tilebin.aot`` builds.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
