#!/usr/bin/env bash
# Build the tilebin wheel into wheels/dist/ and verify it.  Idempotent; works from a fresh clone.
#
#   ./wheels/build.sh [extra pip-wheel args, e.g. -C cmake.define.TILEBIN_AOT_LINEINFO=ON]
#
# 1. (re)uses the build venv .venv (creates it, and installs the build + test tools, when
#    missing or when the list below changed);
# 2. pip wheel . --no-build-isolation: scikit-build-core runs CMake, CMake runs the AOT build
#    with this venv's Python (it has tilelang) into build/<tag>/artifacts, cached in
#    build/aot-cache, so a rebuild only lowers what changed;
# 3. wheels/verify_wheel.py checks the result.
#
# Environment: PYTHON (interpreter that creates the venv, default python3),
# TILEBIN_VENV (default <repo>/.venv), TILEBIN_PREBUILT_ARTIFACTS=<dir> (package that folder
# instead of running the AOT build), TILEBIN_WHEEL_BUDGET_MB (default 50).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${TILEBIN_VENV:-$ROOT/.venv}"
DIST="$ROOT/wheels/dist"
# The build venv: tilelang for the AOT step (CPU torch: tilelang imports it, no GPU needed),
# the scikit-build-core toolchain, the runtime's dependency and the test tools.
REQUIREMENTS=(
  "torch==2.13.0"
  "tilelang==0.1.15"
  "scikit-build-core>=1.0"
  "cmake>=3.21"
  "ninja"
  "cuda-bindings~=13.0"
  "numpy"
  "pytest"
  "hypothesis"
  "build"
  "wheel"
)

log() { printf '[build.sh] %s\n' "$*"; }

ensure_venv() {
  if [[ ! -x "$VENV/bin/python" ]]; then
    local py="${PYTHON:-python3}"
    log "creating the build venv $VENV with $("$py" --version 2>&1)"
    "$py" -m venv "$VENV"
  fi
  local stamp="$VENV/.tilebin-build-requirements"
  local want
  want="$(printf '%s\n' "${REQUIREMENTS[@]}")"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    log "build venv up to date ($VENV)"
    return
  fi
  log "installing the build requirements into $VENV"
  "$VENV/bin/python" -m pip install "${REQUIREMENTS[@]}"
  printf '%s\n' "$want" >"$stamp"
}

main() {
  local t0=$SECONDS
  ensure_venv
  mkdir -p "$DIST"
  rm -f "$DIST"/tilebin-*.whl
  local jobs
  jobs="$(nproc 2>/dev/null || echo 2)"
  log "building the wheel (AOT jobs: $jobs)"
  # PATH: scikit-build-core and the AOT step find the venv's cmake/ninja first.
  PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pip wheel . \
    --no-build-isolation --no-deps --wheel-dir "$DIST" --verbose \
    -C "cmake.define.TILEBIN_AOT_JOBS=$jobs" "$@"
  local wheels=("$DIST"/tilebin-*.whl)
  [[ -f "${wheels[0]}" ]] || { log "no wheel in $DIST"; exit 1; }
  "$VENV/bin/python" "$ROOT/wheels/verify_wheel.py" --budget-mb "${TILEBIN_WHEEL_BUDGET_MB:-50}" "${wheels[@]}"
  log "done in $((SECONDS - t0)) s: ${wheels[*]}"
}

main "$@"
