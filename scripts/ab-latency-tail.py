#!/usr/bin/python3
"""An A/B of builds (or settings) on the `latency` experiment's goal job (issue 20: foreground
read p99.9 with writeback running), alternated, against the device alone in the same rounds.

Each case runs once per round, the order rotated each round (round N starts at its N-th case):
a fresh logcache (write-back, `writeback_threshold_percent=0`, a 4 GiB fallocated cache file on
/var/tmp, the emulated HDD `logcache-bench sim-hdd` on /dev/shm) whose 64 MiB foreground region
is written first, then one fio run of `latency`'s job: foreground 4 KiB randrw 50/50 at
iodepth 1, BG background jobs (4 KiB randrw 50/50, iodepth 4, each on its own region), one NBD
connection per job. The case `device` is the same job with fio's io_uring engine and O_DIRECT on
a file on /var/tmp, its background jobs held to the IOPS the first case's latest run reached
(as `latency` does). Per run it prints one JSON line: the foreground's read and write p99.9 (µs,
fio's total latency), reads over 1 ms per 10,000, the background IOPS, the blocks written back
during the job (status) and, per background thread of the server, its CPU ms, context switches
and nice values (/proc/PID/task). Then per case the median p99.9, the median of per-round
ratios to the device, the median read p50, and each case against the first (read p99.9 and
p50), round by round.

A case is NAME=BIN[,set=KEY=VALUE+KEY=VALUE][,renice=N:COMM+COMM]: BIN is a `logcache` binary
(`logcache-bench` beside it), `set` extra `--set`s (after the threshold's, so they override it),
`renice` sets nice N on the server's threads whose name starts with one of the COMMs, 0.5 s
into the job (writeback's helpers start with its first batch).

usage: scripts/ab-latency-tail.py BG ROUNDS RUNTIME_S OUTDIR CASE... [device]
e.g.   scripts/ab-latency-tail.py 16 8 3 /tmp/ab A=/tmp/a/logcache B=/tmp/b/logcache device
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

if len(sys.argv) < 6 or not all(a.isdigit() for a in sys.argv[1:4]):
    sys.exit("usage: scripts/ab-latency-tail.py BG ROUNDS RUNTIME_S OUTDIR CASE... [device]")
bg, rounds, secs, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cases = sys.argv[5:]
if cases[0] == "device" or not any(c != "device" for c in cases):
    # The device's background jobs take the first case's IOPS: that case must run before it.
    sys.exit("ab-latency-tail: give a logcache case first; `device` follows the cases it copies")
os.makedirs(out, exist_ok=True)
R = 64 << 20
tmp = tempfile.mkdtemp(dir="/var/tmp", prefix="tailab.")
shm = tempfile.mkdtemp(dir="/dev/shm", prefix="tailab.")
dev = os.path.join(tmp, "dev.img")
subprocess.run(["fallocate", "-l", str(R * (1 + max(bg, 1))), dev], check=True)
subprocess.run(["fio", "--name=p", "--ioengine=io_uring", f"--filename={dev}", "--rw=write", "--bs=1m",
                "--iodepth=16", f"--size={R}", "--direct=1", "--output-format=terse"], check=True, stdout=subprocess.DEVNULL)
procs = []
def cleanup():
    for p in procs:
        try: p.kill(); p.wait()
        except Exception: pass
    shutil.rmtree(tmp, True); shutil.rmtree(shm, True)
def wait_sock(path, p):
    for _ in range(600):
        if os.path.exists(path): return
        if p.poll() is not None: raise SystemExit(f"died {path}")
        time.sleep(0.05)
def status(binp, ctl):
    return json.loads(subprocess.run([binp, "status", "--control", ctl, "--json"], capture_output=True, text=True).stdout)
def threads(pid):
    d = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = open(f"/proc/{pid}/task/{t}/comm").read().strip()
            st = open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
            cpu = int(st[11]) + int(st[12])
            sw = sum(int(l.split()[1]) for l in open(f"/proc/{pid}/task/{t}/status") if "ctxt_switches" in l)
            d[t] = (comm, cpu, sw, int(st[16]))
        except OSError: pass
    return d
def fio_args(target, rate=None):
    a = ["fio", *target, "--direct=1", "--norandommap", "--randrepeat=0", "--time_based", f"--runtime={secs}", "--bs=4k",
         "--lat_percentiles=1", "--percentile_list=50:99:99.9", "--output-format=json+",
         "--name=fg", "--rw=randrw", "--rwmixread=50", "--iodepth=1", f"--size={R}", "--offset=0"]
    if bg:
        a += ["--name=bg", "--new_group", "--rw=randrw", "--rwmixread=50", "--iodepth=4", f"--numjobs={bg}",
              f"--size={R}", f"--offset={R}", f"--offset_increment={R}"]
        if rate: a += [f"--rate_iops={rate},{rate}"]
    return a
def run_fio(a, outf):
    subprocess.run(a + [f"--output={outf}"], check=True, stdout=subprocess.DEVNULL)
    t = open(outf).read(); j = json.loads(t[t.find("{"):])
    fg = [x for x in j["jobs"] if x["jobname"] == "fg"][0]
    bgi = sum(x[s]["iops"] for x in j["jobs"] if x["jobname"] == "bg" for s in ("read", "write"))
    over = sum(v for k, v in fg["read"]["lat_ns"]["bins"].items() if int(k) > 1_000_000)
    return {"rp999": fg["read"]["lat_ns"]["percentile"]["99.900000"] / 1000,
            "wp999": fg["write"]["lat_ns"]["percentile"]["99.900000"] / 1000,
            "rp50": fg["read"]["lat_ns"]["percentile"]["50.000000"] / 1000,
            "reads": fg["read"]["total_ios"], "over1ms_per10k": over * 1e4 / max(1, fg["read"]["total_ios"]),
            "bg_iops": bgi}
last_bg = None
rows = []
try:
    for r in range(rounds):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for case in order:
            load = float(open("/proc/loadavg").read().split()[0])
            outf = os.path.join(out, f"{case.split('=')[0]}-r{r}.json")
            if case == "device":
                rate = max(1, round(last_bg / bg / 2)) if bg and last_bg else None
                row = run_fio(fio_args(["--ioengine=io_uring", f"--filename={dev}"], rate), outf)
                row.update(case="device", round=r, load=load, rate=rate)
                rows.append(row); print(json.dumps(row), flush=True); continue
            name, spec = case.split("=", 1)
            parts = spec.split(",")
            binp = parts[0]; opts = dict(p.split("=", 1) for p in parts[1:])
            sets = []
            if "set" in opts:
                for kv in opts["set"].split("+"): sets += ["--set", kv]
            d = os.path.join(tmp, name); os.makedirs(d, exist_ok=True)
            for f in ("lc.img", "lc.sock", "hdd.sock", "lc.ctl"):
                try: os.unlink(os.path.join(d, f))
                except OSError: pass
            hddimg = os.path.join(shm, name + "-hdd.img")
            hdd = subprocess.Popen([os.path.join(os.path.dirname(binp), "logcache-bench"), "sim-hdd", "--file", hddimg,
                                    "--size", "16G", "--socket", os.path.join(d, "hdd.sock")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(hdd); wait_sock(os.path.join(d, "hdd.sock"), hdd); time.sleep(0.2)
            buri = f"nbd+unix:///?socket={d}/hdd.sock"
            subprocess.run(["fallocate", "-l", "4G", os.path.join(d, "lc.img")], check=True)
            subprocess.run([binp, "format", "--force", "--cache", os.path.join(d, "lc.img"), "--backing", buri], check=True, stdout=subprocess.DEVNULL)
            lc = subprocess.Popen([binp, "serve", "--cache", os.path.join(d, "lc.img"), "--backing", buri, "--socket", os.path.join(d, "lc.sock"),
                                   "--control", os.path.join(d, "lc.ctl"), "--set", "cache_mode=write-back", "--set", "writeback_threshold_percent=0", *sets],
                                  stdout=open(os.path.join(d, "lc.log"), "a"), stderr=subprocess.STDOUT)
            procs.append(lc); wait_sock(os.path.join(d, "lc.sock"), lc)
            uri = f"nbd+unix:///?socket={d}/lc.sock"
            subprocess.run(["fio", "--name=p", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1m", "--iodepth=16",
                            f"--size={R}", "--output-format=terse"], check=True, stdout=subprocess.DEVNULL)
            ctl = os.path.join(d, "lc.ctl")
            s0 = status(binp, ctl); t0 = threads(lc.pid); h0 = threads(hdd.pid)
            if "renice" in opts:
                # After 0.5 s: writeback's helpers start with its first batch.
                n, comms = opts["renice"].split(":")
                def renice():
                    time.sleep(0.5)
                    for t, (c, *_) in threads(lc.pid).items():
                        if any(c.startswith(x) for x in comms.split("+")):
                            os.setpriority(os.PRIO_PROCESS, int(t), int(n))
                threading.Thread(target=renice).start()
            row = run_fio(fio_args(["--ioengine=nbd", f"--uri={uri}"]), outf)
            t1 = threads(lc.pid); h1 = threads(hdd.pid)
            s1 = status(binp, ctl)
            row["wb_blocks"] = s1["writeback_blocks"] - s0["writeback_blocks"]
            # The reader's spins on its device reads and how many saw the completion (builds
            # that count them).
            for k in ("nbd_device_read_spins", "nbd_device_read_spin_hits"):
                if k in s1: row[k] = s1[k] - s0.get(k, 0)
            # Of the job's reads (every job's: 4 KiB, one block each), those served from the RAM cache.
            dr = {k: s1.get(k, 0) - s0.get(k, 0) for k in ("reads", "read_hits_ram_cache")}
            row["ram_cache_share"] = round(dr["read_hits_ram_cache"] / max(1, dr["reads"]), 3)
            agg = {}
            for t, (c, cpu, sw, ni) in t1.items():
                a = t0.get(t, (c, 0, 0, 0)); k = c.split("-w")[0] if c.startswith("nbd-conn") else c
                x = agg.setdefault(k, [0, 0, set()]); x[0] += (cpu - a[1]) * 10; x[1] += sw - a[2]; x[2].add(ni)
            row["threads_ms_sw"] = {k: [v[0], v[1], sorted(v[2])] for k, v in sorted(agg.items(), key=lambda kv: -kv[1][0]) if v[0] or v[1] > 50}
            row["hdd_ms"] = sum(v[1] for v in h1.values()) * 10 - sum(v[1] for v in h0.values()) * 10
            row.update(case=name, round=r, load=load)
            if name == cases[0].split("=")[0]: last_bg = row["bg_iops"]
            rows.append(row); print(json.dumps(row), flush=True)
            lc.kill(); lc.wait(); hdd.kill(); hdd.wait(); procs.clear(); os.unlink(hddimg); os.unlink(os.path.join(d, "lc.img"))
finally:
    cleanup()
    json.dump(rows, open(os.path.join(out, "rows.json"), "w"))
names = [c.split("=")[0] for c in cases]
print("case  p99.9 read median (per round) | ÷device median | over1ms/10k median | wp999 median | wb blocks median | bg iops")
dev_by = {x["round"]: x["rp999"] for x in rows if x["case"] == "device"}
for n in names:
    xs = [x for x in rows if x["case"] == n]
    rat = [x["rp999"] / dev_by[x["round"]] for x in xs if x["round"] in dev_by]
    print(n, round(statistics.median(x["rp999"] for x in xs)), [round(x["rp999"]) for x in xs], "|",
          round(statistics.median(rat), 2) if rat else "-", [round(v, 2) for v in rat], "|",
          round(statistics.median(x["over1ms_per10k"] for x in xs), 1), "|", round(statistics.median(x["wp999"] for x in xs)), "|",
          statistics.median(x.get("wb_blocks", 0) for x in xs), "|", round(statistics.median(x["bg_iops"] for x in xs)),
          "| RAM cache share of reads", statistics.median(x["ram_cache_share"] for x in xs) if "ram_cache_share" in xs[0] else "-")
print("case  p50 read median (per round)")
for n in names:
    xs = [x for x in rows if x["case"] == n]
    print(n, round(statistics.median(x["rp50"] for x in xs)), [round(x["rp50"]) for x in xs])
if len(names) >= 2:
    for key in ("rp999", "rp50"):
        a = {x["round"]: x[key] for x in rows if x["case"] == names[0]}
        for n in names[1:]:
            b = {x["round"]: x[key] for x in rows if x["case"] == n}
            rr = [b[k] / a[k] for k in a if k in b]
            print(f"{key} {n} ÷ {names[0]} per round: median {statistics.median(rr):.2f}, lower in {sum(v < 1 for v in rr)} of {len(rr)}", [round(v, 2) for v in rr])
