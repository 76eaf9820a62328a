#!/usr/bin/env bash
# Build this package's wheel with its own cubins: dist/my_kernels-*.whl.
#   PYTHON   an interpreter with tilebin[aot] (TileLang) and nvcc 13 (default: python)
# Run from anywhere; needs no GPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
PYTHON="${PYTHON:-python}"
"$PYTHON" -m tilebin.aot build --out my_kernels/_artifacts --cache build/aot-cache my_kernels.kernels
rm -rf dist build/lib
"$PYTHON" -m pip wheel --no-deps --no-build-isolation --quiet -w dist .
ls dist/*.whl
