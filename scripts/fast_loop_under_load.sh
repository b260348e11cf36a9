#!/usr/bin/env bash
# The fast loop N times in a row (default 5) while two full suites run beside it, in a loop,
# each in a worktree of HEAD of its own: whether the fast loop holds on a machine that other
# suites load (docs/testing.md). Exits non-zero if any fast loop failed.
#
#   scripts/fast_loop_under_load.sh [N] [LOG_FOLDER]
#
# Run it from the repository with the environment the README sets up (`python` on PATH).
# LOG_FOLDER (default: a new temporary folder) gets every run's log and summary.txt.
set -u
loops=${1:-5}
logs=${2:-$(mktemp -d)}
mkdir -p "$logs"
repo=$(git rev-parse --show-toplevel)
rev=$(git -C "$repo" rev-parse --short HEAD)
work=$(mktemp -d)
for name in suite1 suite2 fast; do
  git -C "$repo" worktree add -q --detach "$work/$name" "$rev"
done

suites=()
token="$$-$(date +%s)"
stop() {
  touch "$logs/done"
  # The suites' SuperLinks, SuperNodes and Ray heads run in sessions of their own and outlive a
  # killed pytest; every process of a suite carries the token in its environment.
  for pid in "${suites[@]}"; do kill -INT -- "-$pid" 2>/dev/null; done
  sleep 10
  for proc in /proc/[0-9]*; do
    grep -qsz "^FAST_LOOP_UNDER_LOAD=$token\$" "$proc/environ" && kill -KILL "${proc#/proc/}" 2>/dev/null
  done
  wait 2>/dev/null
  for name in suite1 suite2 fast; do git -C "$repo" worktree remove --force "$work/$name"; done
  rmdir "$work" 2>/dev/null
}
trap stop EXIT

for name in suite1 suite2; do
  FAST_LOOP_UNDER_LOAD=$token setsid bash -c '
    cd "$1"; run=0
    while [ ! -f "$2/done" ]; do
      run=$((run + 1))
      PYTHONPATH=$PWD python -m pytest -q -p no:cacheprovider > "$2/$3-$run.log" 2>&1
      echo "$3 run $run rc=$?: $(tail -1 "$2/$3-$run.log")" >> "$2/summary.txt"
    done' _ "$work/$name" "$logs" "$name" &
  suites+=($!)
done
sleep 60  # both suites are under way before the first fast loop

cd "$work/fast" || exit 2
failed=0
for i in $(seq 1 "$loops"); do
  start=$(date +%s)
  PYTHONPATH=$PWD python -m pytest -m "not slow" -q -p no:cacheprovider > "$logs/fast-$i.log" 2>&1
  rc=$?
  echo "fast loop $i at $rev rc=$rc in $(( $(date +%s) - start )) s, load $(cut -d' ' -f1 /proc/loadavg): $(tail -1 "$logs/fast-$i.log")" \
    | tee -a "$logs/summary.txt"
  [ "$rc" -eq 0 ] || failed=1
done
echo "logs: $logs"
exit "$failed"
