#!/usr/bin/env bash
# The long version of reliability/kill_verify.py: SIGKILL `logcache serve` at random moments
# (during writes, TRIM, write-zeroes, flushes, writeback, drain, a switch to write-through or
# write-around, and recovery itself), restart it,
# verify every flushed write. Goal: zero violations.
#
# usage: scripts/soak-kill.sh [CYCLES] [extra kill_verify.py arguments...]
#   CYCLES defaults to 1000. SEED=N replays a run's decisions. OUT=DIR (default: a new
#   directory under ${TMPDIR:-/tmp}) receives the log (soak.log) and the JSON summary
#   (summary.json). Uses $CARGO_TARGET_DIR (default target/) for the release binary.
set -euo pipefail
cycles=${1:-1000}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
bin=$target/release/logcache
(cd "$root" && cargo build --release -q -p logcache)
out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/logcache-soak-kill.XXXXXX")}
mkdir -p "$out"
seed_args=()
[ -n "${SEED:-}" ] && seed_args=(--seed "$SEED")
echo "soak-kill: $cycles cycles; log $out/soak.log, summary $out/summary.json"
/usr/bin/python3 "$root/reliability/kill_verify.py" --check-checker >"$out/check-checker.log"
set +e
/usr/bin/python3 "$root/reliability/kill_verify.py" --bin "$bin" --cycles "$cycles" \
    --json "$out/summary.json" --progress-seconds 300 "${seed_args[@]}" "$@" 2>&1 | tee "$out/soak.log"
rc=${PIPESTATUS[0]}
set -e
echo "soak-kill: exit status $rc; results in $out"
exit "$rc"
