#!/usr/bin/env bash
# Starts a throwaway one-monitor, one-OSD Ceph cluster in DIR, run directly (no systemd), for
# tests and benchmarks of the RBD backing; scripts/ceph-down.sh DIR stops it and removes DIR.
#
#   scripts/ceph-up.sh DIR [IMAGE SIZE]   e.g. scripts/ceph-up.sh /tmp/ceph img 1G
#
# Prints the cluster's config path on the last line of stdout (DIR/ceph.conf); clients use it as
# `ceph -c DIR/ceph.conf`, `rbd -c DIR/ceph.conf`, or `--backing rbd:rbd/IMAGE?conf=DIR/ceph.conf`.
#
# The cluster is as small as Ceph allows: auth none, the monitor on a free loopback port, pool
# `rbd` of size 1, no manager (pools, `rbd pool init`, `rbd create` and IO do not need one). The
# OSD is BlueStore on a sparse 20 GiB file with `osd memory target` 1 GiB: memstore keeps every
# object in RAM and grew to several GB after 2 GiB of writes. Every path (run, admin sockets,
# logs, data) is under DIR; the client admin socket's name carries `$pid` so that a killed client
# does not leave a socket that breaks the next command.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -eq 2 ] || [ $# -gt 3 ]; then
    echo "usage: $0 DIR [IMAGE SIZE]" >&2
    exit 2
fi
dir=$1
image=${2:-}
image_size=${3:-}
# Wait limits: generous, a shared 2-core machine under load is slow, but a broken cluster must
# fail the caller, not hang it.
WAIT_S=${CEPH_UP_WAIT_S:-120}

for tool in ceph-mon ceph-osd ceph monmaptool ceph-authtool rbd uuidgen; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ] && [ ! -x "/usr/bin/$tool" ]; then
        echo "ceph-up: $tool is missing; run scripts/setup.sh (installs ceph-mon ceph-osd ceph-common)" >&2
        exit 1
    fi
done
export PATH="$PATH:/usr/sbin:/sbin"

if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    echo "ceph-up: $dir exists and is not empty; run scripts/ceph-down.sh $dir first" >&2
    exit 1
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
# A cluster that failed to start is stopped and removed, its logs shown first: a half-started
# cluster must not outlive the caller.
on_exit() {
    local rc=$?
    if [ $rc -ne 0 ]; then
        echo "ceph-up: starting the cluster failed; the daemons' logs:" >&2
        tail -n 20 "$dir"/log/*.log >&2 2>/dev/null || true
        "$(dirname "$0")/ceph-down.sh" "$dir" || true
    fi
    exit $rc
}
trap on_exit EXIT
mkdir -p "$dir/run" "$dir/log" "$dir/mon" "$dir/osd/ceph-0"

# A free loopback port for the monitor: ask the kernel for one.
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
fsid=$(uuidgen)
conf="$dir/ceph.conf"
cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
ms bind msgr1 = false
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 2
# A throwaway monitor's store is a few MB: without this it refuses to start when the disk is
# 95% full (seen here at 2% free on a shared machine), failing every test that needs it; -1,
# not 0, because below 1% free the free share rounds down to 0, which 0 still refuses.
mon data avail crit = -1
log to stderr = false
err to stderr = false
osd crush chooseleaf type = 0
run dir = $dir/run
admin socket = $dir/run/\$cluster-\$name.\$pid.asok
log file = $dir/log/\$cluster-\$name.log
pid file = $dir/run/\$cluster-\$name.pid
keyring = $dir/keyring
mon data = $dir/mon/\$cluster-\$name
osd data = $dir/osd/\$cluster-\$id
osd objectstore = bluestore
osd memory target = 1073741824
# How long the OSD waits for a client's watch ping before it counts the client as gone: a client
# that died (SIGKILL) holds the image's exclusive lock until then, so a restarted logcache waits
# that long for it. Default 30 s; 5 s keeps the SIGKILL tests short.
osd client watch timeout = 5
bluestore block create = true
bluestore block size = 21474836480
bluestore fsck on mount = false
EOF
# Extra [global] lines, e.g. CEPH_UP_EXTRA_CONF=$'debug osd = 10\ndebug ms = 1', to look into a
# failure (the logs are under DIR/log).
if [ -n "${CEPH_UP_EXTRA_CONF:-}" ]; then
    printf '%s\n' "$CEPH_UP_EXTRA_CONF" >>"$conf"
fi

# The monitor: a monmap with one monitor at our port, a keyring (mkfs wants one even with auth
# none), then the daemon (it daemonizes and writes its pid file).
ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring"
ceph-mon -c "$conf" -i a

ceph_cmd() { timeout "$WAIT_S" ceph -c "$conf" --connect-timeout "$WAIT_S" "$@"; }

# The OSD: an id from the monitor, a BlueStore on a sparse file, then the daemon.
osd_uuid=$(uuidgen)
osd_id=$(ceph_cmd osd create "$osd_uuid")
if [ "$osd_id" != 0 ]; then
    echo "ceph-up: the monitor gave OSD id $osd_id, expected 0" >&2
    exit 1
fi
ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$dir/log/osd-mkfs.out" 2>&1 || {
    echo "ceph-up: ceph-osd --mkfs failed:" >&2
    cat "$dir/log/osd-mkfs.out" >&2
    exit 1
}
ceph-osd -c "$conf" -i 0

# Pool `rbd` (size 1 by the defaults above), initialized for RBD: `rbd pool init` returns once
# the pool's placement groups are active, i.e. the OSD is up and serving.
ceph_cmd osd pool create rbd 8 8 >/dev/null 2>&1
timeout "$WAIT_S" rbd -c "$conf" pool init rbd
if [ -n "$image" ]; then
    timeout "$WAIT_S" rbd -c "$conf" create --size "$image_size" "rbd/$image"
fi
echo "$conf"
