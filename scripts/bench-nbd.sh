#!/usr/bin/env bash
# Compares `logcache serve` with nbdkit's null plugin under fio's nbd engine: 4 KiB random
# writes, one connection, iodepth 64 (by default), Unix socket and TCP loopback, runs alternated
# so both see the same machine. logcache runs on real files (a 2 GiB cache in front of an 8 GiB
# backing file, sparse, in a temp dir on the local disk), so the cache absorbs the writes.
#
# usage: scripts/bench-nbd.sh [RUNS] [SECONDS] [IODEPTH] [BACKING_DIR]
# BACKING_DIR (default: beside the cache) lets the backing file live elsewhere, e.g. /dev/shm,
# so writeback's cost on the backing file system (allocating a sparse file) is taken out.
set -euo pipefail
runs=${1:-3}
secs=${2:-10}
depth=${3:-64}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release/logcache
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
dir=$(mktemp -d /var/tmp/lcbench.XXXXXX)
cleanup() {
    # shellcheck disable=SC2086 # npid holds two pids
    kill ${lpid:-} ${npid:-} 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir" "${backing:-}"
}
trap cleanup EXIT
truncate -s 2G "$dir/cache.img"
bdir=${4:-$dir}
backing=$(mktemp -u "$bdir/lcbench-backing.XXXXXX")
truncate -s 8G "$backing"
"$bin" format --cache "$dir/cache.img" --backing "$backing" >/dev/null
lport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
nport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --cache "$dir/cache.img" --backing "$backing" --socket "$dir/lc.sock" \
    --listen "127.0.0.1:$lport" >"$dir/serve.log" 2>&1 &
lpid=$!
nbdkit -f -U "$dir/n.sock" null 8G >/dev/null 2>&1 </dev/null &
npid=$!
nbdkit -f -i 127.0.0.1 -p "$nport" null 8G >/dev/null 2>&1 </dev/null &
npid="$npid $!"
for _ in $(seq 1 100); do [ -S "$dir/lc.sock" ] && [ -S "$dir/n.sock" ] && break; sleep 0.1; done
sleep 0.5
one() { # uri -> iops
    # fio's nbd engine prints a line to stdout, so the JSON goes to a file.
    fio --name=w --ioengine=nbd --uri="$1" --rw=randwrite --bs=4k --iodepth="$depth" --size=1g \
        --time_based --runtime="$secs" --output-format=json --output="$dir/fio.json" >/dev/null 2>&1
    python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["jobs"][0]["write"]["iops"]))' "$dir/fio.json"
}
echo "date: $(date -u +%F) machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "fio nbd engine, 4k randwrite, iodepth $depth, ${secs}s per run"
printf '%-6s %-5s %12s %12s %7s\n' run sock logcache nbdkit-null ratio
for i in $(seq 1 "$runs"); do
    for t in unix tcp; do
        if [ $t = unix ]; then
            lu="nbd+unix:///?socket=$dir/lc.sock"; nu="nbd+unix:///?socket=$dir/n.sock"
        else
            lu="nbd://127.0.0.1:$lport"; nu="nbd://127.0.0.1:$nport"
        fi
        l=$(one "$lu")
        # Writeback after the run must not steal CPU from nbdkit's run: drain first (untimed).
        "$bin" drain --control "$dir/cache.img.ctl" >/dev/null 2>&1
        n=$(one "$nu")
        printf '%-6s %-5s %12s %12s %6.1f%%\n' "$i" $t "$l" "$n" "$(python3 -c "print(100*$l/$n)")"
    done
done
"$bin" status --control "$dir/cache.img.ctl" | sed -n '2,6p'
