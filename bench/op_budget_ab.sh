#!/usr/bin/env bash
# Issue 10's op budget (bench/bench_op_budget.py) of two wheels, before and after a change, in
# alternating processes pinned to one core (this host's speed drifts within a run, so the rounds
# interleave: before, after, before, after, ...).  On the device machine:
#
#   bash bench/op_budget_ab.sh BEFORE.whl AFTER.whl [ROUNDS=2] [CORE=2]
#
# AB_FIRST=after runs the after wheel first in each round (to see whether a process's place in
# the order, not its wheel, makes it slower).
# Writes $OUT/budget-before-N.md and $OUT/budget-after-N.md (N = 1..ROUNDS), one table each.
set -euo pipefail
before="$1" after="$2" rounds="${3:-2}" core="${4:-2}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-/tmp/op-budget-ab}"
mkdir -p "$out"
for which in before after; do
  rm -rf "/tmp/tb-ab-$which"
  python3 -m pip install -q --no-deps --target "/tmp/tb-ab-$which" "${!which}"
done
for ((n = 1; n <= rounds; n++)); do
  order="before after"
  [[ "${AB_FIRST:-before}" == after ]] && order="after before"
  for which in $order; do
    echo "== round $n: $which ($(basename "$(dirname "${!which}")"))"
    (cd /tmp && PYTHONPATH="/tmp/tb-ab-$which" taskset -c "$core" python3 "$repo/bench/bench_op_budget.py" \
      --md "$out/budget-$which-$n.md" | grep -E "ops met the budget" || true)
  done
done
