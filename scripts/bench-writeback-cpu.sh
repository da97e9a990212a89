#!/usr/bin/env bash
# The server's CPU per block written back (issue 20's read tail: writeback's CPU is CPU a
# foreground reader waits for on a small machine). Alternated ROUNDS times between LOGCACHE_BIN
# (case A) and LOGCACHE_BIN_B (case B): a fresh logcache over an EMULATED 7200 rpm disk
# (`logcache-bench sim-hdd`, its file in HDD_DIR, default /dev/shm), FILL_MIB of 4 KiB random
# writes (fio nbd, iodepth 16) over a 256 MiB region, then `logcache drain`: the process's CPU
# time over the drain (utime + stime, /proc/PID/stat: exited threads included), divided by the
# blocks written back during it (status). Prints one JSON line per drain and the
# medians. BATCH_BLOCKS sets `writeback_batch_blocks` (default: the tunable's default, 4096):
# small batches (16) show writeback's cost per batch (threads woken or started, the sync).
#
# usage: scripts/bench-writeback-cpu.sh [ROUNDS=3] [FILL_MIB=128] [DIR=/var/tmp]
set -euo pipefail
rounds=${1:-3}
fill_mib=${2:-128}
base=${3:-/var/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/lib/bench.sh"
bin_a=${LOGCACHE_BIN:-$root/target/release/logcache}
bin_b=${LOGCACHE_BIN_B:?give LOGCACHE_BIN_B, the binary to compare with}
dir=$(mktemp -d "$base/lcwbcpu.XXXXXX")
hdd_dir=$(mktemp -d "${HDD_DIR:-/dev/shm}/lcwbcpu-hdd.XXXXXX")
pids=()
cleanup() {
    kill_and_remove "$dir" "${pids[@]}"
    rm -rf "$hdd_dir"
}
trap cleanup EXIT
# CPU ticks (utime + stime) of process $1, its exited threads included.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
written_back() {
    "$1" status --control "$dir/lc.ctl" --json |
        /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["writeback_blocks"])'
}
hz=$(getconf CLK_TCK)
results="$dir/results.jsonl"
for round in $(seq 1 "$rounds"); do
    for c in $(rotate "$((round - 1))" A B); do
        bin=$bin_a
        [ "$c" = B ] && bin=$bin_b
        start_sim_hdd "$(dirname "$bin")/logcache-bench" "$hdd_dir/hdd.img" 8G "$dir/hdd.sock" \
            "$dir/hdd.log"
        hdd_pid=$sim_hdd_pid
        lc_serve_fresh "$bin" "$dir" lc "nbd+unix:///?socket=$dir/hdd.sock" \
            ${BATCH_BLOCKS:+--set writeback_batch_blocks=$BATCH_BLOCKS}
        pids=("$hdd_pid" "$lc_lc")
        fio --name=fill --ioengine=nbd --uri="nbd+unix:///?socket=$dir/lc.sock" --rw=randwrite \
            --bs=4k --iodepth=16 --size=256M --io_size="${fill_mib}M" --norandommap \
            --randrepeat=0 --output-format=terse >/dev/null
        wb0=$(written_back "$bin")
        t0=$(cpu_ticks "$lc_lc")
        w0=$(date +%s.%N)
        "$bin" drain --control "$dir/lc.ctl" >/dev/null 2>&1
        w1=$(date +%s.%N)
        t1=$(cpu_ticks "$lc_lc")
        wb1=$(written_back "$bin")
        load=$(cut -d' ' -f1 /proc/loadavg)
        /usr/bin/python3 -c '
import json, sys
c, r, t0, t1, wb0, wb1, w0, w1, hz, load = sys.argv[1:]
blocks = int(wb1) - int(wb0)
cpu_s = (int(t1) - int(t0)) / int(hz)
print(json.dumps({"case": c, "round": int(r), "blocks": blocks, "drain_s": round(float(w1) - float(w0), 2),
                  "cpu_s": round(cpu_s, 2), "cpu_us_per_block": round(cpu_s * 1e6 / max(blocks, 1), 1),
                  "load1": float(load)}))' \
            "$c" "$round" "$t0" "$t1" "$wb0" "$wb1" "$w0" "$w1" "$hz" "$load" |
            tee -a "$results"
        kill "$lc_lc" "$hdd_pid" 2>/dev/null || true
        wait "$lc_lc" "$hdd_pid" 2>/dev/null || true
        pids=()
        rm -f "$hdd_dir/hdd.img"
    done
done
/usr/bin/python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| case | rounds | blocks written back (median) | drain s | CPU µs per block, median (per round) | load (1 min) |")
print("|---|---:|---:|---:|---|---|")
for case in ("A", "B"):
    rs = sorted((r for r in rows if r["case"] == case), key=lambda r: r["round"])
    med = lambda k: statistics.median(r[k] for r in rs)
    per = " ".join(f"{r['cpu_us_per_block']}" for r in rs)
    loads = " ".join(f"{r['load1']:.1f}" for r in rs)
    print(f"| {case} | {len(rs)} | {med('blocks'):,.0f} | {med('drain_s'):.2f} | "
          f"**{med('cpu_us_per_block'):.1f}** ({per}) | {loads} |")
EOF
