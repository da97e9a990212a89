#!/usr/bin/env bash
# Sparse copy (issue 26): `nbdcopy URI null:` of a mostly empty disk, served by logcache and by
# qemu-nbd from the same sparse backing file, alternated ROUNDS times. Both answer block status,
# so nbdcopy reads only the data. Prints one JSON object per copy: wall time, and for logcache
# the bytes the engine read for clients (`read_bytes` in `logcache status --json`).
#
# usage: scripts/bench-sparse-copy.sh [DISK_GIB=16] [DATA_MIB=100] [ROUNDS=3] [DIR=/var/tmp]
# (LOGCACHE_BIN picks the binary.)
set -euo pipefail
gib=${1:-16}
data_mib=${2:-100}
rounds=${3:-3}
base=${4:-/var/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${LOGCACHE_BIN:-$root/target/release/logcache}
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
dir=$(mktemp -d "$base/lcsparse.XXXXXX")
pid=
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
now_ms() { date +%s%3N; }
truncate -s "${gib}G" "$dir/backing.img"
truncate -s 1G "$dir/cache.img"
# DATA_MIB pieces of 1 MiB spread evenly over the disk.
stride_mib=$((gib * 1024 / data_mib))
for i in $(seq 0 $((data_mib - 1))); do
    dd if=/dev/urandom of="$dir/backing.img" bs=1M count=1 seek=$((i * stride_mib)) \
        conv=notrunc status=none
done
"$bin" format --cache "$dir/cache.img" --backing "$dir/backing.img" >/dev/null
sock="$dir/nbd.sock"
uri="nbd+unix:///?socket=$sock"
wait_socket() {
    until [ -S "$sock" ] && nbdinfo --size "$uri" >/dev/null 2>&1; do
        kill -0 "$pid" 2>/dev/null || { cat "$dir/serve.log" >&2; exit 1; }
        sleep 0.05
    done
}
stop() { kill -TERM "$pid"; wait "$pid" || true; pid=; rm -f "$sock"; }
read_bytes() {
    "$bin" status --control "$dir/cache.img.ctl" --json |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["engine"]["read_bytes"] if "engine" in d else d["read_bytes"])'
}
copy() { # $1: server name; prints wall ms
    local t0
    t0=$(now_ms)
    nbdcopy "$uri" null:
    echo $(($(now_ms) - t0))
}
for round in $(seq 1 "$rounds"); do
    "$bin" serve --cache "$dir/cache.img" --backing "$dir/backing.img" --socket "$sock" \
        >>"$dir/serve.log" 2>&1 &
    pid=$!
    wait_socket
    before=$(read_bytes)
    ms=$(copy logcache)
    after=$(read_bytes)
    stop
    echo "{\"server\":\"logcache\",\"round\":$round,\"disk_gib\":$gib,\"data_mib\":$data_mib,\"wall_ms\":$ms,\"read_bytes\":$((after - before))}"
    qemu-nbd --read-only --persistent --format=raw --socket="$sock" "$dir/backing.img" \
        >>"$dir/serve.log" 2>&1 &
    pid=$!
    wait_socket
    ms=$(copy qemu-nbd)
    stop
    echo "{\"server\":\"qemu-nbd\",\"round\":$round,\"disk_gib\":$gib,\"data_mib\":$data_mib,\"wall_ms\":$ms}"
done
