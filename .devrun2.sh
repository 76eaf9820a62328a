#!/usr/bin/env bash
# session scratch (untracked): op budget A/B (before = 16729a0, after = this tree) and bench_launch
set -u
REPO=$(pwd) NEW=$(ls wheels/dist/*.whl) BASE=$(ls .gpuwheel/base/*.whl)
OUT=/tmp/ab1 timeout 200 bash bench/op_budget_ab.sh "$BASE" "$NEW" 2 2
for f in /tmp/ab1/*.md; do echo "=== $f"; cat "$f"; done > "$OUT/ab.md"
rm -rf /tmp/tb-new && python3 -m pip install -q --no-deps --target /tmp/tb-new "$NEW"
(cd /tmp && PYTHONPATH=/tmp/tb-new timeout 240 python3 "$REPO/bench/bench_launch.py" --md "$OUT/launch-new.md" --json "$OUT/launch-new.json" 2>&1 | tail -5)
