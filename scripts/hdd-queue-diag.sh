#!/usr/bin/env bash
# Diagnostic (issue 20): how deep a queue the EMULATED HDD (`logcache-bench sim-hdd`) sees behind
# logcache, and how many backing syncs logcache sends. One 5 s fio job (4 KiB, nbd engine, Unix
# sockets) through a fresh `logcache serve` in front of a fresh emulated disk; prints fio's IOPS,
# logcache's backing_syncs / write_through_writes / writes (status --json), and the emulator's
# summary line on SIGTERM ("served N IOs, busy ..., at most K queued").
#
# usage: scripts/hdd-queue-diag.sh BIN MODE RW IODEPTH
#   BIN      a logcache binary (logcache-bench beside it runs the disk)
#   MODE     write-back | write-through | write-around
#   RW       fio's --rw: randread (misses: nothing is cached), randwrite, ...
# e.g. scripts/hdd-queue-diag.sh target/release/logcache write-through randwrite 16
# CACHE_DIR puts the cache file elsewhere (default: the scratch dir under /var/tmp).
set -euo pipefail
[ $# = 4 ] || { sed -n 2,14p "$0" >&2; exit 2; }
bin=$1 mode=$2 rw=$3 qd=$4
bench=$(dirname "$bin")/logcache-bench
d=$(mktemp -d /var/tmp/lcqd.XXXXXX)
cdir=${CACHE_DIR:-$d}
cache="$cdir/lcqd-cache-$$.img"
hp="" lp=""
cleanup() {
    for p in $lp $hp; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$d" "$cache" "$cache.ctl"
}
trap cleanup EXIT
wait_uri() { until nbdinfo --size "$1" >/dev/null 2>&1; do sleep 0.05; done; }
"$bench" sim-hdd --file "$d/hdd.img" --size 8G --socket "$d/hdd.sock" >"$d/hdd.log" 2>&1 &
hp=$!
wait_uri "nbd+unix:///?socket=$d/hdd.sock"
truncate -s 4G "$cache"
"$bin" format --cache "$cache" --backing "nbd+unix:///?socket=$d/hdd.sock" >/dev/null
"$bin" serve --cache "$cache" --backing "nbd+unix:///?socket=$d/hdd.sock" --socket "$d/lc.sock" \
    --set cache_mode="$mode" >"$d/lc.log" 2>&1 &
lp=$!
wait_uri "nbd+unix:///?socket=$d/lc.sock"
fio --name=q --ioengine=nbd --uri="nbd+unix:///?socket=$d/lc.sock" --rw="$rw" --bs=4k \
    --iodepth="$qd" --size=8G --randrepeat=0 --time_based --runtime=5 --output-format=json \
    --output="$d/fio.json" >/dev/null
"$bin" status --json --control "$cache.ctl" | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
print({k: j.get(k) for k in ("backing_syncs", "write_through_writes", "writes")})'
kill -TERM "$lp"; wait "$lp" || true; lp=""
kill -TERM "$hp"; wait "$hp" || true; hp=""
/usr/bin/python3 - "$d/fio.json" "$rw" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = j["write"] if "write" in sys.argv[2] else j["read"]
print("fio IOPS", round(side["iops"]))
PY
tail -1 "$d/hdd.log"
