#!/usr/bin/env bash
# session scratch (untracked): GPU suite + fuzz + sanitizer on the new wheel
set -u
GPU_CHECK_STAGES="tests fuzz sanitizer" GPU_CHECK_BUDGET_S=560 bash wheels/gpu_check.sh
echo "gpu_check rc=$?"
