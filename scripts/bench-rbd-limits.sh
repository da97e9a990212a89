#!/usr/bin/env bash
# Issue 22's three missed goals taken apart, on one one-node cluster (scripts/ceph-up.sh):
#
#   hop      1 MiB sequential reads of uncached data: where the loss against RBD alone is.
#            rbd-alone  fio's rbd engine (librbd, its cache off): the reference
#            rbd-inproc logcache-bench read --target backing: logcache-rbd over librbd, in
#                       process, no engine, no NBD
#            lc-inproc  logcache-bench read --target engine: the engine's miss path in process
#                       (a cache formatted over the image, read_cache off), no NBD
#            lc-native  fio's nbd engine on logcache serve --backing rbd:... (read_cache off)
#            qnbd-none  fio's nbd engine on qemu-nbd --cache=none: the same hop, librbd behind it
#            null       fio's nbd engine on nbdkit null: the NBD hop with nothing behind it
#            rbd-inproc-nora, lc-inproc-nora (in HOP_CONFIGS): the same with read-ahead off
#   latency  seed 004's foreground 4 KiB random writer (iodepth 1) on lc-native beside 0/4/16
#            background jobs (4 KiB random writes, iodepth 8), several ways:
#            shared     one fio process for both (bench-rbd-matrix.sh's latency phase)
#            bg-nice    the background jobs in their own fio process at nice 19
#            fg-rt      the background jobs in their own fio process; the foreground fio
#                       process and logcache serve (every thread) at SCHED_FIFO 10: what the
#                       foreground gets when it does not wait behind the others for a CPU
#            hog        no background IO, N busy loops (`sha1sum /dev/zero`) instead: CPU
#                       contention alone
#            with the CPU the OSD, the monitor and logcache used per second of the run, and
#            the machine's busy share (/proc/stat).
#   misses   random reads at iodepth 32, 1 MiB and 4 KiB, every read a miss: lc-native vs
#            lc-qnbd (logcache over qemu-nbd --cache=none), with rbd-alone, lc-inproc at 32
#            and 16 readers (serve has at most 16 workers per connection).
#
# usage: scripts/bench-rbd-limits.sh [SECONDS] [OUT]
#   env: PHASES="hop latency misses" ROUNDS=3 HOP_DEPTHS="1 32" HOP_CONFIGS=... BG="0 4 16" HOGS="2 4"
#        LAT_WAYS="shared bg-nice fg-rt" PERF=1 (perf record of serve during one misses run)
# One line per run (appended to OUT, default /var/tmp/rbd-limits.txt):
#   hop CONFIG IODEPTH MBps osd_cpu lc_cpu busy
#   latency WAY BG fg_IOPS fg_p99_us fg_p99.9_us fg_max_us bg_IOPS osd_cpu lc_cpu busy
#   misses CONFIG BS IODEPTH MBps osd_cpu lc_cpu busy
# (osd_cpu, lc_cpu: CPU seconds per second of the run, of ceph-osd and of the logcache process
# measured (serve, or logcache-bench in process); busy: the machine's non-idle share, 0-1.)
set -euo pipefail
secs=${1:-4}
out=${2:-/var/tmp/rbd-limits.txt}
PHASES=${PHASES:-hop latency misses}
ROUNDS=${ROUNDS:-3}
HOP_DEPTHS=${HOP_DEPTHS:-1 32}
HOP_CONFIGS=${HOP_CONFIGS:-rbd-alone rbd-inproc lc-inproc lc-native qnbd-none null}
BG=${BG:-0 4 16}
HOGS=${HOGS:-2 4}
LAT_WAYS=${LAT_WAYS:-shared bg-nice fg-rt}
PERF=${PERF:-}
phase() { [[ " $PHASES " == *" $1 "* ]]; }
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
bin=$root/target/release/logcache
bench=$root/target/release/logcache-bench
[ -x "$bin" ] && [ -x "$bench" ] || (cd "$root" && cargo build --release -q -p logcache -p logcache-bench)
"$root/scripts/install-qemu-rbd.sh"

dir=$(mktemp -d /var/tmp/lcrbdl.XXXXXX)
pids=()
cleanup() {
    # SIGKILL for logcache: its caches are scratch, and a clean stop waits for writeback to a
    # cluster that may be gone.
    for p in ${lc_native:-} ${lc_qnbd:-}; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    "$root/scripts/ceph-down.sh" "$dir/ceph" || true
    rm -rf "$dir"
}
trap cleanup EXIT

conf=$("$root/scripts/ceph-up.sh" "$dir/ceph" 2>/dev/null | tail -n 1)
osd_pid=$(cat "$dir"/ceph/run/ceph-osd.0.pid)
rbd_images "$conf" 1G raw li lc lq qn
rbd_client_conf "$conf" "$dir/nocache.conf" 'rbd cache = false'

qemu-nbd -f raw -t --discard=unmap --cache=none -k "$dir/qn.sock" "rbd:rbd/qn:conf=$conf" \
    >"$dir/qemu-nbd-qn.log" 2>&1 &
pids+=($!)
qemu-nbd -f raw -t --discard=unmap --cache=none -k "$dir/lq.sock" "rbd:rbd/lq:conf=$conf" \
    >"$dir/qemu-nbd-lq.log" 2>&1 &
pids+=($!)
nbdkit -U "$dir/null.sock" -f null 1G >"$dir/nbdkit-null.log" 2>&1 &
pids+=($!)
wait_socket_file "$dir/qn.sock" "$dir/qemu-nbd-qn.log"
wait_socket_file "$dir/lq.sock" "$dir/qemu-nbd-lq.log"
wait_socket_file "$dir/null.sock" "$dir/nbdkit-null.log"

native_spec="rbd:rbd/lc?conf=$conf"
inproc_spec="rbd:rbd/li?conf=$conf"
qnbd_spec="nbd+unix:///?socket=$dir/lq.sock"
truncate -s 4G "$dir/li.img"
"$bin" format --force --cache "$dir/li.img" --backing "$inproc_spec" >/dev/null
lc_start() { lc_serve_fresh "$bin" "$dir" "$@"; } # NAME SPEC [SET...]: sets lc_NAME
lc_stop() { # NAME: drain, then stop
    local pidvar="lc_$1"
    [ -n "${!pidvar:-}" ] || return 0
    "$bin" drain --control "$dir/$1.ctl" >/dev/null 2>&1 || true
    kill "${!pidvar}"
    wait "${!pidvar}" 2>/dev/null || true
    printf -v "lc_$1" '%s' ""
}

ticks() { # PID -> utime+stime of every thread, in clock ticks (0 if gone)
    awk '{ sub(/.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0
}
busy_ticks() { # -> "busy total" jiffies of the whole machine
    awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat
}
hz=$(getconf CLK_TCK)
osd_alive() {
    kill -0 "$osd_pid" 2>/dev/null && return 0
    echo "bench-rbd-limits: ceph-osd exited (the disk full?); see $dir/ceph/log; the last figure is void" >&2
    exit 1
}
# measure PID CMD...: runs CMD; prints its stdout, then "osd_cpu lc_cpu busy" for the run.
# PID is the logcache process to account (0: CMD itself is the logcache process; its CPU is
# taken from the rusage figure logcache-bench prints, so lc_cpu is "-" here).
measure() {
    local lcpid=$1 o0 l0 b0 t0 o1 l1 b1 t1 s0 s1 outp
    shift
    o0=$(ticks "$osd_pid")
    l0=$([ "$lcpid" -gt 0 ] && ticks "$lcpid" || echo 0)
    read -r b0 t0 < <(busy_ticks)
    s0=$(date +%s.%N)
    outp=$("$@")
    s1=$(date +%s.%N)
    o1=$(ticks "$osd_pid")
    l1=$([ "$lcpid" -gt 0 ] && ticks "$lcpid" || echo 0)
    read -r b1 t1 < <(busy_ticks)
    # A figure taken while the OSD was gone (it aborts when the disk fills) means nothing.
    kill -0 "$osd_pid" 2>/dev/null || {
        echo "bench-rbd-limits: ceph-osd exited during the run; see $dir/ceph/log" >&2
        exit 1
    }
    echo "$outp"
    awk -v o="$((o1 - o0))" -v l="$((l1 - l0))" -v b="$((b1 - b0))" -v t="$((t1 - t0))" \
        -v s="$s0" -v e="$s1" -v hz="$hz" -v has="$lcpid" 'BEGIN {
        d = e - s; printf "%.2f %s %.2f\n", o / hz / d, (has > 0 ? sprintf("%.2f", l / hz / d) : "-"), b / t }'
}
fio_mbps() { # RW; fio JSON on stdin -> MB/s of job "m"
    /usr/bin/python3 -c '
import json, sys
side = "read" if "read" in sys.argv[1] else "write"
text = sys.stdin.read()
jobs = json.loads(text[text.index("{"):])["jobs"]
print("%.1f" % ([x for x in jobs if x["jobname"] == "m"][0][side]["bw_bytes"] / 1e6))' "$1"
}
# read_run CONFIG RW BS DEPTH -> "MBps osd_cpu lc_cpu busy"
read_run() {
    local c=$1 rw=$2 bs=$3 depth=$4 pattern=seq r m
    [[ $rw == rand* ]] && pattern=rand
    local fio=(fio --name=m "--rw=$rw" "--bs=$bs" "--iodepth=$depth" --size=512m
        "--runtime=$secs" --time_based --randrepeat=0 --output-format=json)
    case $c in
    rbd-alone) r=$(measure 0 env CEPH_CONF="$dir/nocache.conf" "${fio[@]}" --ioengine=rbd \
        --pool=rbd --rbdname=raw --clientname=admin) ;;
    qnbd-none) r=$(measure 0 "${fio[@]}" --ioengine=nbd "--uri=nbd+unix:///?socket=$dir/qn.sock") ;;
    null) r=$(measure 0 "${fio[@]}" --ioengine=nbd "--uri=nbd+unix:///?socket=$dir/null.sock") ;;
    lc-native) r=$(measure "$lc_native" "${fio[@]}" --ioengine=nbd \
        "--uri=nbd+unix:///?socket=$dir/native.sock") ;;
    lc-qnbd) r=$(measure "$lc_qnbd" "${fio[@]}" --ioengine=nbd \
        "--uri=nbd+unix:///?socket=$dir/qnbd.sock") ;;
    lc-inproc* | rbd-inproc*)
        local target=engine threads=$depth ra=16384
        [[ $c == rbd-inproc* ]] && target=backing
        [ "$c" = lc-inproc16 ] && threads=16
        [[ $c == *-nora ]] && ra=0
        local kib=${bs%[km]}
        [[ $bs == *m ]] && kib=$((kib * 1024))
        r=$(measure 0 "$bench" read --target "$target" --cache "$dir/li.img" \
            --backing "$inproc_spec" --pattern "$pattern" --bs-kib "$kib" \
            --iodepth "$threads" --region-mib 512 --seconds "$secs" --read-ahead-kib "$ra" --json)
        m=$(echo "$r" | head -n 1 | /usr/bin/python3 -c 'import json,sys; v=json.load(sys.stdin); print("%.1f %.2f" % (v["mb_s"], v["cpu_seconds"] / v["seconds"]))')
        set -- $m $(echo "$r" | tail -n 1)
        echo "$1 $3 $2 $5"
        return ;;
    esac
    m=$(echo "$r" | sed '$d' | fio_mbps "$rw")
    echo "$m $(echo "$r" | tail -n 1)"
}

echo "# $(date -u +%FT%TZ) secs=$secs PHASES=($PHASES) ROUNDS=$ROUNDS load=$(cut -d' ' -f1-3 /proc/loadavg) commit=$(git -C "$root" rev-parse --short HEAD)" | tee -a "$out"

if phase hop || phase misses; then
    lc_start native "$native_spec" --set read_cache=off
fi
if phase hop; then
    for depth in $HOP_DEPTHS; do
        for round in $(seq 1 "$ROUNDS"); do
            # shellcheck disable=SC2086
            for c in $(rotate "$((round - 1))" $HOP_CONFIGS); do
                echo "hop $c $depth $(read_run "$c" read 1m "$depth")" | tee -a "$out"; osd_alive
            done
        done
    done
fi
if phase misses; then
    lc_start qnbd "$qnbd_spec" --set read_cache=off
    for bs in 1m 4k; do
        for round in $(seq 1 "$ROUNDS"); do
            for c in $(rotate "$((round - 1))" lc-native lc-qnbd rbd-alone lc-inproc lc-inproc16); do
                echo "misses $c $bs 32 $(read_run "$c" randread "$bs" 32)" | tee -a "$out"; osd_alive
            done
        done
    done
    if [ -n "$PERF" ]; then
        perf record -g -o "$dir/perf-native.data" -p "$lc_native" -- sleep "$secs" >/dev/null 2>&1 &
        perfpid=$!
        read_run lc-native randread 1m 32 >/dev/null
        wait "$perfpid" || true
        for sort in dso comm,dso dso,sym; do
            echo "## perf report --sort $sort"
            perf report -i "$dir/perf-native.data" --no-children -g none --sort "$sort" \
                --stdio 2>/dev/null | grep -v '^#' | grep '%' | head -n 25
        done >"${out%.txt}-perf-native.txt" || true
        echo "# perf of lc-native randread 1m qd32 in ${out%.txt}-perf-native.txt" | tee -a "$out"
    fi
    lc_stop qnbd
fi
lc_stop native

if phase latency; then
    lc_start native "$native_spec"
    fg=(--name=m --rw=randwrite --bs=4k --iodepth=1 --size=256m --ioengine=nbd
        "--uri=nbd+unix:///?socket=$dir/native.sock")
    bgjob() { # N -> fio job options of N background jobs
        echo "--name=bg --rw=randwrite --bs=4k --iodepth=8 --offset=256m --size=256m --numjobs=$1 --ioengine=nbd --uri=nbd+unix:///?socket=$dir/native.sock"
    }
    fg_summary() { # fio JSON of the foreground (and maybe background) jobs on stdin
        /usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()
jobs = json.loads(text[text.index("{"):])["jobs"]
j = [x for x in jobs if x["jobname"] == "m"][0]["write"]
p = j["clat_ns"]["percentile"]
bg = sum(x["write"]["iops"] for x in jobs if x["jobname"] == "bg")
print("%.0f %.0f %.0f %.0f %.0f" % (j["iops"], p["99.000000"] / 1000, p["99.900000"] / 1000,
      j["clat_ns"]["max"] / 1000, bg))'
    }
    bg_iops() { # fio JSON file of the background jobs -> their IOPS
        /usr/bin/python3 -c '
import json, sys
t = open(sys.argv[1]).read()
print("%.0f" % sum(x["write"]["iops"] for x in json.loads(t[t.index("{"):])["jobs"]))' "$1"
    }
    bgpid=""
    bgout=$dir/bg.json
    bg_start() { # N [PREFIX...]: N background jobs in their own fio process, run under PREFIX
        local n=$1
        shift
        # shellcheck disable=SC2046
        "$@" fio --runtime="$secs" --time_based --randrepeat=0 --output-format=json \
            --output="$bgout" $(bgjob "$n") >/dev/null &
        bgpid=$!
    }
    bg_end() { # with background jobs of their own: waits for them, adds their IOPS to $f
        [ -n "$bgpid" ] || return 0
        wait "$bgpid"
        bgpid=""
        # shellcheck disable=SC2086
        set -- $f
        f="$1 $2 $3 $4 $(bg_iops "$bgout")"
    }
    lat_run() { # WAY N -> the latency line's figures
        local way=$1 n=$2 r f
        "$bin" drain --control "$dir/native.ctl" >/dev/null 2>&1
        local common=(--runtime="$secs" --time_based --randrepeat=0 --output-format=json)
        case $way in
        shared)
            # shellcheck disable=SC2046
            r=$(measure "$lc_native" fio "${common[@]}" "${fg[@]}" $([ "$n" -gt 0 ] && bgjob "$n"))
            f=$(echo "$r" | sed '$d' | fg_summary) ;;
        bg-nice)
            [ "$n" -gt 0 ] && bg_start "$n" nice -n 19
            r=$(measure "$lc_native" fio "${common[@]}" "${fg[@]}")
            f=$(echo "$r" | sed '$d' | fg_summary)
            bg_end ;;
        fg-rt)
            # The background jobs in their own fio process at normal priority (a child of an
            # RT fio would be RT too).
            [ "$n" -gt 0 ] && bg_start "$n"
            chrt -f -a -p 10 "$lc_native" >/dev/null
            r=$(measure "$lc_native" chrt -f 10 fio "${common[@]}" "${fg[@]}")
            chrt -o -a -p 0 "$lc_native" >/dev/null
            f=$(echo "$r" | sed '$d' | fg_summary)
            bg_end ;;
        hog)
            local hogs=() i
            for ((i = 0; i < n; i++)); do sha1sum /dev/zero & hogs+=($!); done
            r=$(measure "$lc_native" fio "${common[@]}" "${fg[@]}")
            kill "${hogs[@]}"
            wait "${hogs[@]}" 2>/dev/null || true
            f=$(echo "$r" | sed '$d' | fg_summary) ;;
        esac
        echo "$f $(echo "$r" | tail -n 1)"
    }
    for round in $(seq 1 "$ROUNDS"); do
        for n in $BG; do
            for way in $(rotate "$((round - 1))" $LAT_WAYS); do
                [ "$way" = bg-nice ] && [ "$n" -eq 0 ] && continue
                echo "latency $way $n $(lat_run "$way" "$n")" | tee -a "$out"; osd_alive
            done
        done
        for h in $HOGS; do
            echo "latency hog $h $(lat_run hog "$h")" | tee -a "$out"; osd_alive
        done
    done
    lc_stop native
fi
echo "# done $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
