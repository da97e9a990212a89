#!/usr/bin/env bash
# Format and resume time of a big cache full of 4 KiB-random dirty data (issue 5, experiment 2):
# formats a CACHE_GIB cache file (sparse, in DIR) in front of a sparse backing file 4x its size,
# fills it through NBD with fio (4 KiB random writes, iodepth 64) with writeback held off until
# about FILL_PERCENT of the cache is dirty, then measures the restart after a clean stop
# (SIGTERM) and after SIGKILL: wall time from exec until the NBD socket accepts, and the
# engine's own recovery_duration_us. Prints one JSON object per measurement.
#
# usage: scripts/bench-resume.sh [CACHE_GIB=24] [SEGMENT=1M] [DIR=/var/tmp] [FILL_PERCENT=85]
# (LOGCACHE_BIN picks the binary; KEEP=1 keeps the files for further restarts.)
set -euo pipefail
gib=${1:-24}
seg=${2:-1M}
base=${3:-/var/tmp}
fill=${4:-85}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${LOGCACHE_BIN:-$root/target/release/logcache}
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
dir=$(mktemp -d "$base/lcresume.XXXXXX")
pid=
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
    wait 2>/dev/null || true
    if [ -n "${KEEP:-}" ]; then echo "kept $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT
now_ms() { date +%s%3N; }
truncate -s "${gib}G" "$dir/cache.img"
truncate -s "$((gib * 4))G" "$dir/backing.img"
t0=$(now_ms)
"$bin" format --cache "$dir/cache.img" --backing "$dir/backing.img" --segment-size "$seg" >/dev/null
t1=$(now_ms)
echo "{\"what\":\"format\",\"cache_gib\":$gib,\"segment\":\"$seg\",\"wall_ms\":$((t1 - t0))}"
serve() { # starts serve and waits for it to answer; sets pid and wall (ms it took)
    local start
    start=$(now_ms)
    "$bin" serve --cache "$dir/cache.img" --backing "$dir/backing.img" --socket "$dir/nbd.sock" \
        --set writeback_threshold_percent=100 --set writeback_idle_ms=0 >>"$dir/serve.log" 2>&1 &
    pid=$!
    until [ -S "$dir/nbd.sock" ] && "$bin" status --control "$dir/cache.img.ctl" --json >/dev/null 2>&1; do
        kill -0 "$pid" 2>/dev/null || { cat "$dir/serve.log" >&2; exit 1; }
        sleep 0.01
    done
    wall=$(($(now_ms) - start))
}
status() { "$bin" status --control "$dir/cache.img.ctl" --json; }
field() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }
serve
io_bytes=$((gib * 1024 * 1024 * 1024 / 100 * fill))
t0=$(now_ms)
fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$dir/nbd.sock" --rw=randwrite --bs=4k \
    --iodepth=64 --norandommap --randrepeat=0 --io_size="$io_bytes" --size="$((gib * 4 - 1))g" \
    --output-format=json --output="$dir/fill.json" >/dev/null
t1=$(now_ms)
dirty=$(status | field 'd["engine"]["dirty_blocks"] if "engine" in d else d["dirty_blocks"]')
echo "{\"what\":\"fill\",\"seconds\":$(((t1 - t0) / 1000)),\"dirty_blocks\":$dirty}"
measure() { # $1: how it stopped
    local rec d
    serve
    rec=$(status | field 'd["recovery"]["duration_us"] if "recovery" in d else d["recovery_duration_us"]')
    d=$(status | field 'd["engine"]["dirty_blocks"] if "engine" in d else d["dirty_blocks"]')
    echo "{\"what\":\"resume after $1\",\"cache_gib\":$gib,\"segment\":\"$seg\",\"wall_ms\":$wall,\"recovery_us\":$rec,\"dirty_blocks\":$d}"
}
kill -TERM "$pid"; wait "$pid" || true; rm -f "$dir/nbd.sock"
measure "a clean stop (SIGTERM)"
kill -KILL "$pid"; wait "$pid" 2>/dev/null || true
measure "SIGKILL"
kill -TERM "$pid"; wait "$pid" || true
pid=
