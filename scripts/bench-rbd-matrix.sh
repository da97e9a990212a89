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
# usage: scripts/bench-rbd-matrix.sh [SECONDS] [OUT]
#   env: BS="4k 64k 1m 4m" RW="randwrite write randread read" DEPTHS="1 32" BG="0 4 16"
#        CONFIGS="rbd-alone qnbd-none qnbd-wb lc-native lc-qnbd"
# Prints one line per run (and appends it to OUT, default /var/tmp/rbd-matrix.txt):
#   matrix CONFIG RW BS IODEPTH MBps IOPS p99_us p99.9_us
#   latency CONFIG BGJOBS fg_IOPS fg_p99_us fg_p99.9_us fg_max_us
set -euo pipefail
secs=${1:-5}
out=${2:-/var/tmp/rbd-matrix.txt}
BS=${BS:-4k 64k 1m 4m}
RW=${RW:-randwrite write randread read}
DEPTHS=${DEPTHS:-1 32}
BG=${BG:-0 4 16}
CONFIGS=${CONFIGS:-rbd-alone qnbd-none qnbd-wb lc-native lc-qnbd}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release/logcache
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
"$root/scripts/install-qemu-rbd.sh"

dir=$(mktemp -d /var/tmp/lcrbdm.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}" ${lc_native:-} ${lc_qnbd:-}; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    "$root/scripts/ceph-down.sh" "$dir/ceph" || true
    rm -rf "$dir"
}
trap cleanup EXIT

conf=$("$root/scripts/ceph-up.sh" "$dir/ceph" 2>/dev/null | tail -n 1)
for img in raw qn qw lc lq; do
    rbd -c "$conf" create --size 1G "rbd/$img"
    rbd -c "$conf" bench --io-type write --io-size 4M --io-threads 4 --io-total 512M \
        --io-pattern seq "rbd/$img" >/dev/null
done
cp "$conf" "$dir/nocache.conf"
printf '[client]\nrbd cache = false\n' >>"$dir/nocache.conf"

# qemu-nbd: the NBD route. -t: stay up across client disconnects.
qnbd() { # IMAGE CACHE SOCKET
    qemu-nbd -f raw -t --discard=unmap --cache="$2" -k "$3" "rbd:rbd/$1:conf=$conf" \
        >"$dir/qemu-nbd-$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 300); do [ -S "$3" ] && return 0; sleep 0.1; done
    echo "bench-rbd-matrix: qemu-nbd on $1 did not start:" >&2
    cat "$dir/qemu-nbd-$1.log" >&2
    exit 1
}
qnbd qn none "$dir/qn.sock"
qnbd qw writeback "$dir/qw.sock"
qnbd lq none "$dir/lq.sock"

native_spec="rbd:rbd/lc?conf=$conf"
qnbd_spec="nbd+unix:///?socket=$dir/lq.sock"
# lc_start NAME SPEC [SET...]: format NAME's cache anew over SPEC and serve it; sets lc_<NAME>.
lc_start() {
    local name=$1 spec=$2 pid
    shift 2
    truncate -s 4G "$dir/$name.img"
    "$bin" format --force --cache "$dir/$name.img" --backing "$spec" >/dev/null
    rm -f "$dir/$name.sock"
    "$bin" serve --cache "$dir/$name.img" --backing "$spec" --socket "$dir/$name.sock" \
        --control "$dir/$name.ctl" "$@" >>"$dir/$name.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do [ -S "$dir/$name.sock" ] && break; sleep 0.1; done
    [ -S "$dir/$name.sock" ] || { echo "bench-rbd-matrix: logcache $name did not start" >&2; cat "$dir/$name.log" >&2; exit 1; }
    printf -v "lc_$name" '%s' "$pid"
}
lc_stop() { # NAME: drain (nothing may be lost by the next format), then stop
    local name=$1 pidvar="lc_$1"
    "$bin" drain --control "$dir/$name.ctl" >/dev/null 2>&1
    kill "${!pidvar}"
    wait "${!pidvar}" 2>/dev/null || true
    printf -v "lc_$name" '%s' ""
}
lc_start native "$native_spec"
lc_start qnbd "$qnbd_spec"

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
    esac
}
lc_name() { case $1 in lc-native) echo native ;; lc-qnbd) echo qnbd ;; *) echo "" ;; esac; }

echo "# $(date -u +%FT%TZ) secs=$secs BS=($BS) RW=($RW) DEPTHS=($DEPTHS) BG=($BG) load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
reads_started=0
for rw in $RW; do
    if [[ $rw == *read* ]] && [ $reads_started -eq 0 ]; then
        # Every read from here on is a miss: fresh caches, read_cache off.
        reads_started=1
        lc_stop native
        lc_stop qnbd
        lc_start native "$native_spec" --set read_cache=off
        lc_start qnbd "$qnbd_spec" --set read_cache=off
    fi
    for bs in $BS; do
        for depth in $DEPTHS; do
            for c in $CONFIGS; do
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

# Seed 004: one foreground 4 KiB random writer at iodepth 1, with N background jobs of 4 KiB
# random writes at iodepth 8 in another region of the same disk; the foreground's latency.
if [ $reads_started -eq 1 ]; then
    lc_stop native
    lc_stop qnbd
    lc_start native "$native_spec"
    lc_start qnbd "$qnbd_spec"
fi
for n in $BG; do
    for c in $CONFIGS; do
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
echo "# done $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
