#!/usr/bin/env bash
# The IO path (issue 20): logcache against nbdkit's file plugin (cache=none) serving a file on
# the same file system as logcache's cache file, side by side, alternated ROUNDS times (the
# order flips each round). fio's nbd engine over Unix sockets, one connection per job.
#
# The data (DATA_MIB, written sequentially through each server) is in place first; logcache's
# is then drained (clean, on the cache device: every read is a hit there; `dirty` rounds skip
# the drain). Jobs: 1 MiB sequential read iodepth 8, 4 KiB random read iodepth 32 and 1, 1 MiB
# sequential write iodepth 8. For each: bandwidth or IOPS, and the server's CPU time per request
# (utime+stime of the server process over the job, from /proc/PID/stat, divided by fio's IOs).
# Prints one JSON line per measurement, then a table of the median ratios.
#
# usage: scripts/bench-iopath.sh [ROUNDS=3] [RUNTIME_S=8] [DATA_MIB=1024] [DIR=/var/tmp]
# (LOGCACHE_BIN picks the binary; LOGCACHE_DIRTY=1 leaves logcache's data dirty.)
set -euo pipefail
rounds=${1:-3}
runtime=${2:-8}
data_mib=${3:-1024}
base=${4:-/var/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${LOGCACHE_BIN:-$root/target/release/logcache}
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
dir=$(mktemp -d "$base/lciopath.XXXXXX")
lc_pid=
kit_pid=
cleanup() {
    [ -n "$lc_pid" ] && kill -9 "$lc_pid" 2>/dev/null || true
    [ -n "$kit_pid" ] && kill -9 "$kit_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
truncate -s 8G "$dir/backing.img"
truncate -s 4G "$dir/cache.img"
truncate -s 4G "$dir/file.img"
"$bin" format --cache "$dir/cache.img" --backing "$dir/backing.img" >/dev/null
lc_sock="$dir/lc.sock"
kit_sock="$dir/kit.sock"
lc_uri="nbd+unix:///?socket=$lc_sock"
kit_uri="nbd+unix:///?socket=$kit_sock"
wait_socket() { # $1 uri, $2 pid
    until nbdinfo --size "$1" >/dev/null 2>&1; do
        kill -0 "$2" 2>/dev/null || { cat "$dir"/*.log >&2; exit 1; }
        sleep 0.05
    done
}
"$bin" serve --cache "$dir/cache.img" --backing "$dir/backing.img" --socket "$lc_sock" \
    >"$dir/serve.log" 2>&1 &
lc_pid=$!
nbdkit -f -U "$kit_sock" file file="$dir/file.img" cache=none >"$dir/nbdkit.log" 2>&1 &
kit_pid=$!
wait_socket "$lc_uri" "$lc_pid"
wait_socket "$kit_uri" "$kit_pid"

fio_run() { # $1 uri, $2 name, rest: fio options; prints the fio JSON file's path
    local out="$dir/fio-$2.json"
    fio --name="$2" --ioengine=nbd --uri="$1" --output-format=json --output="$out" \
        "${@:3}" >/dev/null
    echo "$out"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# The data, sequentially, through each server.
for uri in "$lc_uri" "$kit_uri"; do
    fio_run "$uri" fill --rw=write --bs=1M --iodepth=8 --size="${data_mib}M" >/dev/null
done
if [ "${LOGCACHE_DIRTY:-0}" != 1 ]; then
    "$bin" drain --control "$dir/cache.img.ctl" >/dev/null
fi
state=$([ "${LOGCACHE_DIRTY:-0}" = 1 ] && echo dirty || echo clean)

# name: fio options (over the data's range; the write job writes the data again).
jobs=(
    "seqread-1m-qd8:--rw=read --bs=1M --iodepth=8"
    "randread-4k-qd32:--rw=randread --bs=4k --iodepth=32"
    "randread-4k-qd1:--rw=randread --bs=4k --iodepth=1"
    "seqwrite-1m-qd8:--rw=write --bs=1M --iodepth=8"
)
hz=$(getconf CLK_TCK)
measure() { # $1 server, $2 uri, $3 pid, $4 job name, $5 fio options, $6 round
    local before after out
    before=$(cpu_ticks "$3")
    # shellcheck disable=SC2086
    out=$(fio_run "$2" "$4-$1" $5 --size="${data_mib}M" --time_based --runtime="$runtime")
    after=$(cpu_ticks "$3")
    /usr/bin/python3 - "$out" "$1" "$4" "$6" "$((after - before))" "$hz" "$state" <<'EOF'
import json, sys
path, server, job, rnd, ticks, hz, state = sys.argv[1:]
j = json.load(open(path))["jobs"][0]
side = j["write"] if "write" in job else j["read"]
ios = side["total_ios"]
cpu_us = int(ticks) * 1e6 / int(hz)
print(json.dumps({"server": server, "job": job, "round": int(rnd), "state": state,
                  "iops": round(side["iops"]), "mb_s": round(side["bw_bytes"] / 1e6, 1),
                  "ios": ios, "server_cpu_us_per_io": round(cpu_us / max(ios, 1), 2)}))
EOF
}
results="$dir/results.jsonl"
for round in $(seq 1 "$rounds"); do
    for entry in "${jobs[@]}"; do
        name=${entry%%:*}
        opts=${entry#*:}
        if [ $((round % 2)) = 1 ]; then order="logcache nbdkit-file"; else order="nbdkit-file logcache"; fi
        for server in $order; do
            if [ "$server" = logcache ]; then
                measure logcache "$lc_uri" "$lc_pid" "$name" "$opts" "$round"
            else
                measure nbdkit-file "$kit_uri" "$kit_pid" "$name" "$opts" "$round"
            fi | tee -a "$results"
        done
    done
done
/usr/bin/python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
jobs = list(dict.fromkeys(r["job"] for r in rows))
print()
print("| job | logcache | nbdkit file | ratio (median, per-round range) | server CPU µs/IO logcache / nbdkit |")
print("|---|---:|---:|---:|---:|")
for job in jobs:
    def pick(server, key):
        return [r[key] for r in rows if r["job"] == job and r["server"] == server]
    key = "mb_s" if job.startswith("seq") else "iops"
    unit = "MB/s" if key == "mb_s" else "IOPS"
    lc, kit = pick("logcache", key), pick("nbdkit-file", key)
    ratios = [a / b for a, b in zip(lc, kit) if b]
    cpu_lc = statistics.median(pick("logcache", "server_cpu_us_per_io"))
    cpu_kit = statistics.median(pick("nbdkit-file", "server_cpu_us_per_io"))
    print(f"| {job} | {statistics.median(lc):,.0f} {unit} | {statistics.median(kit):,.0f} {unit} "
          f"| **{statistics.median(ratios):.2f}** ({min(ratios):.2f}–{max(ratios):.2f}) "
          f"| {cpu_lc:.1f} / {cpu_kit:.1f} |")
EOF
