#!/usr/bin/env bash
# Stops the Ceph cluster that scripts/ceph-up.sh started in DIR and removes DIR.
#
#   scripts/ceph-down.sh DIR
#
# SIGKILL to the OSD and the monitor (by their pid files under DIR/run), then `rm -rf DIR`: the
# cluster's data goes with DIR, so there is nothing to shut down cleanly (SIGTERM takes 4-7 s).
# Safe to run on a half-started cluster.
set -uo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
dir=$1
if [ ! -d "$dir" ]; then
    exit 0
fi
if [ ! -f "$dir/ceph.conf" ]; then
    echo "ceph-down: $dir has no ceph.conf; not a directory of scripts/ceph-up.sh, left alone" >&2
    exit 1
fi
dir=$(cd "$dir" && pwd)

for pidfile in "$dir"/run/*.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    # Only a Ceph daemon whose command line names this cluster's config: a stale pid file
    # must not kill an unrelated process that reused the pid.
    if [ -n "$pid" ] && grep -qa -- "$dir/ceph.conf" "/proc/$pid/cmdline" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        # Wait for it to go (it is not our child: poll), so that DIR can be removed.
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
    fi
done
# A daemon whose pid file was not written yet (killed mid-start) or was removed is found by its
# command line instead: the OSD once outlived its cluster this way.
for pid in $(pgrep -f -- "-c $dir/ceph.conf" 2>/dev/null); do
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
    ceph-mon | ceph-osd) kill -KILL "$pid" 2>/dev/null ;;
    esac
done
rm -rf "$dir"
