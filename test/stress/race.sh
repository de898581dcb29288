#!/usr/bin/env bash
# Runs the race-detector test suite ROUNDS times in a row beside a CPU hog,
# stopping at the first failure. A test that passes on an idle machine and
# fails when the scheduler is slow is a test bound to wall time; this is
# the run that finds them.
#
#   bash test/stress/race.sh                 # 5 rounds, one hog per CPU
#   ROUNDS=3 HOGS=1 PKGS=./initiator bash test/stress/race.sh
#
# ROUNDS   rounds (default 5)
# HOGS     busy loops beside the tests (default: the number of CPUs)
# PKGS     packages (default ./...)
# TESTARGS extra go test arguments (default none)
#
# Each round runs with -count=1, so nothing comes from the test cache. The
# hogs are plain shell loops at the tests' own priority, started and
# stopped by PID. Output per round goes to $OUT/round-N.log (OUT defaults
# to a temporary directory, printed at the start).
set -euo pipefail

rounds=${ROUNDS:-5}
hogs=${HOGS:-$(nproc)}
pkgs=${PKGS:-./...}
out=${OUT:-$(mktemp -d -t gosrp-race.XXXXXX)}
mkdir -p "$out"
cd "$(dirname "$0")/../.."

pids=()
stop_hogs() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop_hogs EXIT
for _ in $(seq "$hogs"); do
	(while :; do :; done) &
	pids+=($!)
done
echo "== $rounds rounds of go test -race $pkgs beside $hogs CPU hogs; logs in $out"

for r in $(seq "$rounds"); do
	start=$(date +%s)
	# shellcheck disable=SC2086
	if go test -race -count=1 ${TESTARGS:-} $pkgs >"$out/round-$r.log" 2>&1; then
		echo "round $r: ok in $(($(date +%s) - start)) s"
	else
		echo "round $r: FAILED in $(($(date +%s) - start)) s; the failing tests:"
		grep -E '^(--- FAIL|FAIL|panic:|\s+.*_test\.go:[0-9]+:)' "$out/round-$r.log" | head -40 || true
		exit 1
	fi
done
echo "== all $rounds rounds passed"
