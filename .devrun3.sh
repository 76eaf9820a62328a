#!/usr/bin/env bash
# session scratch (untracked): op budget A/B with the after wheel first, and bench_launch of the base wheel
set -u
REPO=$(pwd) NEW=$(ls wheels/dist/*.whl) BASE=$(ls .gpuwheel/base/*.whl)
AB_FIRST=after OUT=/tmp/ab2 timeout 200 bash bench/op_budget_ab.sh "$BASE" "$NEW" 2 2
for f in /tmp/ab2/*.md; do echo "=== $f"; cat "$f"; done > "$OUT/ab-after-first.md"
rm -rf /tmp/tb-base && python3 -m pip install -q --no-deps --target /tmp/tb-base "$BASE"
(cd /tmp && PYTHONPATH=/tmp/tb-base timeout 240 python3 "$REPO/bench/bench_launch.py" --md "$OUT/launch-base.md" 2>&1 | tail -3)
