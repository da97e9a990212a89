#!/usr/bin/env bash
# Where a slow foreground read's time goes (issue 20: foreground read p99.9 ≤ 1 ms with
# writeback running), traced per request with bpftrace: the `wb` case of
# scripts/bench-read-tail.sh (fio 4 KiB random reads at iodepth 1 over 64 MiB, beside 4 KiB
# random writes at iodepth 4 on another region; logcache write-back, writeback threshold 0%,
# over an EMULATED HDD on /dev/shm; cache file in DIR) with trace-read-tail.bt attached, then
# trace-read-tail.py: the foreground's device reads by what else was in flight at their issue
# (writeback's reads, the flusher's segment writes, other processes' IO), and the slow
# requests' stages (device, the server thread's or the client's wake-ups, lock waits).
# The tracing costs CPU (every block request and foreground request is printed): read the
# shares, not the absolute tail. Needs bpftrace (apt-get install bpftrace) and root.
#
# Also prints the CPU time (utime + stime) each of the server's threads, by name, used over
# the traced window (/proc/PID/task/*/stat: the background threads' share of the two vCPUs).
# WRITEBACK=held holds writeback off for the job (writeback_threshold_percent=100): the same
# background writer and flusher without writeback's IO, as bench-read-tail.sh's `held` case.
# WRITEBACK=drain: no background writer; DRAIN_MIB (1024) of 1 MiB writes made dirty with
# writeback held off, then written back by `logcache drain` at full speed during the job (as
# bench-read-tail.sh's `drain` case).
#
# usage: scripts/trace-read-tail.sh [RUNTIME_S=8] [DIR=/var/tmp]   (LOGCACHE_BIN picks the binary)
set -euo pipefail
runtime=${1:-8}
base=${2:-/var/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
lc_bins "$root"
command -v bpftrace >/dev/null || { echo "trace-read-tail: bpftrace is not installed" >&2; exit 1; }
tracer_workdirs lcreadtrace "$base"
start_sim_hdd "$bench_bin" "$hdd_dir/hdd.img" 8G "$dir/hdd.sock" "$dir/hdd.log"
pids+=("$sim_hdd_pid")
lc_serve_fresh "$bin" "$dir" lc "nbd+unix:///?socket=$dir/hdd.sock" \
    --set writeback_threshold_percent=0
pids+=("$lc_lc")
uri="nbd+unix:///?socket=$dir/lc.sock"
wait_nbd "$uri" "$lc_lc" "$dir/lc.log"
fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --size=64M \
    --output-format=terse >/dev/null
"$bin" drain --control "$dir/lc.ctl" >/dev/null 2>&1
mode=${WRITEBACK:-running}
bg_job=(--name=bg --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=4 --offset=64M
    --size=64M --time_based --runtime="$((runtime + 3))")
jobs=2
case $mode in
running) ;;
held) "$bin" set --control "$dir/lc.ctl" writeback_threshold_percent=100 >/dev/null ;;
drain)
    "$bin" set --control "$dir/lc.ctl" writeback_threshold_percent=100 >/dev/null
    fio --name=dirty --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=8 --offset=128M \
        --size="${DRAIN_MIB:-1024}M" --output-format=terse >/dev/null
    "$bin" drain --control "$dir/lc.ctl" >/dev/null 2>&1 &
    pids+=($!)
    bg_job=()
    jobs=1
    ;;
*) echo "trace-read-tail: WRITEBACK is running, held or drain" >&2; exit 1 ;;
esac
fio --name=fg --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=1 --time_based \
    --runtime="$((runtime + 3))" --norandommap --randrepeat=0 --size=64M \
    "${bg_job[@]}" --output="$dir/fio.json" --output-format=json >/dev/null &
fio_pid=$!
fg=""
while [ -z "$fg" ]; do # fio's job processes: the first is fg
    sleep 0.1
    kids=($(pgrep -P "$fio_pid" | sort -n)) || true
    [ ${#kids[@]} -ge "$jobs" ] && fg=${kids[0]}
done
sleep 1
# Per thread name: summed utime + stime in clock ticks (comm is field 2, in parentheses).
thread_ticks() {
    for f in /proc/"$lc_lc"/task/*/stat; do cat "$f" 2>/dev/null || true; done |
        sed -E 's/^[0-9]+ \((.*)\) /\1\t/' |
        awk -F'\t' '{split($2, a, " "); t[$1] += a[12] + a[13]}
            END {for (n in t) print n "\t" t[n]}'
}
thread_ticks >"$dir/cpu0.txt"
timeout "$runtime" bpftrace "$root/scripts/trace-read-tail.bt" "$lc_lc" "$fg" "$dev" \
    >"$dir/trace.txt" 2>"$dir/bpftrace.err" || true
thread_ticks >"$dir/cpu1.txt"
wait "$fio_pid"
echo "traced ${runtime} s at load $(cut -d' ' -f1 /proc/loadavg) ($(date -u +%H:%M:%S) UTC)," \
    "writeback $mode"
echo "server CPU over the window, ms per thread name (threads that ended meanwhile not counted):"
hz=$(getconf CLK_TCK)
awk -F'\t' -v hz="$hz" 'NR == FNR {t0[$1] = $2; next}
    {d = $2 - t0[$1]; if (d > 0) printf "  %-18s %7.0f\n", $1, d * 1000 / hz}' \
    "$dir/cpu0.txt" "$dir/cpu1.txt" | sort -k2 -n -r
/usr/bin/python3 "$root/scripts/trace-read-tail.py" "$dir/trace.txt"
