#!/usr/bin/env bash
# Load soak (issue 6, item 6): JOBS fio jobs (one NBD connection each) x DEPTH requests in flight
# of mixed 4 KiB-1 MiB random reads and writes against `logcache serve` (a CACHE cache file in
# front of a backing file 4x its size, both in DIR and preallocated as real devices would be)
# for SECONDS, after WARMUP_S seconds (default 30) of the same load that are not measured: a
# server's first seconds under load include one-time costs, and a freshly formatted cache takes
# a few passes of its log to settle: the first wrap finds the whole log dirty, so relocation is
# at its dearest (see docs/RELIABILITY.md, "Load").
# The warm-up's longest request is printed too. Checks, over the measured SECONDS:
#   - fio finishes without an IO error;
#   - the server's resident memory stays flat (the highest sample of the second half at most
#     16 MiB + 10% above the highest of the first half), in runs of 60 s or more;
#   - the statistics add up: the engine's read/write counters and bytes moved by exactly what
#     fio says it did;
#   - no request took longer than MAX_LAT_MS (default 1000; 0 skips this check). `make test`
#     bounds it at 15000: on a 2-core machine shared by client and server, 4096 requests in
#     flight make latency queueing (README, "Tests"); the bound catches a stall, not slowness.
# Prints one JSON summary line; exits non-zero on any violation.
#
# FIO_ARGS="..." adds fio options to both runs (to test a hypothesis about the client).
#
# CPUS=client (the default on a machine with 2 or more CPUs) keeps the client on CPUs of its own
# (`taskset`: fio on the first half of them) and lets the server use all of them, as if the
# client ran on another machine: otherwise 64 fio processes setting up their buffers at the start
# and reporting at the end take every CPU from the server they measure (docs/RELIABILITY.md,
# "Load"). CPUS=split also confines the server to the second half; CPUS=shared confines nobody.
#
# usage: [WARMUP_S=30] [MAX_LAT_MS=1000] [TUNABLES=...] [LAT_LOG=DIR] [FIO_ARGS=...] [CPUS=client|split|shared] scripts/soak-load.sh [SECONDS=600] [JOBS=64] [DEPTH=64]
#        [CACHE=2G] [DIR=/var/tmp]
set -euo pipefail
secs=${1:-600}
jobs=${2:-64}
depth=${3:-64}
cache_size=${4:-2G}
base=${5:-/var/tmp}
max_lat_ms=${MAX_LAT_MS:-1000}
ncpu=$(nproc)
cpus=${CPUS:-client}
client_cpu=()
server_cpu=()
case "$cpus" in
client | split | shared) ;;
*)
    echo "CPUS must be client, split or shared, not '$cpus'" >&2
    exit 2
    ;;
esac
half=$((ncpu / 2))
if [ "$ncpu" -ge 2 ] && [ "$cpus" != shared ]; then
    client_cpu=(taskset -c "0-$((half - 1))")
fi
if [ "$ncpu" -ge 2 ] && [ "$cpus" = split ]; then
    server_cpu=(taskset -c "$half-$((ncpu - 1))")
fi
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${LOGCACHE_BIN:-$root/target/release/logcache}
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
dir=$(mktemp -d "$base/lcload.XXXXXX")
pid=
sampler=
cleanup() {
    [ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
truncate -s "$cache_size" "$dir/cache.img"
cache_bytes=$(stat -c %s "$dir/cache.img")
truncate -s $((cache_bytes * 4)) "$dir/backing.img"
# Sparse files would make the first write to every block a file-system allocation (on tmpfs in
# this VM, 62% of serve's CPU for the first pass over the cache); a device has no such phase.
# Where the file system cannot preallocate, the files stay sparse.
fallocate -l "$cache_bytes" "$dir/cache.img" 2>/dev/null || true
fallocate -l $((cache_bytes * 4)) "$dir/backing.img" 2>/dev/null || true
warmup_s=${WARMUP_S:-30}
"$bin" format --cache "$dir/cache.img" --backing "$dir/backing.img" >/dev/null
"${server_cpu[@]}" "$bin" serve --cache "$dir/cache.img" --backing "$dir/backing.img" --socket "$dir/nbd.sock" \
    >"$dir/serve.log" 2>&1 &
pid=$!
until [ -S "$dir/nbd.sock" ] && "$bin" status --control "$dir/cache.img.ctl" --json >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { cat "$dir/serve.log" >&2; exit 1; }
    sleep 0.05
done
# The export is the backing file minus logcache's 4 KiB label; fio works on the first 3/4.
span=$((cache_bytes * 3 / 1048576))m
# LAT_LOG=DIR keeps, for the measured run, each job's longest request per 100 ms
# (DIR/lat_clat.N.log: ms, ns, direction, size) and a status sample per second (DIR/status.jsonl),
# to find when the longest requests happened and what the engine was doing.
lat_log_args=()
load() { # SECONDS OUTPUT
    "${client_cpu[@]}" fio "${lat_log_args[@]}" ${FIO_ARGS:-} --name=load --ioengine=nbd --uri="nbd+unix:///?socket=$dir/nbd.sock" --rw=randrw --norandommap \
        --rwmixread=50 --bssplit=4k/50:16k/20:64k/15:256k/10:1m/5 --iodepth="$depth" \
        --numjobs="$jobs" --size="$span" --time_based --runtime="$1" --group_reporting=0 \
        --percentile_list=50:99:99.9 --output-format=json --output="$2" >"$dir/fio.out" 2>&1 || {
        cat "$dir/fio.out" >&2
        echo "fio failed" >&2
        exit 1
    }
}
# TUNABLES="KEY=VALUE ..." are set on the server before the warm-up (to compare policies).
[ -n "${TUNABLES:-}" ] && "$bin" set --control "$dir/cache.img.ctl" $TUNABLES >/dev/null
echo '{"jobs": []}' >"$dir/warmup.json"
[ "$warmup_s" -gt 0 ] && load "$warmup_s" "$dir/warmup.json"
"$bin" status --control "$dir/cache.img.ctl" --json >"$dir/before.json"
(while kill -0 "$pid" 2>/dev/null; do
    awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true
    sleep 1
done >"$dir/rss.txt") &
sampler=$!
status_sampler=
if [ -n "${LAT_LOG:-}" ]; then
    mkdir -p "$LAT_LOG"
    lat_log_args=(--write_lat_log="$LAT_LOG/lat" --log_avg_msec=100 --log_max_value=1)
    (while kill -0 "$pid" 2>/dev/null; do
        "$bin" status --control "$dir/cache.img.ctl" --json 2>/dev/null || true
        sleep 1
    done >"$LAT_LOG/status.jsonl") &
    status_sampler=$!
fi
load "$secs" "$dir/fio.json"
[ -n "$status_sampler" ] && kill "$status_sampler" 2>/dev/null || true
"$bin" status --control "$dir/cache.img.ctl" --json >"$dir/after.json"
kill "$sampler" 2>/dev/null || true
sampler=
kill -TERM "$pid"
wait "$pid" || { cat "$dir/serve.log" >&2; echo "serve did not stop cleanly" >&2; exit 1; }
pid=
python3 - "$dir" "$max_lat_ms" "$secs" "$jobs" "$depth" "$cpus" <<'EOF'
import json, sys
d, max_lat_ms, secs, jobs, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
cpus = sys.argv[6]
fio = json.load(open(f"{d}/fio.json"))
before, after = json.load(open(f"{d}/before.json")), json.load(open(f"{d}/after.json"))
rss = [int(x) for x in open(f"{d}/rss.txt").read().split()]
tot = {"read": [0, 0], "write": [0, 0]}
errors, lat_max_ns = 0, 0
# Where the time goes: each job's mean and p99.9 completion latency (a starved connection shows
# as a job whose mean is far above the others').
job_mean_ms, p999_ms, p50_ms = [], [], []
for j in fio["jobs"]:
    errors += j["error"]
    ios, lat_sum = 0, 0.0
    for k in ("read", "write"):
        tot[k][0] += j[k]["total_ios"]
        tot[k][1] += j[k]["io_bytes"]
        clat = j[k]["clat_ns"]
        lat_max_ns = max(lat_max_ns, clat["max"])
        ios += j[k]["total_ios"]
        lat_sum += clat["mean"] * j[k]["total_ios"]
        pct = clat.get("percentile", {})
        if "99.900000" in pct:
            p999_ms.append(pct["99.900000"] / 1e6)
        if "50.000000" in pct:
            p50_ms.append(pct["50.000000"] / 1e6)
    if ios:
        job_mean_ms.append(lat_sum / ios / 1e6)
warmup_max_ns = max((j[k]["clat_ns"]["max"] for j in json.load(open(f"{d}/warmup.json"))["jobs"]
                     for k in ("read", "write")), default=0)
def delta(name):
    return after[name] - before[name]
problems = []
if errors:
    problems.append(f"fio reported {errors} errors")
for k, ios, byts in (("read", "reads", "read_bytes"), ("write", "writes", "write_bytes")):
    if delta(ios) != tot[k][0] or delta(byts) != tot[k][1]:
        problems.append(f"{k}s do not add up: fio {tot[k][0]} ios / {tot[k][1]} bytes, "
                        f"logcache {delta(ios)} / {delta(byts)}")
half = len(rss) // 2
first, second = max(rss[:half] or [0]), max(rss[half:] or [0])
# Under a minute the growth is the server's one-time setup (each connection's buffers reaching
# its largest request so far; a CI run once grew 332 -> 405 MiB in 8 s), not a leak.
memory_checked = secs >= 60 and half >= 2
if memory_checked and second > first * 1.10 + 16 * 1024:
    problems.append(f"memory grew: {first} KiB in the first half, {second} KiB in the second")
if max_lat_ms and lat_max_ns > max_lat_ms * 1e6:
    problems.append(f"a request took {lat_max_ns / 1e6:.0f} ms (limit {max_lat_ms} ms)")
print(json.dumps({
    "seconds": secs, "connections": jobs, "iodepth": depth, "cpus": cpus,
    "reads": tot["read"][0], "writes": tot["write"][0],
    "read_mib": round(tot["read"][1] / 2**20), "write_mib": round(tot["write"][1] / 2**20),
    "max_latency_ms": round(lat_max_ns / 1e6, 1),
    "warmup_max_latency_ms": round(warmup_max_ns / 1e6, 1),
    "job_mean_latency_ms_min": round(min(job_mean_ms or [0]), 1),
    "job_mean_latency_ms_max": round(max(job_mean_ms or [0]), 1),
    "job_p50_latency_ms_max": round(max(p50_ms or [0]), 1),
    "job_p999_latency_ms_max": round(max(p999_ms or [0]), 1),
    "write_waits": delta("write_waits") if "write_waits" in after else None,
    "rss_kib_first_half_max": first, "rss_kib_second_half_max": second,
    "memory_checked": memory_checked,
    "problems": problems,
}))
sys.exit(1 if problems else 0)
EOF
