"""tilebin: prebuilt TileLang GPU kernels, launched without compiling at deploy time.

Subpackages (nothing is imported here, so ``import tilebin`` costs nothing):

- ``tilebin.runtime``: loads the shipped cubins and launches them (cuda-python only);
- ``tilebin.aot``: the build step that lowers TileLang kernels into cubins + a manifest;
- ``tilebin.kernels``: the TileLang kernel declarations that ``tilebin.aot`` builds.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"
__all__ = ["__version__"]

# In a source checkout the subpackages sit at the top of the repository (runtime/, aot/,
# kernels/) and the wheel maps them under tilebin/.  Map them here too, so that the
# same import names work in the checkout (tests, the AOT build and its worker processes).
_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "runtime" / "_manifest.py").is_file():
    __path__.append(str(_checkout))
del _Path, _checkout
