#!/usr/bin/env bash
# Nsight Compute over cases of bench/compare_peer_cases.py, each side in its own process
# (bench/profile_case.py), for the lent H200 (clocks left alone: --clock-control none).
#
#   PYTHONPATH=<tilebin site>:<peer site> OUT=dir bash bench/ncu_cases.sh "moe get_fused_mapping topk 2" ...
#
# Each argument is "FAMILY OP CASE-SUBSTRING"; both sides (ours, peer) are profiled; reports go to
# $OUT/ncu.txt (the SpeedOfLight, memory, launch, occupancy, warp-state and scheduler sections).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-/tmp}"
PY="${PY:-python3}"
for spec in "$@"; do
  read -r family op rest <<<"$spec"
  for side in ours peer; do
    echo "=================== $family.$op [$rest] $side" >>"$OUT/ncu.txt"
    timeout -k 5 120 ncu --clock-control none --profile-from-start off --cache-control all \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
      --section WarpStateStats --section SchedulerStats \
      "$PY" "$HERE/profile_case.py" --family "$family" --op "$op" --case "$rest" --side "$side" \
      >>"$OUT/ncu.txt" 2>&1
    echo "rc=$? ($family.$op $side)" | tee -a "$OUT/ncu.txt"
  done
done
