#!/usr/bin/env bash
# Where a cached read's tail comes from (issue 20: foreground read p99.9 ≤ 1 ms with writeback
# running). Side by side, alternated ROUNDS times (the order reverses each round), the latency
# percentiles of one foreground job, fio 4 KiB random reads at iodepth 1 over a 64 MiB region
# that logcache holds on its cache device:
#   wb       logcache (write-back, `--set writeback_threshold_percent=0` so writeback runs
#            whenever anything is dirty) while a background job in the same fio run writes
#            4 KiB random writes at iodepth 4 to another 64 MiB region: the flusher writes
#            segments to the cache device and writeback writes to the backing device throughout
#   alone    the same logcache, the foreground job alone
#   device   no logcache, no NBD: fio's io_uring engine, O_DIRECT, 4 KiB random reads at
#            iodepth 1 on a file on the same file system: the device's own tail
# logcache's backing device is an EMULATED 7200 rpm disk (`logcache-bench sim-hdd` over a
# sparse file, an emulation). Prints one JSON line per measurement and a table of medians.
#
# usage: scripts/bench-read-tail.sh [ROUNDS=3] [RUNTIME_S=5] [DIR=/var/tmp]
# (LOGCACHE_BIN picks the binary.)
set -euo pipefail
rounds=${1:-3}
runtime=${2:-5}
base=${3:-/var/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
bin=${LOGCACHE_BIN:-$root/target/release/logcache}
bench_bin=$(dirname "$bin")/logcache-bench
[ -x "$bin" ] && [ -x "$bench_bin" ] ||
    (cd "$root" && cargo build --release -q -p logcache -p logcache-bench)
dir=$(mktemp -d "$base/lcreadtail.XXXXXX")
pids=()
cleanup() { kill_and_remove "$dir" "${pids[@]}"; }
trap cleanup EXIT
start_sim_hdd "$bench_bin" "$dir/hdd.img" 8G "$dir/hdd.sock" "$dir/hdd.log"
pids+=("$sim_hdd_pid")
hdd="nbd+unix:///?socket=$dir/hdd.sock"
truncate -s 4G "$dir/cache.img"
"$bin" format --cache "$dir/cache.img" --backing "$hdd" >/dev/null
"$bin" serve --cache "$dir/cache.img" --backing "$hdd" --socket "$dir/lc.sock" \
    --set writeback_threshold_percent=0 >"$dir/lc.log" 2>&1 &
pids+=($!)
uri="nbd+unix:///?socket=$dir/lc.sock"
wait_nbd "$uri" "$!" "$dir"/*.log
region=64M
# The foreground's region, written once and drained: every read is a hit on the cache device.
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=$region \
    --output-format=terse >/dev/null
"$bin" drain --control "$dir/cache.img.ctl" >/dev/null 2>&1
fio --name=fill --ioengine=io_uring --direct=1 --filename="$dir/device.img" --rw=write \
    --bs=1M --iodepth=8 --size=512M --output-format=terse >/dev/null

common=(--rw=randread --bs=4k --iodepth=1 --time_based --runtime="$runtime" --norandommap
    --randrepeat=0 --percentile_list=50:99:99.9 --output-format=json)
measure() { # $1 case, $2 round
    local out="$dir/fio-$1-$2.json"
    case $1 in
    wb) fio --name=fg --ioengine=nbd --uri="$uri" --size=$region "${common[@]}" --output="$out" \
        --name=bg --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=4 \
        --offset=$region --size=$region --time_based --runtime="$runtime" >/dev/null ;;
    alone) fio --name=fg --ioengine=nbd --uri="$uri" --size=$region "${common[@]}" \
        --output="$out" >/dev/null ;;
    device) fio --name=fg --ioengine=io_uring --direct=1 --filename="$dir/device.img" \
        --size=512M "${common[@]}" --output="$out" >/dev/null ;;
    esac
    /usr/bin/python3 - "$out" "$1" "$2" <<'EOF'
import json, sys
path, case, rnd = sys.argv[1:]
jobs = json.load(open(path))["jobs"]
fg = next(j for j in jobs if j["jobname"] == "fg")["read"]
p = fg["clat_ns"]["percentile"]
bg = [j["write"]["iops"] for j in jobs if j["jobname"] == "bg"]
print(json.dumps({"case": case, "round": int(rnd), "reads": fg["total_ios"],
                  "iops": round(fg["iops"]), "p50_us": round(p["50.000000"] / 1000),
                  "p99_us": round(p["99.000000"] / 1000),
                  "p99_9_us": round(p["99.900000"] / 1000),
                  "bg_write_iops": round(bg[0]) if bg else None}))
EOF
}
results="$dir/results.jsonl"
cases="wb alone device"
for round in $(seq 1 "$rounds"); do
    order=$cases
    if [ $((round % 2)) = 0 ]; then order=$(echo "$cases" | tr ' ' '\n' | tac | tr '\n' ' '); fi
    for c in $order; do measure "$c" "$round" | tee -a "$results"; done
done
/usr/bin/python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| case | rounds | reads | p50 µs | p99 µs | p99.9 µs (median; per round) | bg write IOPS |")
print("|---|---:|---:|---:|---:|---|---:|")
for case in dict.fromkeys(r["case"] for r in rows):
    rs = [r for r in rows if r["case"] == case]
    med = lambda k: statistics.median(r[k] for r in rs)
    per = " ".join(f"{r['p99_9_us']:,}" for r in sorted(rs, key=lambda r: r["round"]))
    bg = [r["bg_write_iops"] for r in rs if r["bg_write_iops"] is not None]
    print(f"| {case} | {len(rs)} | {sum(r['reads'] for r in rs):,} | {med('p50_us'):,.0f} | "
          f"{med('p99_us'):,.0f} | **{med('p99_9_us'):,.0f}** ({per}) | "
          f"{statistics.median(bg):,.0f} |" if bg else
          f"| {case} | {len(rs)} | {sum(r['reads'] for r in rs):,} | {med('p50_us'):,.0f} | "
          f"{med('p99_us'):,.0f} | **{med('p99_9_us'):,.0f}** ({per}) | – |")
EOF
