#!/usr/bin/env bash
# Small writes through the NBD server (issue 20's "4 KiB random writes, iodepth 64, ≥ 95% of
# nbdkit null"): logcache in front of an EMULATED 7200 rpm disk (`logcache-bench sim-hdd`, as
# bench/run's seed000), formatted afresh before each of its measurements (so no run inherits
# the dirty data of an earlier one), against `nbdkit null`, alternated ROUNDS times (the order
# rotates each round). fio's nbd engine over Unix sockets, one connection.
#
# Servers (SERVERS; default "logcache nbdkit-null"): logcache (LOGCACHE_BIN), logcache-b
# (LOGCACHE_BIN_B: an A/B of two builds in one run), nbdkit-null. Jobs (JOBS, a grep -E
# pattern; default all): randwrite-4k-qd64 (seed 000's job: norandommap, at most 3 GiB) and
# randwrite-4k-qd1.
#
# For each measurement, one JSON line: IOPS, the server's CPU time per request (utime + stime
# of the process over the job, /proc/PID/stat) and its context switches per request (`perf
# stat -e context-switches -p PID` over the job, all its threads, those of a connection that
# ends included), and fio's own CPU and context switches per request (from its JSON: the
# client's half, which depends on how the server batches its replies); then the medians and
# the median ratios against nbdkit null and, with logcache-b, logcache ÷ logcache-b.
# RESULTS=FILE keeps the JSON lines.
#
# usage: scripts/bench-write-path.sh [ROUNDS=4] [RUNTIME_S=4] [DIR=/var/tmp]
set -euo pipefail
rounds=${1:-4}
runtime=${2:-4}
base=${3:-/var/tmp}
servers=${SERVERS:-logcache nbdkit-null}
job_filter=${JOBS:-.}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
lc_bins "$root"
dir=$(mktemp -d "$base/lcwrite.XXXXXX")
declare -A pid
cleanup() { kill_and_remove "$dir" "${pid[@]}"; }
trap cleanup EXIT

start_sim_hdd "$bench_bin" "$dir/hdd.img" 16G "$dir/hdd.sock" "$dir/hdd.log"
pid[hdd]=$sim_hdd_pid
hdd_uri="nbd+unix:///?socket=$dir/hdd.sock"
nbdkit -f -U "$dir/null.sock" null 16G >"$dir/null.log" 2>&1 &
pid[null]=$!
wait_nbd "nbd+unix:///?socket=$dir/null.sock" "${pid[null]}" "$dir/null.log"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

jobs=()
for entry in \
    "randwrite-4k-qd64:--rw=randwrite --bs=4k --iodepth=64 --norandommap --io_size=3g" \
    "randwrite-4k-qd1:--rw=randwrite --bs=4k --iodepth=1 --norandommap --io_size=3g"; do
    if echo "${entry%%:*}" | grep -Eq "$job_filter"; then jobs+=("$entry"); fi
done

measure() { # $1 server, $2 job name, $3 fio options, $4 round
    local p uri ticks0 ticks1 sw out="$dir/fio.json"
    case $1 in
    logcache | logcache-b)
        local run_bin=$bin
        [ "$1" = logcache-b ] && run_bin=${LOGCACHE_BIN_B:?"give LOGCACHE_BIN_B for logcache-b"}
        # As bench/run's seed000: a 4 GiB cache file with its blocks allocated, formatted anew.
        rm -f "$dir/$1.img" "$dir/$1.sock"
        fallocate -l 4G "$dir/$1.img"
        "$run_bin" format --force --cache "$dir/$1.img" --backing "$hdd_uri" \
            >>"$dir/$1.log" 2>&1
        "$run_bin" serve --cache "$dir/$1.img" --backing "$hdd_uri" --socket "$dir/$1.sock" \
            --control "$dir/$1.ctl" >>"$dir/$1.log" 2>&1 &
        p=$!
        pid[$1]=$p
        uri="nbd+unix:///?socket=$dir/$1.sock"
        wait_nbd "$uri" "$p" "$dir/$1.log"
        ;;
    nbdkit-null)
        p=${pid[null]}
        uri="nbd+unix:///?socket=$dir/null.sock"
        ;;
    *) echo "unknown server $1" >&2; exit 2 ;;
    esac
    # perf counts the threads that start and end during the job too (a connection's thread),
    # which /proc/PID/task/*/status would miss.
    perf stat -x, -e context-switches -p "$p" -o "$dir/perf.csv" 2>/dev/null &
    local perf_pid=$!
    ticks0=$(cpu_ticks "$p")
    # shellcheck disable=SC2086
    fio --name="$2" --ioengine=nbd --uri="$uri" $3 --size=16g --direct=1 --randrepeat=0 \
        --runtime="$runtime" --output-format=json --output="$out" >/dev/null
    ticks1=$(cpu_ticks "$p")
    kill -INT "$perf_pid"
    wait "$perf_pid" 2>/dev/null || true
    sw=$(awk -F, '$3 == "context-switches" {print $1}' "$dir/perf.csv")
    if [[ $1 == logcache* ]]; then
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
        unset "pid[$1]"
    fi
    /usr/bin/python3 - "$out" "$1" "$2" "$4" "$((ticks1 - ticks0))" "$hz" "${sw:-0}" <<'EOF'
import json, sys
path, server, job, rnd, ticks, hz, sw = sys.argv[1:]
fio_job = json.load(open(path))["jobs"][0]
side = fio_job["write"]
ios = max(side["total_ios"], 1)
# fio's own CPU and switches per IO: the client's half of the cost, which a server that answers
# in batches lowers.
fio_cpu_us = (fio_job["usr_cpu"] + fio_job["sys_cpu"]) / 100 * fio_job["job_runtime"] * 1e3
print(json.dumps({"server": server, "job": job, "round": int(rnd), "iops": round(side["iops"]),
                  "server_cpu_us_per_io": round(int(ticks) * 1e6 / int(hz) / ios, 2),
                  "switches_per_io": round(int(sw) / ios, 3),
                  "fio_cpu_us_per_io": round(fio_cpu_us / ios, 2),
                  "fio_switches_per_io": round(fio_job["ctx"] / ios, 3)}))
EOF
}

results="$dir/results.jsonl"
trap '[ -n "${RESULTS:-}" ] && cp "$results" "$RESULTS" 2>/dev/null; cleanup' EXIT
for round in $(seq 1 "$rounds"); do
    for entry in "${jobs[@]}"; do
        # shellcheck disable=SC2086
        for s in $(rotate "$round" $servers); do
            measure "$s" "${entry%%:*}" "${entry#*:}" "$round" | tee -a "$results"
        done
    done
done

echo "load: $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M) UTC"
/usr/bin/python3 - "$results" <<'EOF'
import collections, json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
by = collections.defaultdict(dict)
for r in rows:
    by[(r["job"], r["round"])][r["server"]] = r
def ratios(job, a, b):
    return [v[a]["iops"] / v[b]["iops"] for (j, _), v in sorted(by.items())
            if j == job and a in v and b in v and v[b]["iops"]]
for job in sorted({r["job"] for r in rows}):
    servers = sorted({r["server"] for r in rows if r["job"] == job})
    for s in servers:
        pick = [r for r in rows if r["job"] == job and r["server"] == s]
        print(f"{job} {s}: IOPS median {statistics.median(r['iops'] for r in pick):,.0f}, "
              f"CPU µs/IO {statistics.median(r['server_cpu_us_per_io'] for r in pick):.2f}, "
              f"switches/IO {statistics.median(r['switches_per_io'] for r in pick):.3f}; "
              f"fio CPU µs/IO {statistics.median(r['fio_cpu_us_per_io'] for r in pick):.2f}, "
              f"fio switches/IO {statistics.median(r['fio_switches_per_io'] for r in pick):.3f}")
    for a, b in (("logcache", "nbdkit-null"), ("logcache-b", "nbdkit-null"),
                 ("logcache", "logcache-b")):
        r = ratios(job, a, b)
        if r:
            print(f"{job} {a} ÷ {b}: median {statistics.median(r):.3f} "
                  f"(per round {', '.join(f'{x:.2f}' for x in r)})")
EOF
