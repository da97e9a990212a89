#!/usr/bin/env bash
# Where a slow foreground read of the `latency` experiment's job goes (issue 20's goal row:
# foreground read p99.9 with writeback running), traced per request with bpftrace. The job is
# bench/experiments/latency.py's: fio's nbd engine, a foreground 4 KiB randrw 50/50 at iodepth 1
# over the first 64 MiB (written once first, so the cache holds it), and BG background jobs of
# 4 KiB randrw 50/50 at iodepth 4, each on its own 64 MiB region after it (not cached). logcache
# write-back, writeback threshold 0% (writeback runs throughout; WRITEBACK=held: 100%, writeback
# idle), a fresh 4 GiB cache file (fallocated) in DIR, over an EMULATED HDD on /dev/shm.
# trace-latency-tail.bt prints every foreground request and every block request on the cache's
# device; trace-latency-tail.py splits the reads into RAM-cache hits and cache-device reads,
# gives the slow ones' stages (wake-ups, pread, device, run-queue and lock waits), what was in
# flight on the device when each foreground device read was issued, and the tasks the reader
# waited behind. The tracing costs CPU: read the shares, not the absolute tail. Run the whole
# script under `nice -n -20` to weigh other processes less. Needs bpftrace and root.
# (scripts/trace-read-tail.sh traces bench-read-tail.sh's randread job the same way.)
#
# usage: scripts/trace-latency-tail.sh [BG=0] [RUNTIME_S=10] [DIR=/var/tmp] [THRESHOLD_US]
#        (LOGCACHE_BIN picks the binary; THRESHOLD_US: the slow reads' bound, default p99.9)
set -euo pipefail
bg=${1:-0}
runtime=${2:-10}
base=${3:-/var/tmp}
threshold=${4:-}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
lc_bins "$root"
command -v bpftrace >/dev/null || { echo "trace-latency-tail: bpftrace is not installed" >&2; exit 1; }
case ${WRITEBACK:-running} in
running) threshold_percent=0 ;;
held) threshold_percent=100 ;;
*) echo "trace-latency-tail: WRITEBACK is running or held" >&2; exit 1 ;;
esac
tracer_workdirs lclattrace "$base"
start_sim_hdd "$bench_bin" "$hdd_dir/hdd.img" 16G "$dir/hdd.sock" "$dir/hdd.log"
pids+=("$sim_hdd_pid")
backing="nbd+unix:///?socket=$dir/hdd.sock"
fallocate -l 4G "$dir/lc.img"
"$bin" format --force --cache "$dir/lc.img" --backing "$backing" >/dev/null
"$bin" serve --cache "$dir/lc.img" --backing "$backing" --socket "$dir/lc.sock" \
    --control "$dir/lc.ctl" --set cache_mode=write-back \
    --set writeback_threshold_percent="$threshold_percent" >>"$dir/lc.log" 2>&1 &
lc=$!
pids+=("$lc")
uri="nbd+unix:///?socket=$dir/lc.sock"
wait_nbd "$uri" "$lc" "$dir/lc.log"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=16 --size=64M \
    --output-format=terse >/dev/null
# The foreground job first, in a fio process of its own, so that its connection's reader is
# the server's only `nbd-conn-N` thread when it is looked up; then the background jobs in a
# second one (`latency` runs both in one fio process: the same jobs and connections).
fio --ioengine=nbd --uri="$uri" --direct=1 --norandommap --randrepeat=0 --time_based \
    --runtime="$((runtime + 3))" --bs=4k --output-format=json --output="$dir/fio.json" \
    --name=fg --rw=randrw --rwmixread=50 --iodepth=1 --size=64M --offset=0 >/dev/null &
fio_pid=$!
pids+=("$fio_pid")
fg=""
reader=""
for _ in $(seq 1 100); do
    sleep 0.1
    fg=$(pgrep -P "$fio_pid" | head -1) || true
    reader=$(ps -L -p "$lc" -o tid=,comm= | awk '$2 ~ /^nbd-conn-[0-9]+$/ {print $1}' | head -1)
    if [ -n "$fg" ] && [ -n "$reader" ]; then break; fi
done
[ -n "$fg" ] && [ -n "$reader" ] || { echo "trace-latency-tail: the foreground job never connected" >&2; exit 1; }
if [ "$bg" -gt 0 ]; then
    fio --ioengine=nbd --uri="$uri" --direct=1 --norandommap --randrepeat=0 --time_based \
        --runtime="$((runtime + 2))" --bs=4k --output-format=terse \
        --name=bg --rw=randrw --rwmixread=50 --iodepth=4 --numjobs="$bg" --size=64M \
        --offset=64M --offset_increment=64M >/dev/null &
    pids+=("$!")
fi
sleep 1
written_back() {
    "$bin" status --control "$dir/lc.ctl" --json |
        /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin).get("writeback_blocks", 0))'
}
wb0=$(written_back)
timeout "$runtime" bpftrace "$root/scripts/trace-latency-tail.bt" "$lc" "$fg" "$dev" "$reader" \
    >"$dir/trace.txt" 2>"$dir/bpftrace.err" || true
wb1=$(written_back)
wait "$fio_pid"
[ "$bg" -eq 0 ] || wait "${pids[-1]}"
echo "traced ${runtime} s at load $(cut -d' ' -f1 /proc/loadavg) ($(date -u +%H:%M:%S) UTC)," \
    "$bg background jobs, writeback ${WRITEBACK:-running}: $((wb1 - wb0)) blocks written back"
/usr/bin/python3 "$root/scripts/trace-latency-tail.py" "$dir/trace.txt" $threshold
