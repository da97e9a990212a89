#!/bin/sh
# mkfs.xfs and mkfs.ext4 (their default discard) of a 16 GiB disk: through logcache in front of
# the emulated HDD (logcache-bench sim-hdd, an emulation) vs the emulated HDD alone, alternated.
# Each disk is attached with nbdfuse + losetup (no nbd kernel module here).
#
#   scripts/bench-mkfs.sh [ROUNDS]      (release binaries in target/release; needs root)
#
# BIN=DIR takes logcache and logcache-bench from DIR; SIZE (default 16G) is the disk's size,
# CACHE_SIZE (default 2G) the cache file's (bench/run's `mkfs` experiment sets them).
#
# Prints one line per run: "<fs> <hdd|logcache> <seconds>".
set -eu
rounds=${1:-2}
bin=${BIN:-target/release}
dir=$(mktemp -d /var/tmp/bench-mkfs.XXXXXX)
size=${SIZE:-16G}
hdd_sock=$dir/hdd.sock
lc_sock=$dir/lc.sock
pids=""

cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    sleep 1
    fusermount3 -u "$dir/mnt" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
# KEEP=1 keeps the logs (mkfs output, discard support of each loop device) in $dir.
[ -z "${KEEP:-}" ] || trap 'for p in $pids; do kill "$p" 2>/dev/null || true; done; echo "logs in $dir" >&2' EXIT

wait_for() { # file
    i=0
    while [ ! -s "$1" ] && [ ! -S "$1" ]; do
        i=$((i + 1)); [ $i -lt 600 ] || { echo "bench-mkfs: $1 never appeared" >&2; exit 1; }
        sleep 0.1
    done
}

# Times mkfs.$1 on the NBD export $2.
mkfs_on() {
    mkdir -p "$dir/mnt"
    rm -f "$dir/fuse.pid"
    nbdfuse -P "$dir/fuse.pid" "$dir/mnt/disk" "$2" </dev/null >"$dir/fuse.log" 2>&1 &
    fuse=$!
    wait_for "$dir/fuse.pid"
    loop=$(losetup -f --show "$dir/mnt/disk")
    echo "discard_max_bytes $(cat /sys/block/"${loop#/dev/}"/queue/discard_max_bytes)" >>"$dir/mkfs.log"
    start=$(date +%s.%N)
    case $1 in
        xfs) mkfs.xfs -f "$loop" >>"$dir/mkfs.log" 2>&1 ;;
        ext4) mkfs.ext4 -F "$loop" >>"$dir/mkfs.log" 2>&1 ;;
    esac
    end=$(date +%s.%N)
    losetup -d "$loop"
    fusermount3 -u "$dir/mnt"
    wait "$fuse" || true
    awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f\n", e - s }'
}

"$bin/logcache-bench" sim-hdd --file "$dir/hdd.img" --size $size --socket "$hdd_sock" \
    >"$dir/hdd.log" 2>&1 &
pids="$pids $!"
wait_for "$hdd_sock"
hdd_uri="nbd+unix:///?socket=$hdd_sock"
truncate -s "${CACHE_SIZE:-2G}" "$dir/cache.img"

for r in $(seq "$rounds"); do
    for fs in xfs ext4; do
        echo "$fs hdd $(mkfs_on $fs "$hdd_uri")"
        "$bin/logcache" format --cache "$dir/cache.img" --backing "$hdd_uri" --force \
            >"$dir/format.log" 2>&1
        rm -f "$lc_sock"
        "$bin/logcache" serve --cache "$dir/cache.img" --backing "$hdd_uri" --socket "$lc_sock" \
            >"$dir/serve.log" 2>&1 &
        lc=$!
        wait_for "$lc_sock"
        echo "$fs logcache $(mkfs_on $fs "nbd+unix:///?socket=$lc_sock")"
        kill "$lc"
        wait "$lc" || true
    done
done
