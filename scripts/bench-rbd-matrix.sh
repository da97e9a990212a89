#!/usr/bin/env bash
# Seed 001's method on Ceph RBD: block sizes x patterns x iodepths, five ways side by side, runs
# alternated job by job so all five see the same machine; then seed 004's foreground latency
# with 0, 4 and 16 background jobs. One one-node cluster (scripts/ceph-up.sh) for all of it.
#
#   rbd-alone      fio's rbd engine, librbd's cache off: RBD itself, the raw reference
#   qnbd-none      fio's nbd engine on qemu-nbd --cache=none (the NBD route, no cache)
#   qnbd-wb        fio's nbd engine on qemu-nbd --cache=writeback: librbd's write-back cache, the
#                  peer (Ceph's PWL cache is not built into Debian's librbd: not measurable here)
#   lc-native      logcache serve --backing rbd:rbd/lc (librbd through logcache-rbd)
#   lc-qnbd        logcache serve --backing nbd+unix://... on qemu-nbd --cache=none (the NBD route)
#
# Writes go to a 512 MiB region of each image (written once first, so RBD's objects exist);
# logcache is drained before each of its write runs. Reads measure the uncached path: logcache's
# cache is formatted anew before the read jobs and serves with read_cache=off, so every read is a
# miss passed through to RBD (the goal: >= 95% of RBD alone). Cached reads are the IO path's
# benchmark (scripts/bench-iopath.sh and bench/run), not this one.
#
# Two more phases, chosen with PHASES (default "matrix latency"):
#   cached  1 MiB sequential reads of data logcache holds (written through it, then drained:
#           clean blocks in the cache) against RBD alone and the cache device's own speed
#           (`file`: nbdkit's file plugin, cache=none, on a file in the same directory as
#           logcache's cache files), at each of CACHED_DEPTHS;
#   drain   writeback speed per route: a fresh logcache with background writeback off
#           (writeback_threshold_percent=100, writeback_idle_ms=0) takes a write job, then
#           `logcache drain` is timed; MB/s = the dirty bytes status showed / drain's seconds.
#           fio's rbd engine running the same job straight at RBD (iodepth 32) is the reference.
# VARIANT_BIN=PATH adds config `lc-variant`: that logcache binary (e.g. built with other
# per-connection limits) with the native backing on its own image, for A/B runs; VARIANT_SET
# adds serve options to it alone (e.g. VARIANT_BIN=target/release/logcache
# VARIANT_SET="--set writeback_io_depth=64").
#
# ROUNDS=N runs each matrix row (and each latency row) N times, the configs in a different order
# each round (the first config of round r is the r-th), so a machine whose load changes within a
# row does not favour whichever config comes first: one line per run, ratios taken from the
# medians.
#
# usage: scripts/bench-rbd-matrix.sh [SECONDS] [OUT]
#   env: BS="4k 64k 1m 4m" RW="randwrite write randread read" DEPTHS="1 32" BG="0 4 16"
#        CONFIGS="rbd-alone qnbd-none qnbd-wb lc-native lc-qnbd" PHASES="matrix latency"
#        CACHED_DEPTHS="1 32" DRAIN_ROUNDS=2 VARIANT_BIN= VARIANT_SET= ROUNDS=1
# Prints one line per run (and appends it to OUT, default /var/tmp/rbd-matrix.txt):
#   matrix CONFIG RW BS IODEPTH MBps IOPS p99_us p99.9_us
#   latency CONFIG BGJOBS fg_IOPS fg_p99_us fg_p99.9_us fg_max_us
#   cached CONFIG IODEPTH MBps IOPS p99_us p99.9_us
#   drain CONFIG ROUND RW BS DIRTY_MiB SECONDS MBps
set -euo pipefail
secs=${1:-5}
out=${2:-/var/tmp/rbd-matrix.txt}
BS=${BS:-4k 64k 1m 4m}
RW=${RW:-randwrite write randread read}
DEPTHS=${DEPTHS:-1 32}
BG=${BG:-0 4 16}
CONFIGS=${CONFIGS:-rbd-alone qnbd-none qnbd-wb lc-native lc-qnbd}
PHASES=${PHASES:-matrix latency}
CACHED_DEPTHS=${CACHED_DEPTHS:-1 32}
DRAIN_ROUNDS=${DRAIN_ROUNDS:-2}
VARIANT_BIN=${VARIANT_BIN:-}
VARIANT_SET=${VARIANT_SET:-}
ROUNDS=${ROUNDS:-1}
phase() { [[ " $PHASES " == *" $1 "* ]]; }
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
bin=$root/target/release/logcache
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
"$root/scripts/install-qemu-rbd.sh"

dir=$(mktemp -d /var/tmp/lcrbdm.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}" ${lc_native:-} ${lc_qnbd:-} ${lc_variant:-}; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    "$root/scripts/ceph-down.sh" "$dir/ceph" || true
    rm -rf "$dir"
}
trap cleanup EXIT

conf=$("$root/scripts/ceph-up.sh" "$dir/ceph" 2>/dev/null | tail -n 1)
# Only the images the chosen CONFIGS use (each holds 512 MiB once written): logcache's two
# routes always run (lc, lq), the others when named.
images="lc lq"
[[ " $CONFIGS " == *" rbd-alone "* ]] && images="$images raw"
[[ " $CONFIGS " == *" qnbd-none "* ]] && images="$images qn"
[[ " $CONFIGS " == *" qnbd-wb "* ]] && images="$images qw"
[ -n "$VARIANT_BIN" ] && images="$images lv"
# shellcheck disable=SC2086
rbd_images "$conf" 1G $images
rbd_client_conf "$conf" "$dir/nocache.conf" 'rbd cache = false'

# qemu-nbd: the NBD route. -t: stay up across client disconnects.
qnbd() { # IMAGE CACHE SOCKET
    qemu-nbd -f raw -t --discard=unmap --cache="$2" -k "$3" "rbd:rbd/$1:conf=$conf" \
        >"$dir/qemu-nbd-$1.log" 2>&1 &
    pids+=($!)
    wait_socket_file "$3" "$dir/qemu-nbd-$1.log"
}
if [[ " $images " == *" qn "* ]]; then qnbd qn none "$dir/qn.sock"; fi
if [[ " $images " == *" qw "* ]]; then qnbd qw writeback "$dir/qw.sock"; fi
qnbd lq none "$dir/lq.sock"

native_spec="rbd:rbd/lc?conf=$conf"
variant_spec="rbd:rbd/lv?conf=$conf"
qnbd_spec="nbd+unix:///?socket=$dir/lq.sock"
# lc_start NAME SPEC [SET...]: format NAME's cache anew over SPEC and serve it (the variant
# with VARIANT_BIN); sets lc_<NAME>.
lc_start() {
    local lc=$bin
    [ "$1" = variant ] && lc=$VARIANT_BIN
    lc_serve_fresh "$lc" "$dir" "$@"
}
lc_stop() { # NAME: drain (nothing may be lost by the next format), then stop
    local name=$1 pidvar="lc_$1"
    "$bin" drain --control "$dir/$name.ctl" >/dev/null 2>&1
    kill "${!pidvar}"
    wait "${!pidvar}" 2>/dev/null || true
    printf -v "lc_$name" '%s' ""
}
# lc_restart [SET...]: every logcache anew (fresh caches, nothing dirty), with SET options.
lc_restart() {
    for name in native qnbd ${VARIANT_BIN:+variant}; do
        local pidvar="lc_$name"
        [ -n "${!pidvar:-}" ] && lc_stop "$name"
    done
    lc_start native "$native_spec" "$@"
    lc_start qnbd "$qnbd_spec" "$@"
    # shellcheck disable=SC2086
    if [ -n "$VARIANT_BIN" ]; then lc_start variant "$variant_spec" "$@" $VARIANT_SET; fi
}
lc_restart

summary() { # RW; fio JSON on stdin -> "MBps IOPS p99_us p99.9_us" of the job(s) named "m"
    /usr/bin/python3 -c '
import json, sys
rw = sys.argv[1]
side = "read" if "read" in rw else "write"
text = sys.stdin.read()
jobs = json.loads(text[text.index("{"):])["jobs"]  # fio may print a warning first
j = [x for x in jobs if x["jobname"] == "m"][0][side]
p = j["clat_ns"].get("percentile", {})
print("%.1f %.0f %.0f %.0f" % (j["bw_bytes"] / 1e6, j["iops"],
      p.get("99.000000", 0) / 1000, p.get("99.900000", 0) / 1000))' "$1"
}
target() { # CONFIG -> fio's engine options
    case $1 in
    rbd-alone) echo "--ioengine=rbd --pool=rbd --rbdname=raw --clientname=admin" ;;
    qnbd-none) echo "--ioengine=nbd --uri=nbd+unix:///?socket=$dir/qn.sock" ;;
    qnbd-wb) echo "--ioengine=nbd --uri=nbd+unix:///?socket=$dir/qw.sock" ;;
    lc-native) echo "--ioengine=nbd --uri=nbd+unix:///?socket=$dir/native.sock" ;;
    lc-qnbd) echo "--ioengine=nbd --uri=nbd+unix:///?socket=$dir/qnbd.sock" ;;
    lc-variant) echo "--ioengine=nbd --uri=nbd+unix:///?socket=$dir/variant.sock" ;;
    file) echo "--ioengine=nbd --uri=nbd+unix:///?socket=$dir/file.sock" ;;
    esac
}
lc_name() {
    case $1 in lc-native) echo native ;; lc-qnbd) echo qnbd ;; lc-variant) echo variant ;;
    *) echo "" ;; esac
}

echo "# $(date -u +%FT%TZ) secs=$secs BS=($BS) RW=($RW) DEPTHS=($DEPTHS) BG=($BG) ROUNDS=$ROUNDS load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
reads_started=0
phase matrix || RW=""
for rw in $RW; do
    if [[ $rw == *read* ]] && [ $reads_started -eq 0 ]; then
        # Every read from here on is a miss: fresh caches, read_cache off.
        reads_started=1
        lc_restart --set read_cache=off
    fi
    for bs in $BS; do
        for depth in $DEPTHS; do
            for round in $(seq 1 "$ROUNDS"); do
                # shellcheck disable=SC2086
                for c in $(rotate "$((round - 1))" $CONFIGS); do
                    name=$(lc_name "$c")
                    if [ -n "$name" ] && [[ $rw != *read* ]]; then
                        "$bin" drain --control "$dir/$name.ctl" >/dev/null 2>&1
                    fi
                    # shellcheck disable=SC2046
                    r=$(CEPH_CONF=$dir/nocache.conf fio --name=m "--rw=$rw" "--bs=$bs" \
                        "--iodepth=$depth" --size=512m --runtime="$secs" --time_based \
                        --randrepeat=0 --output-format=json $(target "$c") | summary "$rw")
                    echo "matrix $c $rw $bs $depth $r" | tee -a "$out"
                done
            done
        done
    done
done

# Seed 004: one foreground 4 KiB random writer at iodepth 1, with N background jobs of 4 KiB
# random writes at iodepth 8 in another region of the same disk; the foreground's latency.
if [ $reads_started -eq 1 ]; then
    lc_restart
fi
phase latency || BG=""
for n in $BG; do
    # shellcheck disable=SC2046
    for c in $(for round in $(seq 1 "$ROUNDS"); do rotate "$((round - 1))" $CONFIGS; done); do
        name=$(lc_name "$c")
        [ -n "$name" ] && "$bin" drain --control "$dir/$name.ctl" >/dev/null 2>&1
        bgjob=()
        if [ "$n" -gt 0 ]; then
            bgjob=(--name=bg --rw=randwrite --bs=4k --iodepth=8 --offset=256m --size=256m
                "--numjobs=$n")
        fi
        # shellcheck disable=SC2046
        r=$(CEPH_CONF=$dir/nocache.conf fio --runtime="$secs" --time_based --randrepeat=0 \
            --output-format=json $(target "$c") \
            --name=m --rw=randwrite --bs=4k --iodepth=1 --size=256m "${bgjob[@]}" |
            /usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()
jobs = json.loads(text[text.index("{"):])["jobs"]
j = [x for x in jobs if x["jobname"] == "m"][0]["write"]
p = j["clat_ns"]["percentile"]
print("%.0f %.0f %.0f %.0f" % (j["iops"], p["99.000000"] / 1000, p["99.900000"] / 1000,
      j["clat_ns"]["max"] / 1000))')
        echo "latency $c $n $r" | tee -a "$out"
    done
done
lc_configs() { for c in $CONFIGS; do [ -n "$(lc_name "$c")" ] && echo "$c"; done; }

if phase cached; then
    # Fresh caches (read_cache on), the region written through each logcache in 1 MiB
    # sequential writes, drained: every later read of it is a hit on a clean cached block.
    lc_restart
    truncate -s 512M "$dir/file.img"
    dd if=/dev/urandom of="$dir/file.img" bs=1M count=512 conv=notrunc status=none
    nbdkit -U "$dir/file.sock" -f file "$dir/file.img" cache=none >"$dir/nbdkit-file.log" 2>&1 &
    pids+=($!)
    wait_socket_file "$dir/file.sock" "$dir/nbdkit-file.log"
    for c in $(lc_configs); do
        # shellcheck disable=SC2046
        fio --name=fill --rw=write --bs=1m --iodepth=8 --size=512m --output-format=json \
            $(target "$c") >/dev/null
        "$bin" drain --control "$dir/$(lc_name "$c").ctl" >/dev/null 2>>"$dir/drain.log"
    done
    for depth in $CACHED_DEPTHS; do
        for c in rbd-alone file $(lc_configs); do
            # shellcheck disable=SC2046
            r=$(CEPH_CONF=$dir/nocache.conf fio --name=m --rw=read --bs=1m "--iodepth=$depth" \
                --size=512m --runtime="$secs" --time_based --output-format=json \
                $(target "$c") | summary read)
            echo "cached $c $depth $r" | tee -a "$out"
        done
    done
    for c in $(lc_configs); do
        "$bin" status --json --control "$dir/$(lc_name "$c").ctl" | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
print("# cached %s: read_hits_full %d read_misses_full %d read_misses_partial %d" % (sys.argv[1],
      s.get("read_hits_full", -1), s.get("read_misses_full", -1), s.get("read_misses_partial", -1)))' "$c" | tee -a "$out"
    done
fi

if phase drain; then
    # Background writeback off: the write job only fills the cache; drain does all of it.
    for round in $(seq 1 "$DRAIN_ROUNDS"); do
        for job in "randwrite 4k 32m" "write 1m 256m"; do
            read -r rw bs io <<<"$job"
            lc_restart --set writeback_threshold_percent=100 --set writeback_idle_ms=0
            for c in rbd-alone $(lc_configs); do
                # shellcheck disable=SC2046
                r=$(CEPH_CONF=$dir/nocache.conf fio --name=m "--rw=$rw" "--bs=$bs" \
                    --iodepth=32 --size=512m "--io_size=$io" --randrepeat=0 \
                    --output-format=json $(target "$c") | summary "$rw")
                name=$(lc_name "$c")
                if [ -z "$name" ]; then
                    mbps=${r%% *}
                    echo "drain $c $round $rw $bs - - $mbps" | tee -a "$out"
                    continue
                fi
                dirty=$("$bin" status --json --control "$dir/$name.ctl" |
                    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["dirty_blocks"])')
                t0=$(date +%s.%N)
                "$bin" drain --control "$dir/$name.ctl" >/dev/null 2>>"$dir/drain.log"
                t1=$(date +%s.%N)
                /usr/bin/python3 -c '
import sys
c, rnd, rw, bs, dirty, t0, t1 = sys.argv[1:]
b = int(dirty) * 4096
s = float(t1) - float(t0)
print("drain %s %s %s %s %.1f %.2f %.1f" % (c, rnd, rw, bs, b / 2**20, s, b / s / 1e6))' \
                    "$c" "$round" "$rw" "$bs" "$dirty" "$t0" "$t1" | tee -a "$out"
            done
        done
    done
fi
echo "# done $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
