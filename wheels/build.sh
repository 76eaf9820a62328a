#!/usr/bin/env bash
# Build the tilebin wheel into wheels/dist/ and verify it.  Idempotent; works from a fresh clone.
#
#   ./wheels/build.sh [--nvcc PATH] [extra pip-wheel args, e.g. -C cmake.define.TILEBIN_AOT_LINEINFO=ON]
#
# 1. (re)uses the build venv .venv (creates it, and installs the build + test tools and NVIDIA's
#    pinned pip CUDA 13.0 toolchain, when missing or when the list below changed); the AOT build
#    compiles with that toolchain's nvcc, so no preinstalled CUDA toolkit is needed;
# 2. pip wheel . --no-build-isolation: scikit-build-core runs CMake, CMake runs the AOT build
#    with this venv's Python (it has tilelang) into build/<tag>/artifacts, cached in
#    build/aot-cache, so a rebuild only lowers what changed;
# 3. wheels/verify_wheel.py checks the result; only a verified wheel replaces the one in
#    wheels/dist/ (the build goes to a staging folder under build/, so a failed build or a
#    refused wheel leaves the last good wheel in place).
#
# Environment: PYTHON (interpreter that creates the venv, default python3),
# TILEBIN_VENV (default <repo>/.venv), TILEBIN_NVCC=<path> (or --nvcc PATH: compile with that nvcc,
# e.g. a system /usr/local/cuda/bin/nvcc 13.0, instead of the pip toolchain), TILEBIN_PREBUILT_ARTIFACTS=<dir> (package that folder
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
  # the CUDA 13.0 compiler from PyPI, every part pinned (aot/_nvcc.py PIP_TOOLCHAIN, which checks them):
  "nvidia-cuda-nvcc==13.0.88"
  "nvidia-nvvm==13.0.88"
  "nvidia-cuda-crt==13.0.88"
  "nvidia-cuda-runtime==13.0.96"
  "nvidia-cuda-cccl==13.0.85"
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
  else
    log "installing the build requirements into $VENV"
    "$VENV/bin/python" -m pip install "${REQUIREMENTS[@]}"
    printf '%s\n' "$want" >"$stamp"
  fi
  report_nvcc
}

# Which nvcc the AOT build will use (the same lookup, aot/_nvcc.py find_nvcc); fails now, not mid-build.
report_nvcc() {
  local nvcc
  nvcc="$(PYTHONPATH="$ROOT" "$VENV/bin/python" -c 'import sys; from tilebin.aot._nvcc import AotError, find_nvcc
try:
    n = find_nvcc()
except AotError as exc:
    sys.exit(f"[build.sh] error: {exc}")
print(f"nvcc {n.version} ({n.source}): {n.path}")')" || return 1
  log "$nvcc"
}

# --nvcc PATH (anywhere among the arguments) is TILEBIN_NVCC=PATH; the AOT step reads it (aot/_nvcc.py).
parse_args() {
  ARGS=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --nvcc) [[ $# -ge 2 ]] || { log "error: --nvcc needs a path"; return 1; }; export TILEBIN_NVCC="$2"; shift 2 ;;
      --nvcc=*) export TILEBIN_NVCC="${1#--nvcc=}"; shift ;;
      *) ARGS+=("$1"); shift ;;
    esac
  done
}

# pip wheel into DIR (a staging folder; wheels/dist is only touched once the new wheel passes).
build_wheel() {
  local out="$1"; shift
  local jobs
  jobs="$(nproc 2>/dev/null || echo 2)"
  log "building the wheel (AOT jobs: $jobs)"
  # PATH: scikit-build-core and the AOT step find the venv's cmake/ninja first.
  PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pip wheel . \
    --no-build-isolation --no-deps --wheel-dir "$out" --verbose \
    -C "cmake.define.TILEBIN_AOT_JOBS=$jobs" "$@"
}

verify_wheel() {
  "$VENV/bin/python" "$ROOT/wheels/verify_wheel.py" --budget-mb "${TILEBIN_WHEEL_BUDGET_MB:-50}" "$@"
}

# Move the one verified wheel in STAGE into $DIST, replacing the previous one; on any failure
# (no wheel, several, verify_wheel.py refuses it) $DIST keeps the last good wheel.
publish_verified() {
  local stage="$1" wheels
  shopt -s nullglob
  wheels=("$stage"/tilebin-*.whl)
  shopt -u nullglob
  if [[ ${#wheels[@]} -ne 1 ]]; then
    log "error: the build left ${#wheels[@]} wheel(s) in $stage, want exactly one; $DIST keeps the previous wheel"
    return 1
  fi
  if ! verify_wheel "${wheels[0]}"; then
    log "error: $(basename "${wheels[0]}") failed verification; $DIST keeps the previous wheel"
    return 1
  fi
  mkdir -p "$DIST"
  rm -f "$DIST"/tilebin-*.whl "$DIST/BUILD_SOURCE"
  mv "${wheels[0]}" "$DIST/" || return 1
  PUBLISHED="$DIST/$(basename "${wheels[0]}")"
  record_source "$PUBLISHED" >"$DIST/BUILD_SOURCE"
}

# One line naming the source a wheel was built from (wheels/dist/BUILD_SOURCE, carried with the
# wheel): the commit, "-dirty" when tracked files differ from it, and the wheel's sha256.  The
# device tool's copy of the tree may keep an older .git, so gpu_check.sh reports this line.
record_source() {
  local rev sum
  rev="$(git -C "$ROOT" describe --always --dirty --abbrev=12 2>/dev/null || echo "no git")"
  sum="$(sha256sum "$1" | cut -c1-16)"
  echo "$(basename "$1") built $(date -u +%FT%TZ) from $rev, sha256 $sum..."
}

main() {
  local t0=$SECONDS
  parse_args "$@" || exit 2
  set -- ${ARGS[@]+"${ARGS[@]}"}
  ensure_venv
  mkdir -p "$ROOT/build"
  STAGE="$(mktemp -d "$ROOT/build/dist-staging.XXXXXX")"
  trap 'rm -rf "$STAGE"' EXIT
  if ! build_wheel "$STAGE" "$@"; then
    log "error: the wheel build failed; $DIST keeps the previous wheel"
    exit 1
  fi
  publish_verified "$STAGE" || exit 1
  log "done in $((SECONDS - t0)) s: $PUBLISHED"
}

# Sourced (tests/test_build_sh.py stubs build_wheel/verify_wheel): define the functions only.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
