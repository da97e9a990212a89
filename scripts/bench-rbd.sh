#!/usr/bin/env bash
# 4 KiB random writes at one iodepth on a one-node Ceph cluster (scripts/ceph-up.sh), three ways,
# runs alternated so all see the same machine:
#   rbd-alone    fio's rbd engine, librbd's cache off: the raw reference
#   librbd-cache fio's rbd engine, librbd's write-back cache on (writethrough-until-flush off):
#                the peer (Ceph's PWL cache is not built into Debian's librbd)
#   logcache     fio's nbd engine on `logcache serve --backing rbd:rbd/lc` (native RBD backing),
#                a 4 GiB cache file on the local disk, drained before each run
# Each image has its 512 MiB test region written once first (RBD's first write to an object
# allocates it), and fio writes only there. Prints one line per run, then the medians.
#
# usage: scripts/bench-rbd.sh [RUNS] [SECONDS] [IODEPTH]
set -euo pipefail
runs=${1:-3}
secs=${2:-15}
depth=${3:-32}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
bin=$root/target/release/logcache
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
dir=$(mktemp -d /var/tmp/lcrbd.XXXXXX)
cleanup() {
    [ -n "${lpid:-}" ] && kill "$lpid" 2>/dev/null && wait "$lpid" 2>/dev/null
    "$root/scripts/ceph-down.sh" "$dir/ceph" || true
    rm -rf "$dir"
}
trap cleanup EXIT

conf=$("$root/scripts/ceph-up.sh" "$dir/ceph" 2>/dev/null | tail -n 1)
rbd_images "$conf" 2G raw peer lc
rbd_client_conf "$conf" "$dir/nocache.conf" 'rbd cache = false'
rbd_client_conf "$conf" "$dir/wbcache.conf" $'rbd cache = true\nrbd cache writethrough until flush = false'

truncate -s 4G "$dir/cache.img"
spec="rbd:rbd/lc?conf=$conf"
"$bin" format --cache "$dir/cache.img" --backing "$spec" >/dev/null
"$bin" serve --cache "$dir/cache.img" --backing "$spec" --socket "$dir/lc.sock" \
    >"$dir/serve.log" 2>&1 &
lpid=$!
wait_socket_file "$dir/lc.sock" "$dir/serve.log"

common=(--name=w --rw=randwrite --bs=4k "--iodepth=$depth" --size=512m --runtime="$secs"
    --time_based --randrepeat=0 --output-format=json)
summary() { # fio JSON on stdin -> "IOPS p99_us p99.9_us"
    /usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()
j = json.loads(text[text.index("{"):])["jobs"][0]["write"]  # fio may print a warning first
p = j["clat_ns"]["percentile"]
print("%.0f %.0f %.0f" % (j["iops"], p["99.000000"] / 1000, p["99.900000"] / 1000))'
}
run_one() { # NAME -> one result line
    case $1 in
    rbd-alone) CEPH_CONF=$dir/nocache.conf fio "${common[@]}" --ioengine=rbd --pool=rbd \
        --rbdname=raw --clientname=admin ;;
    librbd-cache) CEPH_CONF=$dir/wbcache.conf fio "${common[@]}" --ioengine=rbd --pool=rbd \
        --rbdname=peer --clientname=admin ;;
    logcache)
        "$bin" drain --control "$dir/cache.img.ctl" >/dev/null 2>&1
        fio "${common[@]}" --ioengine=nbd --uri="nbd+unix:///?socket=$dir/lc.sock" ;;
    esac | summary
}

echo "# $(date -u +%FT%TZ) runs=$runs secs=$secs iodepth=$depth load=$(cut -d' ' -f1-3 /proc/loadavg)"
echo "# run config iops p99_us p99.9_us"
for r in $(seq 1 "$runs"); do
    for c in rbd-alone librbd-cache logcache; do
        echo "$r $c $(run_one $c)" | tee -a "$dir/results"
    done
done
echo "# medians: config iops p99_us p99.9_us"
for c in rbd-alone librbd-cache logcache; do
    awk -v c="$c" '$2 == c { print $3, $4, $5 }' "$dir/results" | sort -n | awk -v c="$c" \
        '{ a[NR] = $0 } END { print c, a[int((NR + 1) / 2)] }'
done
echo "# logcache at the end: $("$bin" status --control "$dir/cache.img.ctl" | grep -i dirty | head -n 2 | tr '\n' ' ')"
