#!/usr/bin/env bash
# Where a cached read's tail comes from (issue 20: foreground read p99.9 ≤ 1 ms with writeback
# running). Side by side, alternated ROUNDS times (round N starts at the N-th case), the latency
# percentiles of one foreground job, fio 4 KiB random reads at iodepth 1 over a 64 MiB region,
# each case's own copy of it on the same file system (DIR). Cases (CASES, space-separated;
# default all but the -b ones), from the bare device up to logcache under load:
#   device   no server, no NBD: fio's io_uring engine, O_DIRECT, on a file: the device's tail
#   device-wb  the same while a second job in the same fio run writes 1 MiB sequential writes,
#            O_DIRECT, iodepth 1, at DEVICE_WB_MIBPS MiB/s (default 64: about what the flusher
#            writes in the wb case) to a file of its own: the device's tail under a write stream
#            like the flusher's, with no logcache at all
#   qemu     qemu-nbd --cache=none --aio=io_uring (O_DIRECT) on a file, fio's nbd engine: the
#            device through the same protocol, read the way logcache reads its cache file
#   nbdkit   nbdkit file cache=none on a file: the issue's reference. nbdkit 1.32 reads through
#            the page cache (see scripts/bench-iopath.sh), so the file's pages are dropped
#            (POSIX_FADV_DONTNEED on that file only) right before each measurement; each row
#            records `resident_mib`, its pages in RAM after the job
#   alone    logcache (write-back, `--set writeback_threshold_percent=0`), the foreground alone,
#            nothing dirty (drained first): every read is a hit on the cache device
#   wb       the same logcache while a background job in the same fio run writes 4 KiB random
#            writes at iodepth 4 to another 64 MiB region: the flusher writes segments to the
#            cache device and writeback reads them back and writes the backing device
#            throughout (drained first, so every round starts alike); WB_BG_MIBPS caps the
#            background writer (fio --rate, MiB/s; default no cap: it then takes as much CPU as
#            it gets, and the foreground waits for a CPU behind it on a small machine)
#   held     the wb job with writeback held off (`logcache set writeback_threshold_percent=100`
#            for the job, 0 again after it): the background writer and the flusher's segment
#            writes without writeback's reads of the cache device and writes to the backing
#            device, so `wb` against `held` is writeback's own share of the tail, `held` against
#            `alone` the background writer's and the flusher's
#   idle     the alone job with writeback held off (threshold 100% for the job): with
#            FG_RW=randrw the foreground's own writes stay dirty, so `alone` against `idle` is
#            what writeback running on them adds (the report's `latency` rows write-back-wb
#            against write-back with no background jobs)
#   drain    writeback at full speed and no background writer: DRAIN_MIB (default 1024) of
#            1 MiB sequential writes from byte 128 MiB on, writeback held off, then the
#            foreground job while `logcache drain` writes them back (~100 MiB/s to the emulated
#            HDD: writeback reads the cache device throughout; the drain is waited for before
#            the next case)
#   alone-b, wb-b, held-b, idle-b, drain-b  the same with the binary LOGCACHE_BIN_B (its own cache and
#            backing): an A/B of two builds in one alternated run (HDD_DIR_B puts their
#            emulated HDD's file elsewhere: e.g. the same build, HDD_DIR_B=/var/tmp, shows what
#            the emulation's own file IO on the cache's device costs)
# logcache's backing device is an EMULATED 7200 rpm disk (`logcache-bench sim-hdd`, an
# emulation) over a sparse file in HDD_DIR (default /dev/shm: a real backing disk is another
# device, so the emulation's own file IO and syncs must not queue on the cache's device;
# HDD_DIR=/var/tmp puts it on the cache's device, as this script did before 2026-11-26).
# FG_RW=randrw makes the foreground job the report's (`latency`, seed 004's): 4 KiB random
# reads and writes 50/50 at iodepth 1 (its writes dirty the region, so writeback has work in
# the `alone` case); the rows still give its reads' latency. Default randread.
# Latency is fio's total latency (`lat`: submission to completion; `clat` leaves out the
# submission, and an io_uring read that completes inside io_uring_enter showed a clat of 1 µs).
# Each logcache row records `writeback_blocks`, the blocks written back during its job, and
# `read_misses`, foreground reads the cache did not hold (status; 0 unless the log wrapped over
# the region within one job: each logcache job writes its region again first).
# Prints one JSON line per measurement and a table of medians with each round's p99.9 and
# reads over 1 ms per 10,000 (fio's latency buckets: steadier than a p99.9 on a loaded machine).
#
# usage: scripts/bench-read-tail.sh [ROUNDS=3] [RUNTIME_S=5] [DIR=/var/tmp]
# (LOGCACHE_BIN picks the binary; LOGCACHE_BIN_B the -b cases'.)
set -euo pipefail
rounds=${1:-3}
runtime=${2:-5}
base=${3:-/var/tmp}
cases=${CASES:-device device-wb qemu nbdkit alone wb}
hdd_base=${HDD_DIR:-/dev/shm}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
lc_bins "$root"
dir=$(mktemp -d "$base/lcreadtail.XXXXXX")
hdd_dir=$(mktemp -d "$hdd_base/lcreadtail-hdd.XXXXXX")
hdd_dir_b=$(mktemp -d "${HDD_DIR_B:-$hdd_base}/lcreadtail-hdd.XXXXXX")
pids=()
cleanup() {
    kill_and_remove "$dir" "${pids[@]}"
    rm -rf "$hdd_dir" "$hdd_dir_b"
}
trap cleanup EXIT
region=64M
declare -A uri lc_bin
# A logcache server NAME with binary BIN over its own emulated HDD; its region written once.
start_logcache() {
    local name=$1 run_bin=$2 hdd hdir=$hdd_dir
    [ "$name" = lcb ] && hdir=$hdd_dir_b
    start_sim_hdd "$bench_bin" "$hdir/$name-hdd.img" 8G "$dir/$name-hdd.sock" \
        "$dir/$name-hdd.log"
    pids+=("$sim_hdd_pid")
    hdd="nbd+unix:///?socket=$dir/$name-hdd.sock"
    lc_serve_fresh "$run_bin" "$dir" "$name" "$hdd" --set writeback_threshold_percent=0
    pids+=("$(eval echo "\$lc_$name")")
    uri[$name]="nbd+unix:///?socket=$dir/$name.sock"
    lc_bin[$name]=$run_bin
    wait_nbd "${uri[$name]}" "${pids[-1]}" "$dir/$name.log"
    fio --name=fill --ioengine=nbd --uri="${uri[$name]}" --rw=write --bs=1M --iodepth=8 \
        --size=$region --output-format=terse >/dev/null
}
needs() { [[ " $cases " == *" $1 "* ]]; }
if needs alone || needs wb || needs held || needs idle || needs drain; then
    start_logcache lc "$bin"
fi
if needs alone-b || needs wb-b || needs held-b || needs idle-b || needs drain-b; then
    start_logcache lcb "${LOGCACHE_BIN_B:?give LOGCACHE_BIN_B for the -b cases}"
fi
if needs qemu; then
    truncate -s 1G "$dir/qemu.img"
    qemu-nbd -f raw -k "$dir/qemu.sock" -t --cache=none --aio=io_uring "$dir/qemu.img" \
        >"$dir/qemu.log" 2>&1 &
    pids+=($!)
    uri[qemu]="nbd+unix:///?socket=$dir/qemu.sock"
    wait_nbd "${uri[qemu]}" "$!" "$dir/qemu.log"
fi
if needs nbdkit; then
    truncate -s 1G "$dir/nbdkit.img"
    nbdkit -f -U "$dir/nbdkit.sock" file file="$dir/nbdkit.img" cache=none \
        >"$dir/nbdkit.log" 2>&1 &
    pids+=($!)
    uri[nbdkit]="nbd+unix:///?socket=$dir/nbdkit.sock"
    wait_nbd "${uri[nbdkit]}" "$!" "$dir/nbdkit.log"
fi
for s in qemu nbdkit; do
    needs $s || continue
    fio --name=fill --ioengine=nbd --uri="${uri[$s]}" --rw=write --bs=1M --iodepth=8 \
        --size=$region --output-format=terse >/dev/null
done
if needs device || needs device-wb; then
    fio --name=fill --ioengine=io_uring --direct=1 --filename="$dir/device.img" --rw=write \
        --bs=1M --iodepth=8 --size=$region --output-format=terse >/dev/null
fi

fg_rw=${FG_RW:-randread}
common=(--rw="$fg_rw" --rwmixread=50 --bs=4k --iodepth=1 --time_based --runtime="$runtime" --norandommap
    --randrepeat=0 --size=$region --lat_percentiles=1 --percentile_list=50:99:99.9
    --output-format=json)
status_counts() { # $1 server: "blocks written back, read misses" so far
    "${lc_bin[$1]}" status --control "$dir/$1.ctl" --json |
        /usr/bin/python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["writeback_blocks"], d["read_misses"], sep=",")'
}
measure() { # $1 case, $2 round
    local c=$1 out="$dir/fio-$1-$2.json" s wb0=null wb1=null resident=null
    s=${c%-b}
    [ "$s" != "$c" ] && s=lcb || case $c in alone | wb | held | idle | drain) s=lc ;; esac
    case $c in
    alone* | wb* | held* | idle* | drain*)
        # The region written again (the newest data in the log: a log that wrapped over it
        # in earlier rounds would evict it, and reads would miss), then nothing dirty left:
        # every round starts alike.
        fio --name=refill --ioengine=nbd --uri="${uri[$s]}" --rw=write --bs=1M --iodepth=8 \
            --size=$region --output-format=terse >/dev/null
        "${lc_bin[$s]}" drain --control "$dir/$s.ctl" >/dev/null 2>&1
        wb0=$(status_counts "$s")
        ;;
    nbdkit)
        /usr/bin/python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)' "$dir/nbdkit.img" ;;
    esac
    case $c in
    held* | idle* | drain*) "${lc_bin[$s]}" set --control "$dir/$s.ctl" \
        writeback_threshold_percent=100 >/dev/null ;;
    esac
    local drain_pid=""
    case $c in
    drain*)
        fio --name=dirty --ioengine=nbd --uri="${uri[$s]}" --rw=write --bs=1M --iodepth=8 \
            --offset=128M --size="${DRAIN_MIB:-1024}M" --output-format=terse >/dev/null
        wb0=$(status_counts "$s")
        "${lc_bin[$s]}" drain --control "$dir/$s.ctl" >/dev/null 2>&1 &
        drain_pid=$!
        ;;
    esac
    case $c in
    wb* | held*) fio --name=fg --ioengine=nbd --uri="${uri[$s]}" "${common[@]}" --output="$out" \
        --name=bg --ioengine=nbd --uri="${uri[$s]}" --rw=randwrite --bs=4k --iodepth=4 \
        --offset=$region --size=$region --time_based --runtime="$runtime" \
        ${WB_BG_MIBPS:+--rate="${WB_BG_MIBPS}m"} >/dev/null ;;
    alone* | idle* | drain*) fio --name=fg --ioengine=nbd --uri="${uri[$s]}" "${common[@]}" \
        --output="$out" >/dev/null ;;
    qemu | nbdkit) fio --name=fg --ioengine=nbd --uri="${uri[$c]}" "${common[@]}" \
        --output="$out" >/dev/null ;;
    device) fio --name=fg --ioengine=io_uring --direct=1 --filename="$dir/device.img" \
        "${common[@]}" --output="$out" >/dev/null ;;
    device-wb) fio --name=fg --ioengine=io_uring --direct=1 --filename="$dir/device.img" \
        "${common[@]}" --output="$out" --name=bg --ioengine=io_uring --direct=1 \
        --filename="$dir/device-bg.img" --rw=write --bs=1M --iodepth=1 --size=256M \
        --rate="${DEVICE_WB_MIBPS:-64}m" --time_based --runtime="$runtime" >/dev/null ;;
    esac
    case $c in
    alone* | wb* | held* | idle* | drain*) wb1=$(status_counts "$s") ;;
    esac
    [ -z "$drain_pid" ] || wait "$drain_pid"
    case $c in
    held* | idle* | drain*) "${lc_bin[$s]}" set --control "$dir/$s.ctl" \
        writeback_threshold_percent=0 >/dev/null ;;
    nbdkit) resident=$(fincore --bytes --noheadings --output RES "$dir/nbdkit.img" |
        awk '{printf "%d", $1 / 1048576}') ;;
    esac
    /usr/bin/python3 - "$out" "$c" "$2" "$wb0" "$wb1" "$resident" <<'EOF'
import json, sys
path, case, rnd, wb0, wb1, resident = sys.argv[1:]
jobs = json.load(open(path))["jobs"]
fg = next(j for j in jobs if j["jobname"] == "fg")["read"]
p = fg["lat_ns"]["percentile"]
bg = [j["write"]["bw_bytes"] / 2**20 for j in jobs if j["jobname"] == "bg"]
load = open("/proc/loadavg").read().split()[0]
print(json.dumps({"case": case, "round": int(rnd), "reads": fg["total_ios"],
                  "iops": round(fg["iops"]), "p50_us": round(p["50.000000"] / 1000),
                  "p99_us": round(p["99.000000"] / 1000),
                  "p99_9_us": round(p["99.900000"] / 1000),
                  # fio's latency buckets (total latency, the fg job's reads only): "2" is
                  # 1-2 ms and every later one is longer, so their sum is the share over 1 ms.
                  "over_1ms_per_10k": round(sum(next(j for j in jobs if j["jobname"] == "fg")
                                                ["latency_ms"].values()) * 100, 1),
                  "bg_write_mibps": round(bg[0], 1) if bg else None,
                  "writeback_blocks": (int(wb1.split(",")[0]) - int(wb0.split(",")[0])
                                       if wb0 != "null" else None),
                  # Reads the cache missed (its region evicted: a log that wrapped over it).
                  "read_misses": (int(wb1.split(",")[1]) - int(wb0.split(",")[1])
                                  if wb0 != "null" else None),
                  "resident_mib": None if resident == "null" else int(resident),
                  "load1": float(load)}))
EOF
}
results="$dir/results.jsonl"
for round in $(seq 1 "$rounds"); do
    # shellcheck disable=SC2086
    for c in $(rotate "$((round - 1))" $cases); do measure "$c" "$round" | tee -a "$results"; done
done
/usr/bin/python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| case | rounds | reads | p50 µs | p99 µs | p99.9 µs (median; per round) "
      "| reads over 1 ms per 10,000 (median; per round) | bg write MiB/s "
      "| blocks written back | read misses | load (1 min) |")
print("|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|")
for case in dict.fromkeys(r["case"] for r in rows):
    rs = sorted((r for r in rows if r["case"] == case), key=lambda r: r["round"])
    med = lambda k: statistics.median(r[k] for r in rs)
    per = " ".join(f"{r['p99_9_us']:,}" for r in rs)
    per_over = " ".join(f"{r['over_1ms_per_10k']:g}" for r in rs)
    opt = lambda k: (f"{statistics.median(r[k] for r in rs):,.0f}"
                     if all(r[k] is not None for r in rs) else "–")
    loads = " ".join(f"{r['load1']:.1f}" for r in rs)
    print(f"| {case} | {len(rs)} | {sum(r['reads'] for r in rs):,} | {med('p50_us'):,.0f} | "
          f"{med('p99_us'):,.0f} | **{med('p99_9_us'):,.0f}** ({per}) | "
          f"{med('over_1ms_per_10k'):g} ({per_over}) | {opt('bg_write_mibps')} | "
          f"{opt('writeback_blocks')} | {opt('read_misses')} | {loads} |")
EOF
