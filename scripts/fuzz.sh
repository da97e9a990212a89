#!/usr/bin/env bash
# Runs every cargo-fuzz target over the hostile-input functions (crates/hostile) for SECONDS
# each (default 300), on the stable toolchain (no sanitizer: Rust's own bounds and overflow
# checks are what fire). Installs cargo-fuzz if missing. Crashes land in fuzz/artifacts/<target>/;
# replay one with `cargo fuzz run --sanitizer none <target> <file>`.
#
# usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
secs=${1:-300}
shift || true
cd "$(dirname "$0")/../fuzz"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
status=0
for t in "${targets[@]}"; do
    log=$(mktemp)
    if cargo fuzz run --sanitizer none "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 >"$log" 2>&1; then
        runs=$(grep -o 'Done [0-9]* runs' "$log" | awk '{print $2}')
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
        echo "$t: ${secs}s, ${runs:-?} runs, coverage ${cov:-?} edges, no crash"
    else
        echo "$t: FAILED, see $log and fuzz/artifacts/$t/"
        tail -30 "$log"
        status=1
    fi
done
exit $status
