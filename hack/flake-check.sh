#!/usr/bin/env bash
# make flake-check: the test suites, again and again, beside CPU hogs.
#
# Runs the unit suite UNIT_RUNS times (default 10) and the simulated-node e2e lane E2E_RUNS times
# (default 3) while LOAD busy loops (default 2, one per core of the reference machine) compete for
# the CPUs, and prints one line per run plus a summary: a test that fails here depends on how busy
# the machine is. Every failing run's output is kept under $OUT (default
# /tmp/flake-check-<time>) for reading. The hogs are this script's children and are killed on
# every exit path (trap), so nothing is left running.
#
# make flake TEST=<pytest node id> [N=20]: the same for one test (or one module, or `-k`-free
# node ids separated by spaces), N times beside the same busy loops, stopping at nothing: every
# run is counted and every failing run's log kept. The cheap way to show a fix holds before it
# lands (docs/development.md "Flaky tests").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
UNIT_RUNS=${UNIT_RUNS:-10}
E2E_RUNS=${E2E_RUNS:-3}
LOAD=${LOAD:-2}
TEST=${TEST:-}
N=${N:-20}
if [[ -n "$TEST" && ! "$N" =~ ^[1-9][0-9]*$ ]]; then
  echo "flake: N must be a positive count of runs, not '$N'" >&2
  exit 2
fi
OUT=${OUT:-/tmp/flake-check-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

hogs=()
suite=""  # the test run in progress: SIGTERM/SIGINT reach it (pytest then tears its lane down)
stop_hogs() {
  for pid in "${hogs[@]:-}"; do
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
stop() {  # stop <exit code>: the suite first (its teardown runs), then the hogs via EXIT
  [[ -n "$suite" ]] && kill -TERM "$suite" 2>/dev/null && wait "$suite" 2>/dev/null
  exit "$1"
}
trap stop_hogs EXIT
trap 'stop 130' INT
trap 'stop 143' TERM
for _ in $(seq 1 "$LOAD"); do
  ( while :; do :; done ) &
  hogs+=("$!")
done
if [[ -n "$TEST" ]]; then
  echo "==> flake: $TEST, $N runs, $LOAD busy loops; logs in $OUT"
else
  echo "==> flake-check: $UNIT_RUNS unit runs, $E2E_RUNS simulated-lane runs, $LOAD busy loops; logs in $OUT"
fi

failed=0
run() {  # run <label> <log> <command...>
  local label=$1 log=$2
  shift 2
  local t0=$SECONDS rc=0
  # In the background so that a signal to this script is handled at once (`wait` returns).
  "$@" >"$log" 2>&1 &
  suite=$!
  wait "$suite" || rc=$?
  suite=""
  if [[ $rc -eq 0 ]]; then
    echo "$label: passed in $((SECONDS - t0))s ($(grep -Eo '[0-9]+ passed' "$log" | tail -1))"
    rm -f "$log"
  else
    failed=$((failed + 1))
    echo "$label: FAILED in $((SECONDS - t0))s; $(grep -E '^(FAILED|ERROR) ' "$log" | head -5 | tr '\n' ';')"
  fi
}
if [[ -n "$TEST" ]]; then
  read -r -a ids <<<"$TEST"
  for i in $(seq 1 "$N"); do
    run "run $i" "$OUT/run-$i.log" "$PY" -m pytest "${ids[@]}" -q -p no:cacheprovider
  done
  echo "==> flake: $failed failed run(s) of $N"
  [[ $failed -eq 0 ]]
  exit
fi
for i in $(seq 1 "$UNIT_RUNS"); do
  run "unit run $i" "$OUT/unit-$i.log" "$PY" -m pytest test/unit test/hack -q -p no:cacheprovider
done
for i in $(seq 1 "$E2E_RUNS"); do
  run "simulated lane run $i" "$OUT/e2e-$i.log" "$PY" -m pytest test/e2e -q -p no:cacheprovider
done
echo "==> flake-check: $failed failed run(s) of $((UNIT_RUNS + E2E_RUNS))"
[[ $failed -eq 0 ]]
