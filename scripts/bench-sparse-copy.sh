#!/usr/bin/env bash
# Sparse copy (issue 26): `nbdcopy URI null:` of a mostly empty disk, served by logcache and by
# qemu-nbd from the same sparse backing file, alternated ROUNDS times. Both answer block status,
# so nbdcopy reads only the data. Prints one JSON object per copy: wall time, the bytes the
# server sent (counted by a relay on a second, untimed copy: the relay's own cost stays out of
# the wall time), and for logcache the bytes the engine read for clients (`read_bytes` in
# `logcache status --json`).
#
# usage: scripts/bench-sparse-copy.sh [DISK_GIB=16] [DATA_MIB=100] [ROUNDS=3] [DIR=/var/tmp]
# (LOGCACHE_BIN picks the binary.)
set -euo pipefail
gib=${1:-16}
data_mib=${2:-100}
rounds=${3:-3}
base=${4:-/var/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
bin=${LOGCACHE_BIN:-$root/target/release/logcache}
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
dir=$(mktemp -d "$base/lcsparse.XXXXXX")
pid=
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
    [ -n "${relay_pid:-}" ] && kill "$relay_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
now_ms() { date +%s%3N; }
truncate -s "${gib}G" "$dir/backing.img"
truncate -s 1G "$dir/cache.img"
# DATA_MIB pieces of 1 MiB spread evenly over the disk.
stride_mib=$((gib * 1024 / data_mib))
for i in $(seq 0 $((data_mib - 1))); do
    dd if=/dev/urandom of="$dir/backing.img" bs=1M count=1 seek=$((i * stride_mib)) \
        conv=notrunc status=none
done
"$bin" format --cache "$dir/cache.img" --backing "$dir/backing.img" >/dev/null
sock="$dir/nbd.sock"
uri="nbd+unix:///?socket=$sock"
stop() { kill -TERM "$pid"; wait "$pid" || true; pid=; rm -f "$sock"; }
read_bytes() {
    "$bin" status --control "$dir/cache.img.ctl" --json |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["engine"]["read_bytes"] if "engine" in d else d["read_bytes"])'
}
copy() { # $1: server name; prints wall ms
    local t0
    t0=$(now_ms)
    nbdcopy "$uri" null:
    echo $(($(now_ms) - t0))
}
# A Unix-socket relay in front of the server that counts the bytes the server sends (every
# connection nbdcopy opens); writes the total to $dir/sent once the last connection closed.
cat >"$dir/relay.py" <<'PY'
import os, socket, sys, threading
listen_path, server_path, out_path = sys.argv[1:4]
lock = threading.Lock()
state = {"sent": 0, "active": 0, "seen": 0}
def pump(src, dst, count):
    try:
        while True:
            data = src.recv(1 << 20)
            if not data:
                break
            dst.sendall(data)
            if count:
                with lock:
                    state["sent"] += len(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
def serve(client):
    upstream = socket.socket(socket.AF_UNIX)
    upstream.connect(server_path)
    back = threading.Thread(target=pump, args=(upstream, client, True))
    back.start()
    pump(client, upstream, False)
    back.join()
    with lock:
        state["active"] -= 1
        if state["active"] == 0:
            with open(out_path + ".tmp", "w") as f:
                f.write(str(state["sent"]))
            os.replace(out_path + ".tmp", out_path)
listener = socket.socket(socket.AF_UNIX)
listener.bind(listen_path)
listener.listen(16)
while True:
    conn, _ = listener.accept()
    with lock:
        state["active"] += 1
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
PY
relay_pid=
sent_bytes() { # the bytes the server sent during one copy through the relay
    local relay_sock="$dir/relay.sock"
    rm -f "$relay_sock" "$dir/sent"
    /usr/bin/python3 "$dir/relay.py" "$relay_sock" "$sock" "$dir/sent" &
    relay_pid=$!
    until [ -S "$relay_sock" ]; do sleep 0.02; done
    nbdcopy "nbd+unix:///?socket=$relay_sock" null:
    until [ -s "$dir/sent" ]; do sleep 0.02; done
    kill "$relay_pid"; wait "$relay_pid" 2>/dev/null || true; relay_pid=
    cat "$dir/sent"
}
for round in $(seq 1 "$rounds"); do
    "$bin" serve --cache "$dir/cache.img" --backing "$dir/backing.img" --socket "$sock" \
        >>"$dir/serve.log" 2>&1 &
    pid=$!
    wait_nbd "$uri" "$pid" "$dir/serve.log"
    before=$(read_bytes)
    ms=$(copy logcache)
    after=$(read_bytes)
    sent=$(sent_bytes)
    stop
    echo "{\"server\":\"logcache\",\"round\":$round,\"disk_gib\":$gib,\"data_mib\":$data_mib,\"wall_ms\":$ms,\"sent_bytes\":$sent,\"read_bytes\":$((after - before))}"
    qemu-nbd --read-only --persistent --format=raw --socket="$sock" "$dir/backing.img" \
        >>"$dir/serve.log" 2>&1 &
    pid=$!
    wait_nbd "$uri" "$pid" "$dir/serve.log"
    ms=$(copy qemu-nbd)
    sent=$(sent_bytes)
    stop
    echo "{\"server\":\"qemu-nbd\",\"round\":$round,\"disk_gib\":$gib,\"data_mib\":$data_mib,\"wall_ms\":$ms,\"sent_bytes\":$sent}"
done
