#!/usr/bin/env bash
# The cost of TLS: fio's nbd engine (libnbd, GnuTLS) against `logcache serve` and qemu-nbd, each
# with and without TLS (X.509, a test CA made here with certtool), on TCP loopback: 4 KiB random
# writes (iodepth 64) and 1 MiB sequential reads (iodepth 8) over a prefilled 256 MiB region.
# The four servers are measured in turn within each run, runs alternated, so all see the same
# machine. logcache: a 2 GiB cache file in front of an 8 GiB sparse backing file; one server with
# `--tls on` serves both the plain and the TLS client. qemu-nbd: raw sparse 8 GiB files, one
# instance in the clear and one with `--tls-creds` (qemu-nbd has no optional TLS).
#
# fio's nbd engine does not let a URI name local files (tls-certificates=), so the CA goes where
# libnbd looks by default: $HOME/.pki/libnbd/ca-cert.pem, with HOME pointing into the temp dir.
#
# usage: scripts/bench-tls.sh [RUNS] [SECONDS]
set -euo pipefail
runs=${1:-3}
secs=${2:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release/logcache
[ -x "$bin" ] || (cd "$root" && cargo build --release -q -p logcache)
dir=$(mktemp -d /var/tmp/lctls.XXXXXX)
pids=()
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
pki=$dir/pki
mkdir -p "$pki" "$dir/home/.pki/libnbd"
certtool --generate-privkey --outfile "$pki/ca-key.pem" 2>/dev/null
printf 'cn = bench CA\nca\ncert_signing_key\nexpiration_days = 2\n' >"$dir/ca.info"
certtool --generate-self-signed --load-privkey "$pki/ca-key.pem" --template "$dir/ca.info" \
    --outfile "$pki/ca-cert.pem" 2>/dev/null
certtool --generate-privkey --outfile "$pki/server-key.pem" 2>/dev/null
printf 'cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\nencryption_key\nsigning_key\nexpiration_days = 2\n' >"$dir/server.info"
certtool --generate-certificate --load-ca-certificate "$pki/ca-cert.pem" \
    --load-ca-privkey "$pki/ca-key.pem" --load-privkey "$pki/server-key.pem" \
    --template "$dir/server.info" --outfile "$pki/server-cert.pem" 2>/dev/null
cp "$pki/ca-cert.pem" "$dir/home/.pki/libnbd/"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
truncate -s 2G "$dir/cache.img"
truncate -s 8G "$dir/lc-backing.img" "$dir/q-plain.img" "$dir/q-tls.img"
"$bin" format --cache "$dir/cache.img" --backing "$dir/lc-backing.img" >/dev/null
lport=$(port); qport=$(port); qtport=$(port)
"$bin" serve --cache "$dir/cache.img" --backing "$dir/lc-backing.img" --socket "$dir/lc.sock" \
    --listen "127.0.0.1:$lport" --tls on --tls-certificates "$pki" >"$dir/serve.log" 2>&1 &
pids+=($!)
qemu-nbd -f raw -t -e 8 -b 127.0.0.1 -p "$qport" "$dir/q-plain.img" >/dev/null 2>&1 &
pids+=($!)
qemu-nbd -f raw -t -e 8 -b 127.0.0.1 -p "$qtport" \
    --object "tls-creds-x509,id=tls0,endpoint=server,dir=$pki,verify-peer=no" --tls-creds tls0 \
    "$dir/q-tls.img" >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [ -S "$dir/lc.sock" ] && break; sleep 0.1; done
sleep 1
declare -A uri=(
    [logcache]="nbd://127.0.0.1:$lport"
    [logcache-tls]="nbds://localhost:$lport"
    [qemu-nbd]="nbd://127.0.0.1:$qport"
    [qemu-nbd-tls]="nbds://localhost:$qtport"
)
targets=(logcache logcache-tls qemu-nbd qemu-nbd-tls)
fio_run() { # uri rw bs depth seconds(0: not time based) -> iops
    local extra=(--time_based "--runtime=$5")
    [ "$5" = 0 ] && extra=()
    HOME=$dir/home fio --name=j --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth="$4" \
        --size=256m "${extra[@]}" --output-format=json --output="$dir/fio.json" >/dev/null 2>&1
    python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))' "$dir/fio.json"
}
for t in "${targets[@]}"; do fio_run "${uri[$t]}" write 1m 8 0 >/dev/null; done
"$bin" drain --control "$dir/cache.img.ctl" >/dev/null 2>&1
echo "date: $(date -u '+%F %H:%M') UTC, machine: $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
echo "fio nbd engine over TCP loopback, ${secs}s per run; IOPS"
printf '%-4s %-22s %10s %13s %10s %13s %9s %9s\n' run job logcache logcache-tls qemu-nbd qemu-nbd-tls 'lc-tls/q-tls' 'lc-tls/lc'
for i in $(seq 1 "$runs"); do
    for job in "randwrite 4k 64" "read 1m 8"; do
        read -r rw bs depth <<<"$job"
        declare -A r=()
        # Alternate the order between runs.
        order=("${targets[@]}")
        [ $((i % 2)) = 0 ] && order=(qemu-nbd-tls qemu-nbd logcache-tls logcache)
        for t in "${order[@]}"; do
            r[$t]=$(fio_run "${uri[$t]}" "$rw" "$bs" "$depth" "$secs")
            # Writeback after a logcache write run must not steal CPU from the next run.
            [[ $t == logcache* ]] && "$bin" drain --control "$dir/cache.img.ctl" >/dev/null 2>&1
        done
        printf '%-4s %-22s %10s %13s %10s %13s %9.2f %9.2f\n' "$i" "$rw $bs qd$depth" \
            "${r[logcache]}" "${r[logcache-tls]}" "${r[qemu-nbd]}" "${r[qemu-nbd-tls]}" \
            "$(python3 -c "print(${r[logcache-tls]}/${r[qemu-nbd-tls]})")" \
            "$(python3 -c "print(${r[logcache-tls]}/${r[logcache]})")"
    done
done
