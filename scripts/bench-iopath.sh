#!/usr/bin/env bash
# The IO path (issue 20): logcache against nbdkit's file plugin (cache=none) serving a file on
# the same file system as logcache's cache file, side by side, alternated ROUNDS times (the
# order reverses each round). fio's nbd engine over Unix sockets, one connection per job.
#
# Servers (SERVERS, space-separated; default all four):
#   logcache        serve --io-engine io_uring (the default engine where the kernel allows it)
#   logcache-sync   serve --io-engine sync (pread), its own cache and backing files
#   logcache-dirty  the same as logcache, its data left dirty (as under LOGCACHE_DIRTY=1) while
#                   the others follow LOGCACHE_DIRTY: clean and dirty reads of one build in
#                   one alternation, against the same reference rounds
#   nbdkit-file     nbdkit file cache=none: the issue's reference. NOTE: nbdkit 1.32's
#                   cache=none reads through the page cache (buffered pread, then a
#                   POSIX_FADV_DONTNEED that leaves most pages resident: fincore showed 458 of
#                   512 MiB resident after its read jobs), so its reads are partly RAM speed
#                   (strace of 1.32.5: the file is opened without O_DIRECT; each read is a
#                   pread64 followed by fadvise64(POSIX_FADV_DONTNEED) of the same range, each
#                   write a pwrite64 then sync_file_range(SYNC_FILE_RANGE_WRITE))
#   nbdkit-file-cold the same, on its own file, with the page cache dropped (`echo 3 >
#                   /proc/sys/vm/drop_caches`, needs root) right before each of its
#                   measurements: its reads start from the disk, not from pages left resident
#                   (each row records `resident_mib`, the file's pages in RAM before the job).
#                   The drop is the whole page cache's: nbdkit-file's file too, so a
#                   nbdkit-file round right after a nbdkit-file-cold one reads from the disk
#                   (0 MiB resident, 170-851 MB/s at 0.9-2.8 ms of CPU per request, against
#                   ~1,500 MB/s and 0.47 ms with 484-488 of 512 MiB resident: PROBE=1 run of
#                   2026-11-27 12:08 UTC). bench/run's iopath serves both from one file, so
#                   there the cold contender's own reads leave it resident again.
#   qemu-nbd-direct qemu-nbd --cache=none --aio=io_uring (O_DIRECT): the cache device's own
#                   speed through the same protocol, as logcache reads it
#   device          no server: fio's io_uring engine, O_DIRECT, on a file of its own on the
#                   same file system, the same job: the device's ceiling (no protocol, no copy)
# and, for the jobs against the slow device (not in the default; each has its own EMULATED
# 7200 rpm disk, `logcache-bench sim-hdd` over a sparse 8 GiB file, an emulation):
#   hdd             the emulated HDD alone: the reference of the two HDD jobs
#   logcache-hdd    logcache (write-back) in front of it; nothing is written, so every read
#                   of the randread-miss job is a miss to the disk
#   logcache-wt     logcache with --set cache_mode=write-through in front of it
#   nbdkit-null     nbdkit null (8 GiB, stores nothing): the protocol ceiling, the reference of
#                   the randwrite-4k-qd64 job (seed 000's fio job, as bench/run's seed000 runs it
#                   against logcache in front of the emulated HDD; here without a fresh format
#                   per measurement, so keep ROUNDS × RUNTIME_S short of filling the 4 GiB cache)
#   logcache-b, logcache-dirty-b, logcache-hdd-b, logcache-wt-b  the same with the binary LOGCACHE_BIN_B (an A/B of two
#                   builds in one alternated run, e.g. the NBD backing client before a change;
#                   LOGCACHE_B_SET="KEY=VALUE ..." serves logcache-b and logcache-dirty-b with
#                   those tunables, e.g. the same binary with ram_cache_mib=0)
#
# The data (DATA_MIB, written sequentially through each server) is in place first; logcache's
# is then drained (clean, on the cache device: every read is a hit there; LOGCACHE_DIRTY=1
# leaves it dirty, with writeback kept from starting). Jobs (JOBS, a grep -E pattern on the names; default all): 1 MiB
# sequential read iodepth 8 and 1, 4 KiB random read iodepth 32 and 1, 1 MiB sequential write
# iodepth 8; with the HDD servers, 4 KiB random read misses iodepth 32 (hdd, logcache-hdd)
# and 4 KiB random writes iodepth 16 (hdd, logcache-wt), over the disk's 8 GiB; and 4 KiB
# random writes iodepth 64, norandommap (logcache-hdd, logcache-hdd-b, nbdkit-null: seed 000's
# job). For each: bandwidth or IOPS, and the server's CPU time per request (utime+stime
# of the server process over the job, from /proc/PID/stat, divided by fio's IOs; beside it,
# after a "+", fio's own CPU per request, from its usr_cpu and sys_cpu). Prints one JSON line
# per measurement, then tables of the median ratios against each reference.
#
# FILL="randwrite 4k" writes the data in random order in 4 KiB pieces instead (each server; the
# log then holds it scattered, so a 1 MiB read of it is many runs: what batched submission is
# for).
#
# e.g. SERVERS="hdd logcache-hdd logcache-wt" scripts/bench-iopath.sh 3 8
#
# PROBE=1 counts, per request, over each measurement: the server's task switches and system
# calls (`perf stat` on the server process, its threads and those it starts; `device` has none),
# and the reads the disk under DIR completed and the KiB they read (/sys/class/block/DEV/stat
# of the whole disk: anyone else's reads in the same seconds count too). Each JSON line gets
# `probe`: {"dev_reads": .., "dev_kib": .., "switches": .., "futex": .., ...}, all per request,
# and a table of them follows the ratios. With RUNTIME_S of 2 or more, also the server threads'
# time on a CPU, time waiting on a run queue (a thread woken and not yet running) and
# timeslices per request, from /proc/PID/task/*/schedstat sampled 1 s into the run and 0.3 s
# before its end (requests in that window: fio's IOPS times its length).
#
# PIN_SERVER / PIN_FIO (CPU lists, e.g. 0 and 0, or 1 and 0) pin every server's threads
# (`taskset -a`, set once it answers, so the threads it starts later inherit it) and fio
# (`--cpus_allowed`): at iodepth 1 on this VM the placement decides the figure. With the
# server and fio on two vCPUs each round trip wakes a halted vCPU twice (an IPI each way,
# ~6x the round trip of both on one CPU: 2026-11-27 15:17 UTC, both logcache and nbdkit), and
# on an idle machine the scheduler keeps each task on its own idle vCPU. Unpinned at iodepth 1,
# a ratio measures where the scheduler put each contender as much as the contenders (0.76 of
# nbdkit file on a quiet machine, 4.31 at load 5-6, the same code: docs/BENCHMARKS.md,
# "Placement at iodepth 1"). bench/run's iopath judges its iodepth-1 goal with PIN_SERVER=1
# PIN_FIO=0 for every contender, and shows both-on-0 and unpinned beside it.
#
# CACHE_GIB (default 4) sizes logcache's cache files: a smaller one when the shared disk is short
# of room (the write job's log wraps, so each logcache server's cache file fills).
#
# usage: scripts/bench-iopath.sh [ROUNDS=3] [RUNTIME_S=8] [DATA_MIB=1024] [DIR=/var/tmp]
# (LOGCACHE_BIN picks the binary; LOGCACHE_BIN_B the -b servers'.)
set -euo pipefail
rounds=${1:-3}
runtime=${2:-8}
data_mib=${3:-1024}
base=${4:-/var/tmp}
servers=${SERVERS:-logcache logcache-sync nbdkit-file qemu-nbd-direct}
job_filter=${JOBS:-.}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
bin=${LOGCACHE_BIN:-$root/target/release/logcache}
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
bench_bin=$(dirname "$bin")/logcache-bench
hdd_gib=8
dir=$(mktemp -d "$base/lciopath.XXXXXX")
declare -A pid uri
cleanup() { kill_and_remove "$dir" "${pid[@]}"; }
trap cleanup EXIT
start_hdd() { # $1 name: an emulated HDD of its own; prints its URI
    local sock="$dir/$1-hdd.sock"
    start_sim_hdd "$bench_bin" "$dir/$1-hdd.img" "${hdd_gib}G" "$sock" "$dir/$1-hdd.log"
    pid[$1-hdd]=$sim_hdd_pid
    echo "nbd+unix:///?socket=$sock"
}
is_dirty() { [[ $1 == logcache-dirty* ]] || [ "${LOGCACHE_DIRTY:-0}" = 1 ]; }
start() { # $1 server name
    local s=$1 sock="$dir/$1.sock"
    case $s in
    hdd)
        [ -x "$bench_bin" ] || (cd "$root" && cargo build --release -q -p logcache-bench)
        start_hdd "$s" >/dev/null
        pid[$s]=${pid[$s-hdd]}
        unset "pid[$s-hdd]"
        uri[$s]="nbd+unix:///?socket=$dir/$s-hdd.sock"
        return
        ;;
    logcache-hdd | logcache-wt | logcache-hdd-b | logcache-wt-b)
        [ -x "$bench_bin" ] || (cd "$root" && cargo build --release -q -p logcache-bench)
        local backing mode=write-back run_bin=$bin
        [[ $s == logcache-wt* ]] && mode=write-through
        if [[ $s == *-b ]]; then
            run_bin=${LOGCACHE_BIN_B:?"give LOGCACHE_BIN_B for the -b servers"}
        fi
        start_hdd "$s" >/dev/null
        backing="nbd+unix:///?socket=$dir/$s-hdd.sock"
        truncate -s 4G "$dir/$s-cache.img"
        "$run_bin" format --cache "$dir/$s-cache.img" --backing "$backing" >/dev/null
        "$run_bin" serve --cache "$dir/$s-cache.img" --backing "$backing" --socket "$sock" \
            --set cache_mode="$mode" >"$dir/$s.log" 2>&1 &
        ;;
    logcache | logcache-sync | logcache-b | logcache-dirty | logcache-dirty-b)
        local engine=io_uring run_bin=$bin
        [ "$s" = logcache-sync ] && engine=sync
        if [[ $s == *-b ]]; then
            run_bin=${LOGCACHE_BIN_B:?"give LOGCACHE_BIN_B for the -b servers"}
        fi
        truncate -s 8G "$dir/$s-backing.img"
        truncate -s "${CACHE_GIB:-4}G" "$dir/$s-cache.img"
        # Dirty: writeback never starts (no dirty-share trigger, no idle trigger), as in
        # bench/run's iopath section. With the default 1 s idle trigger, a server idle while the
        # others filled and measured wrote its data back during its own read turns (and was
        # then clean): the same binary listed first read 0.79 of itself listed second.
        local sets=()
        if is_dirty "$s"; then
            sets=(--set writeback_threshold_percent=100 --set writeback_idle_ms=0)
        fi
        # LOGCACHE_B_SET: tunables (KEY=VALUE, space-separated) for the -b servers only, e.g.
        # the same binary with ram_cache_mib=0 (an A/B of a tunable in one alternated run).
        if [[ $s == *-b ]]; then
            for kv in ${LOGCACHE_B_SET:-}; do sets+=(--set "$kv"); done
        fi
        "$run_bin" format --cache "$dir/$s-cache.img" --backing "$dir/$s-backing.img" >/dev/null
        "$run_bin" serve --cache "$dir/$s-cache.img" --backing "$dir/$s-backing.img" \
            --socket "$sock" --io-engine "$engine" "${sets[@]}" >"$dir/$s.log" 2>&1 &
        ;;
    nbdkit-null)
        nbdkit -f -U "$sock" null "${hdd_gib}G" >"$dir/$s.log" 2>&1 &
        ;;
    nbdkit-file)
        truncate -s 4G "$dir/$s.img"
        nbdkit -f -U "$sock" file file="$dir/$s.img" cache=none >"$dir/$s.log" 2>&1 &
        ;;
    nbdkit-file-cold)
        truncate -s 4G "$dir/$s.img"
        nbdkit -f -U "$sock" file file="$dir/$s.img" cache=none >"$dir/$s.log" 2>&1 &
        ;;
    device)
        # fio on the file itself: no process to wait for; its URI is the file's path.
        truncate -s 4G "$dir/$s.img"
        uri[$s]="$dir/$s.img"
        return
        ;;
    qemu-nbd-direct)
        truncate -s 4G "$dir/$s.img"
        qemu-nbd -f raw -k "$sock" -t -e 4 --cache=none --aio=io_uring "$dir/$s.img" \
            >"$dir/$s.log" 2>&1 &
        ;;
    *) echo "unknown server $s" >&2; exit 2 ;;
    esac
    pid[$s]=$!
    uri[$s]="nbd+unix:///?socket=$sock"
    wait_nbd "${uri[$s]}" "${pid[$s]}" "$dir"/*.log
    if [ -n "${PIN_SERVER:-}" ]; then taskset -a -p -c "$PIN_SERVER" "${pid[$s]}" >/dev/null; fi
}
for s in $servers; do start "$s"; done

fio_run() { # $1 uri (or, for `device`, a file's path), $2 name, rest: fio options; prints
    # the fio JSON file's path
    local out="$dir/fio-$2.json" target
    if [[ $1 == /* ]]; then
        target=(--ioengine=io_uring --direct=1 --filename="$1")
    else
        target=(--ioengine=nbd --uri="$1")
    fi
    if [ -n "${PIN_FIO:-}" ]; then target+=(--cpus_allowed="$PIN_FIO"); fi
    fio --name="$2" "${target[@]}" --output-format=json --output="$out" "${@:3}" >/dev/null
    echo "$out"
}
resident_mib() { # $1 server: its file's pages in the page cache, MiB (nbdkit's only)
    case $1 in
    nbdkit-file*) fincore --bytes --noheadings --output RES "$dir/$1.img" |
        awk '{printf "%d", $1 / 1048576}' ;;
    *) echo null ;;
    esac
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The disk under $dir, for PROBE=1 (its reads completed and sectors read: fields 1 and 3).
# None on /dev/shm (tmpfs): then the probe's disk columns read 0.
disk_stat=/sys/class/block/$(basename "$(df --output=source "$dir" | tail -1)")/stat
[ -r "$disk_stat" ] || disk_stat=/dev/null
disk_read() { if [ "$disk_stat" = /dev/null ]; then echo 0 0 0; else cat "$disk_stat"; fi; }
# Every thread's schedstat (ns on a CPU, ns waiting on a run queue, timeslices), one per line
# after its TID.
# One process (grep), so a sample takes milliseconds even on a loaded machine.
sched_sample() {
    grep -H . /proc/"$1"/task/*/schedstat 2>/dev/null |
        sed -E 's#^/proc/[0-9]+/task/([0-9]+)/schedstat:#\1 #'
}
probe_events=context-switches,syscalls:sys_enter_futex,syscalls:sys_enter_recvfrom
probe_events+=,syscalls:sys_enter_recvmsg,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg
probe_events+=,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_pread64
probe_events+=,syscalls:sys_enter_preadv,syscalls:sys_enter_fadvise64,syscalls:sys_enter_sched_yield

is_hdd() { [[ $1 == hdd || $1 == logcache-hdd* || $1 == logcache-wt* || $1 == nbdkit-null ]]; }
# The data, sequentially, through each server (not the HDD ones: their jobs need none).
for s in $servers; do
    is_hdd "$s" && continue
    read -r fill_rw fill_bs <<<"${FILL:-write 1M}"
    fio_run "${uri[$s]}" fill --rw="$fill_rw" --bs="$fill_bs" --iodepth=8 --size="${data_mib}M" \
        --norandommap=0 >/dev/null
    if [[ $s == logcache* ]] && ! is_dirty "$s"; then
        "$bin" drain --control "$dir/$s-cache.img.ctl" >/dev/null 2>&1
    fi
    # WARM_RAM=1 (default): logcache's data read once in 4 KiB random reads (three times the
    # data: fio's random offsets repeat, ~95% covered), as bench/run's iopath does, so its RAM
    # cache (ram_cache_mib) holds it before the first round, as nbdkit's file starts resident.
    # Without it the first 4 KiB rounds fill it while measured. (Reads over 64 KiB store their
    # blocks only on a run's second touch: the 1 MiB jobs' first round fills it for the rest.)
    if [[ $s == logcache* ]] && [ "${WARM_RAM:-1}" = 1 ]; then
        fio_run "${uri[$s]}" warm-ram --rw=randread --bs=4k --iodepth=32 --size="${data_mib}M" \
            --io_size="$((3 * data_mib))M" >/dev/null
    fi
done

# name: fio options (over the data's range; the write job writes the data again).
jobs=()
for entry in \
    "seqread-1m-qd8:--rw=read --bs=1M --iodepth=8" \
    "seqread-1m-qd1:--rw=read --bs=1M --iodepth=1" \
    "randread-4k-qd32:--rw=randread --bs=4k --iodepth=32" \
    "randread-4k-qd1:--rw=randread --bs=4k --iodepth=1" \
    "seqwrite-1m-qd8:--rw=write --bs=1M --iodepth=8" \
    "randread-miss-4k-qd32:--rw=randread --bs=4k --iodepth=32" \
    "randwrite-wt-4k-qd16:--rw=randwrite --bs=4k --iodepth=16" \
    "randwrite-4k-qd64:--rw=randwrite --bs=4k --iodepth=64 --norandommap"; do
    if echo "${entry%%:*}" | grep -Eq "$job_filter"; then jobs+=("$entry"); fi
done
hz=$(getconf CLK_TCK)
runs_on() { # $1 server, $2 job: whether the job is measured on that server
    case $2 in
    randread-miss-*) [[ $1 == hdd || $1 == logcache-hdd* ]] ;;
    randwrite-wt-*) [[ $1 == hdd || $1 == logcache-wt* ]] ;;
    randwrite-4k-qd64) [[ $1 == logcache-hdd* || $1 == nbdkit-null ]] ;;
    *) ! is_hdd "$1" ;;
    esac
}
measure() { # $1 server, $2 job name, $3 fio options, $4 round
    local before after out p=${pid[$1]:-} size="${data_mib}M" seed=""
    # The HDD jobs: new offsets every run (fio repeats its random sequence by default, even
    # with another --randseed here, and logcache keeps what a miss read: 2,453 of 4,627 reads
    # of three runs were hits), so a read is a miss unless it meets one of the few thousand
    # blocks read before out of the disk's two million.
    is_hdd "$1" && size="${hdd_gib}G" seed="--randrepeat=0"
    if [[ $1 == *-cold ]]; then
        sync
        echo 3 >/proc/sys/vm/drop_caches
    fi
    # The page-cache reference as it runs: its file read through nbdkit first, as bench/run's
    # iopath does (9895cfe). Without it, anyone's drop_caches (a nbdkit-file-cold contender in
    # another run) or memory pressure leaves it reading the disk: 8-85 of 512 MiB resident and
    # ~21K IOPS at iodepth 32 in a run of 2026-11-27 15:28 UTC, against ~97K warm. WARM_NBDKIT=0
    # measures it as found.
    if [ "$1" = nbdkit-file ] && [ "${WARM_NBDKIT:-1}" = 1 ]; then
        fio_run "${uri[$1]}" warm-nbdkit --rw=read --bs=1M --iodepth=8 --size="${data_mib}M" \
            >/dev/null
    fi
    local resident
    resident=$(resident_mib "$1")
    local perf_out="$dir/perf-$2-$1.csv" perf_pid="" disk_before="0 0 0" disk_after="0 0 0"
    rm -f "$perf_out"
    if [ "${PROBE:-0}" = 1 ]; then
        if [ -n "$p" ]; then
            # Inherited by the threads the server starts for the connection (perf stat's
            # default), so a connection's workers are counted though they start after this.
            perf stat -x, -e "$probe_events" -p "$p" -o "$perf_out" 2>/dev/null &
            perf_pid=$!
            sleep 0.3
        fi
        disk_before=$(disk_read)
    fi
    before=$( [ -n "$p" ] && cpu_ticks "$p" || echo 0)
    local sched_a="$dir/sched-a" sched_b="$dir/sched-b" window_s=0
    rm -f "$sched_a" "$sched_b"
    if [ "${PROBE:-0}" = 1 ] && [ -n "$p" ] && [ "$runtime" -ge 2 ]; then
        # The server threads' schedstat over the run's middle (a connection's threads end
        # with it, so they are sampled while fio runs): from 1 s in (fio connected, the workers
        # started) to 0.3 s before the end.
        local start t0 t1
        start=$(date +%s.%N)
        # shellcheck disable=SC2086
        fio_run "${uri[$1]}" "$2-$1" $3 $seed --size="$size" --time_based \
            --runtime="$runtime" >"$dir/fio-path" &
        local fio_pid=$!
        sleep 1
        sched_sample "$p" >"$sched_a"
        t0=$(date +%s.%N)
        # Until 0.3 s before the run's end (fio takes ~0.35 s to start, so the end is later).
        sleep "$(echo "$start + $runtime - 0.3 - $(date +%s.%N)" | bc)"
        t1=$(date +%s.%N)
        sched_sample "$p" >"$sched_b"
        window_s=$(echo "$t1 - $t0" | bc)
        wait "$fio_pid"
        out=$(cat "$dir/fio-path")
    else
        # shellcheck disable=SC2086
        out=$(fio_run "${uri[$1]}" "$2-$1" $3 $seed --size="$size" --time_based --runtime="$runtime")
    fi
    after=$( [ -n "$p" ] && cpu_ticks "$p" || echo 0)
    if [ "${PROBE:-0}" = 1 ]; then
        disk_after=$(disk_read)
        if [ -n "$perf_pid" ]; then
            kill -INT "$perf_pid"
            wait "$perf_pid" || true
        fi
    fi
    local state=clean
    is_dirty "$1" && [[ $1 == logcache* ]] && state=dirty
    /usr/bin/python3 - "$out" "$1" "$2" "$4" "$((after - before))" "$hz" "$state" "$resident" \
        "${PROBE:-0}" "$perf_out" "$disk_before" "$disk_after" "$sched_a" "$sched_b" \
        "$window_s" <<'EOF'
import json, os, sys
path, server, job, rnd, ticks, hz, state, resident = sys.argv[1:9]
probe, perf_out, disk_before, disk_after, sched_a, sched_b, window_s = sys.argv[9:]
j = json.load(open(path))["jobs"][0]
side = j["write"] if "write" in job else j["read"]
ios = side["total_ios"]
cpu_us = int(ticks) * 1e6 / int(hz)
# `device` has no server process: no server CPU.
cpu = None if server == "device" else round(cpu_us / max(ios, 1), 2)
# fio's own CPU (usr_cpu and sys_cpu: % of one CPU over the job's runtime) per request: the
# client's side of the protocol (its receive copy), which the server's figures leave out.
client_cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] * 1000 / max(ios, 1)
row = {"server": server, "job": job, "round": int(rnd), "state": state,
       "iops": round(side["iops"]), "mb_s": round(side["bw_bytes"] / 1e6, 1),
       "ios": ios, "server_cpu_us_per_io": cpu, "client_cpu_us_per_io": round(client_cpu, 2),
       "resident_mib": json.loads(resident)}
if probe == "1":
    n = max(ios, 1)
    b, a = [int(x) for x in disk_before.split()], [int(x) for x in disk_after.split()]
    got = {"dev_reads": round((a[0] - b[0]) / n, 2),
           "dev_kib": round((a[2] - b[2]) * 512 / 1024 / n, 1)}
    if os.path.exists(perf_out):
        for line in open(perf_out):
            f = line.strip().split(",")
            if len(f) > 2 and f[0].replace(".", "").isdigit():
                name = f[2].split(":")[-1].replace("sys_enter_", "")
                name = "switches" if name == "context-switches" else name
                got[name] = round(float(f[0]) / n, 2)
    if os.path.exists(sched_b) and float(window_s) > 0:
        def threads(f):
            return {l.split()[0]: [int(x) for x in l.split()[1:4]]
                    for l in open(f) if len(l.split()) == 4}
        a, b = threads(sched_a), threads(sched_b)
        # Requests in the window: fio's rate over the whole run times the window.
        n_window = max(side["iops"] * float(window_s), 1)
        both = [t for t in b if t in a]
        for i, name in enumerate(("on_cpu_us", "runq_wait_us", "timeslices")):
            total = sum(b[t][i] - a[t][i] for t in both)
            got[name] = round(total / n_window / (1 if i == 2 else 1e3), 2)
    row["probe"] = got
print(json.dumps(row))
EOF
}
results="$dir/results.jsonl"
for round in $(seq 1 "$rounds"); do
    for entry in "${jobs[@]}"; do
        name=${entry%%:*}
        opts=${entry#*:}
        order=$servers
        if [ $((round % 2)) = 0 ]; then order=$(echo "$servers" | tr ' ' '\n' | tac | tr '\n' ' '); fi
        for s in $order; do
            runs_on "$s" "$name" || continue
            measure "$s" "$name" "$opts" "$round" | tee -a "$results"
        done
    done
done
/usr/bin/python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
jobs = list(dict.fromkeys(r["job"] for r in rows))
servers = list(dict.fromkeys(r["server"] for r in rows))
def pick(job, server, key):
    return [r[key] for r in sorted(rows, key=lambda r: r["round"])
            if r["job"] == job and r["server"] == server]
print()
print("| job | " + " | ".join(servers) + " | server+fio CPU µs/IO (" + " / ".join(servers) + ") |")
print("|---|" + "---:|" * (len(servers) + 1))
for job in jobs:
    key = "mb_s" if job.startswith("seq") else "iops"
    unit = "MB/s" if key == "mb_s" else "IOPS"
    med = lambda v, f: f.format(statistics.median(v)) if v else "–"
    cells = [med(pick(job, s, key), "{:,.0f} " + unit) for s in servers]
    cpu = [med([c for c in pick(job, s, "server_cpu_us_per_io") if c is not None], "{:.1f}")
           + "+" + med([c for c in pick(job, s, "client_cpu_us_per_io") if c is not None],
                       "{:.1f}")
           for s in servers]
    print(f"| {job} | " + " | ".join(cells) + " | " + " / ".join(cpu) + " |")
probed = [r for r in rows if r.get("probe")]
if probed:
    keys = list(dict.fromkeys(k for r in probed for k in r["probe"]))
    print()
    print("per request (median over rounds): disk reads and KiB read (the whole disk), the "
          "server's task switches and system calls")
    print("| job | server | " + " | ".join(keys) + " |")
    print("|---|---|" + "---:|" * len(keys))
    for job in jobs:
        for s in servers:
            got = [r["probe"] for r in probed if r["job"] == job and r["server"] == s]
            if not got:
                continue
            cells = [f"{statistics.median([g[k] for g in got if k in g]):,.2f}"
                     if any(k in g for g in got) else "–" for k in keys]
            print(f"| {job} | {s} | " + " | ".join(cells) + " |")
for ref in ("nbdkit-file", "nbdkit-file-cold", "qemu-nbd-direct", "device", "hdd", "nbdkit-null"):
    if ref not in servers:
        continue
    others = [s for s in servers if s.startswith("logcache")]
    if not others:
        continue
    print()
    print(f"ratios to {ref} (median, per-round range):")
    print("| job | " + " | ".join(others) + " |")
    print("|---|" + "---:|" * len(others))
    for job in jobs:
        key = "mb_s" if job.startswith("seq") else "iops"
        cells = []
        for s in others:
            r = [a / b for a, b in zip(pick(job, s, key), pick(job, ref, key)) if b]
            if not r:
                cells.append("–")
                continue
            cells.append(f"**{statistics.median(r):.2f}** ({min(r):.2f}–{max(r):.2f})")
        print(f"| {job} | " + " | ".join(cells) + " |")
EOF
