"""Experiment 4: seed 004's latency question (bcache kept every IO under 1 ms while the uncached
RAID hit 100 ms). Per-IO latency percentiles of a foreground job (4 KiB random reads and writes,
50/50, one IO at a time) while 0, 4 or 16 background jobs (4 KiB random reads and writes, 4 in
flight each) work on other regions of the same disk: the emulated HDD alone, logcache in
write-through mode, logcache in write-back mode (cache file on /var/tmp), and write-back with
writeback running throughout (threshold 0%: issue 20's read-latency goal); and, as the reference
for the tail, the same fio job on a file on the cache file's file system with fio's io_uring engine
and O_DIRECT (no server, no NBD: the device's own tail under the same job). One fio process runs
the foreground job and the background jobs; each job is its own NBD connection. Latency is fio's
total latency (`lat`: submission to completion): an io_uring read the device answers inside
`io_uring_enter` has a completion latency (`clat`) of ~1 µs.
"""

import json
import os
import shlex

from harness.context import pick
from harness.fio import FioError, PERCENTILES, _pct, run_fio
from harness.procs import run_tracked
from harness.report import commands_block, fmt, fmt_int, human, plt, table
from harness.servers import GiB, MiB, Logcache, make_file, start_sim_hdd

NAME = "latency"
TITLE = "Foreground latency with background load (seed 004): HDD, write-through, write-back"
COLUMNS = {"config": str, "bg_jobs": int, "side": str, "iops": float}


def check(rows):
    for r in rows:
        if r["bg_jobs"] == 0 and not (isinstance(r.get("p50_us"), (int, float)) and r["p50_us"] > 0):
            raise ValueError(f"latency: no p50 without background load: {r}")

CONFIGS = ["hdd", "write-through", "write-back", "write-back-wb", "device"]
LABELS = {"hdd": "emulated HDD alone", "write-through": "logcache write-through",
          "write-back": "logcache write-back",
          "write-back-wb": "logcache write-back, writeback running",
          "device": "the cache file's device alone (fio O_DIRECT on a file)"}
# `--set`s of each logcache config. In plain write-back the foreground's dirty region is under
# the 10% threshold and the load never idles, so writeback does not run while fio does;
# "write-back-wb" lowers the threshold to 0%, so the proportional controller writes the region
# back throughout the measurement (issue 20's "with writeback running").
SETS = {"write-through": ["cache_mode=write-through"], "write-back": ["cache_mode=write-back"],
        "write-back-wb": ["cache_mode=write-back", "writeback_threshold_percent=0"]}


def params(ctx):
    return pick(ctx, {
        "smoke": {"bg": [0, 4], "runtime": 1, "region": 16 * MiB, "hdd_size": 1 * GiB,
                  "cache_size": 512 * MiB},
        "quick": {"bg": [0, 4, 16], "runtime": 1.5, "region": 64 * MiB, "hdd_size": 16 * GiB,
                  "cache_size": 4 * GiB},
        "full": {"bg": [0, 4, 16], "runtime": 15, "region": 512 * MiB, "hdd_size": 16 * GiB,
                 "cache_size": 12 * GiB},
    })


def fio_argv(uri, p, bg, out, bg_rate_iops=None):
    # `uri` is an NBD URI, or for "device" a file's path (fio's io_uring engine, O_DIRECT).
    target = (["--ioengine=io_uring", f"--filename={uri}"] if uri.startswith("/")
              else ["--ioengine=nbd", f"--uri={uri}"])
    argv = ["fio", *target, "--direct=1", "--norandommap",
            "--randrepeat=0", "--time_based", f"--runtime={p['runtime']}", "--bs=4k",
            "--lat_percentiles=1", "--percentile_list=" + ":".join(str(x) for x in PERCENTILES),
            "--output-format=json", f"--output={out}",
            "--name=fg", "--rw=randrw", "--rwmixread=50", "--iodepth=1", f"--size={p['region']}",
            "--offset=0"]
    if bg:
        argv += ["--name=bg", "--new_group", "--rw=randrw", "--rwmixread=50", "--iodepth=4",
                 f"--numjobs={bg}", f"--size={p['region']}", f"--offset={p['region']}",
                 f"--offset_increment={p['region']}"]
        if bg_rate_iops:
            # Each background job's reads and writes per second, each direction.
            argv += [f"--rate_iops={bg_rate_iops},{bg_rate_iops}"]
    return argv


def measure(ctx, uri, p, bg, label, bg_rate_iops=None):
    ctx.fio_count += 1
    out = os.path.join(ctx.tmp, f"fio-{ctx.fio_count:04d}-{label}.json")
    argv = fio_argv(uri, p, bg, out, bg_rate_iops)
    ctx.record_command(argv)
    rc, so, se = run_tracked(argv, timeout=p["runtime"] * 4 + 120)
    if rc != 0:
        raise FioError(f"fio failed ({rc}): {shlex.join(argv)}\n{se[-1500:]}")
    text = open(out).read()
    data = json.loads(text[text.find("{"):])
    jobs = data["jobs"]
    fg = next(j for j in jobs if j["jobname"] == "fg")
    bg_iops = sum(j[s]["iops"] for j in jobs if j["jobname"] == "bg" for s in ("read", "write"))
    rows = []
    for side in ("read", "write"):
        s = fg[side]
        clat = s.get("lat_ns") or {}
        row = {"side": side, "iops": s.get("iops", 0.0), "ios": s.get("total_ios", 0),
               "lat_mean_us": (clat.get("mean") or 0) / 1000, "lat_max_us": (clat.get("max") or 0) / 1000,
               "bg_iops": bg_iops}
        for q in PERCENTILES:
            row["p" + str(q).replace(".", "") + "_us"] = _pct(clat, q)
        rows.append(row)
    return rows


def run(ctx):
    p = params(ctx)
    hdd = start_sim_hdd(ctx, "hdd", p["hdd_size"])
    lc = Logcache(ctx, "lc", os.path.join(ctx.tmp, "lc-cache.img"), p["cache_size"], hdd.uri,
                  allocate=True)
    lc.create_cache_file()
    # The device reference's file, next to the cache file; its foreground region written once,
    # as logcache's is (the background regions' reads then read holes' blocks: allocated below).
    device = os.path.join(ctx.tmp, "lat-device.img")
    make_file(device, p["region"] * (1 + max(p["bg"])), allocate=True)
    run_fio(ctx, device, rw="write", bs="1m", iodepth=16, size=p["region"], runtime=600,
            time_based=False, label="prefill-device")
    rows = []
    for bg in p["bg"]:
        wb_bg_iops = None
        for config in CONFIGS:
            if config == "hdd":
                uri = hdd.uri
            elif config == "device":
                uri = device
            else:
                lc.sets = list(SETS[config])
                lc.start_fresh()
                uri = lc.uri
                # The foreground's region is written once first, so the cache holds it (dirty
                # in write-back, clean in write-through); the background regions are not.
                run_fio(ctx, uri, rw="write", bs="1m", iodepth=16, size=p["region"], runtime=600,
                        time_based=False, label=f"prefill-{config}")
            # Whether writeback ran during the measurement (the issue-20 goal is read latency
            # "with writeback running"): blocks written back while fio ran.
            served = config not in ("hdd", "device")
            wb_before = lc.status().get("writeback_blocks") if served else None
            # The device's background jobs run at the rate logcache's did with writeback running
            # (their reads of uncached regions wait for the emulated HDD there; unthrottled on
            # the device they would be a far heavier load than logcache's device saw).
            rate = (max(1, round(wb_bg_iops / bg / 2)) if config == "device" and bg and wb_bg_iops
                    else None)
            got = measure(ctx, uri, p, bg, f"{config}-bg{bg}", rate)
            if config == "write-back-wb":
                wb_bg_iops = got[0]["bg_iops"]
            wb_during = (lc.status().get("writeback_blocks", 0) - (wb_before or 0)
                         if served else None)
            for r in got:
                r.update({"config": config, "bg_jobs": bg, "writeback_blocks_during": wb_during})
                rows.append(r)
                ctx.log(f"   {config:<13} bg {bg:>2} {r['side']:<5} p50 {fmt(r['p50_us'])} µs "
                        f"p99 {fmt(r['p99_us'])} µs p99.9 {fmt(r.get('p999_us'))} µs")
            if served:
                lc.stop(kill=True)  # thrown away; a clean stop waits for writeback in flight
    lc.remove()
    os.unlink(device)
    return {"rows": rows, "params": p}


def summary(res):
    wb = [r for r in res["rows"] if r["config"] == "write-back" and r.get("p999_us") is not None]
    if not wb:
        return []
    bg_max = max(r["bg_jobs"] for r in wb)
    out = []
    # The goal, as worded: foreground writes, write-back, the heaviest background load.
    goal = [r for r in wb if r["side"] == "write" and r["bg_jobs"] == bg_max]
    if goal:
        g = goal[0]
        out.append([f"write-back: foreground write p99.9 ≤ 1 ms with {bg_max} background jobs",
                    f"{fmt(g['p999_us'], 0)} µs",
                    "met" if g["p999_us"] <= 1000 else "**not met**"])
    # Stricter, beyond the goal: reads and writes at every load (seed 004's bcache result).
    worst = max(wb, key=lambda r: r["p999_us"])
    out.append([f"write-back, stricter than the goal: every foreground p99.9 (reads and writes, 0 to "
                f"{bg_max} background jobs) ≤ 1 ms (seed 004: bcache kept every IO under 1 ms)",
                f"{fmt(worst['p999_us'], 0)} µs ({worst['side']}s, {worst['bg_jobs']} bg)",
                "met" if worst["p999_us"] <= 1000 else "**not met**"])
    # Issue 20's: foreground reads, write-back with writeback running, at every background load.
    reads = sorted((r for r in res["rows"] if r["config"] == "write-back-wb" and r["side"] == "read"
                    and r.get("p999_us") is not None), key=lambda r: r["bg_jobs"])
    if reads:
        worst = max(reads, key=lambda r: r["p999_us"])
        per = " / ".join(fmt(r["p999_us"], 0) for r in reads)
        bgs = "/".join(str(r["bg_jobs"]) for r in reads)
        wbs = [r.get("writeback_blocks_during") for r in reads]
        ran = ("writeback wrote " + " / ".join(fmt_int(w) for w in wbs) + " blocks during them"
               if all(w is not None for w in wbs) else "writeback activity not recorded")
        verdict = "met" if worst["p999_us"] <= 1000 else "**not met**"
        if any(w == 0 for w in wbs):
            verdict += " (writeback idle in some runs: not the goal's condition)"
        # The reference: the cache file's device itself under the same job (no server, no NBD).
        dev = {r["bg_jobs"]: r["p999_us"] for r in res["rows"] if r["config"] == "device"
               and r["side"] == "read" and r.get("p999_us") is not None}
        if all(r["bg_jobs"] in dev for r in reads):
            ref = " / ".join(fmt(dev[r["bg_jobs"]], 0) for r in reads)
            per += f" µs; the device alone, same job: {ref}"
            over = [str(r["bg_jobs"]) for r in reads if dev[r["bg_jobs"]] > 1000]
            if over:
                # Name the loads where the device alone misses too: the verdict is only
                # bounded by the device where that holds.
                verdict += (f" (the device's own p99.9 is over 1 ms with {'/'.join(over)} "
                            f"background jobs)")
        out.append(["issue 20: foreground read p99.9 ≤ 1 ms with writeback running (write-back, "
                    f"writeback threshold 0%, {bgs} background jobs; seed 004's job)",
                    f"{per} µs ({ran})", verdict, {"issue20": "fg-read-p999"}])
    return out


def render(res, charts):
    rows = res["rows"]
    p = res["params"]
    out = [
        f"Foreground: 4 KiB `randrw` 50/50, iodepth 1, over the first {human(p['region'])}; "
        f"background: 0 to {max(p['bg'])} jobs of 4 KiB `randrw` 50/50, iodepth 4, each on its own "
        f"{human(p['region'])} region after it; {p['runtime']} s per point. logcache's cache is a "
        f"{human(p['cache_size'])} file on /var/tmp, formatted afresh for each point with "
        "`--set cache_mode=...` (the writeback-running rows add `--set "
        "writeback_threshold_percent=0`: the foreground region's dirty blocks are written back "
        "while fio runs; in plain write-back they are under the 10% threshold and stay dirty), "
        "and the foreground's region is written once (1 MiB sequential "
        "writes, untimed) before the measurement, so the cache holds the foreground's working "
        "set while the background jobs' regions are not cached (their reads go to the disk). "
        "The device rows run the same fio job with fio's io_uring engine and O_DIRECT on a file "
        "next to the cache file (no server, no NBD: the device's own tail), its background jobs "
        "held to the IOPS logcache's background jobs reached with writeback running at that "
        "load. Total latency (fio's `lat`, submission to completion) of the foreground job, µs:",
        "",
    ]
    tab = []
    for r in rows:
        tab.append([LABELS[r["config"]], r["bg_jobs"], r["side"], fmt_int(r["iops"]),
                    fmt(r.get("p50_us"), 0), fmt(r.get("p90_us"), 0), fmt(r.get("p99_us"), 0),
                    fmt(r.get("p999_us"), 0), fmt_int(r.get("bg_iops")),
                    fmt_int(r.get("writeback_blocks_during"))])
    out.append(table(["config", "bg jobs", "fg side", "fg IOPS", "p50", "p90", "p99", "p99.9", "bg IOPS",
                      "blocks written back during it"],
                     tab, ["---", "---:", "---", "---:", "---:", "---:", "---:", "---:", "---:", "---:"]))
    out.append("")
    under = [r for r in rows if r["config"] == "write-back" and r.get("p999_us") is not None]
    if under:
        worst = max(r["p999_us"] for r in under)
        out.append(f"Write-back's worst foreground p99.9 across the loads: {fmt(worst, 0)} µs "
                   f"({'under' if worst < 1000 else 'over'} seed 004's 1 ms).")
        out.append("")
    pl = plt()
    fig, axes = pl.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, side in zip(axes, ("read", "write")):
        for c, color in zip(CONFIGS, ["tab:gray", "tab:blue", "tab:green", "tab:red", "tab:purple"]):
            pts = sorted((r for r in rows if r["config"] == c and r["side"] == side), key=lambda r: r["bg_jobs"])
            ax.plot([r["bg_jobs"] for r in pts], [r.get("p99_us") or 0 for r in pts], "-o", color=color,
                    label=f"{LABELS[c]} p99")
            ax.plot([r["bg_jobs"] for r in pts], [r.get("p50_us") or 0 for r in pts], "--", color=color,
                    label=f"{LABELS[c]} p50")
        ax.set_yscale("log")
        ax.set_xticks(sorted({r["bg_jobs"] for r in rows}))
        ax.set_xlabel("background jobs")
        ax.set_title(f"foreground 4 KiB {side}s")
    axes[0].set_ylabel("latency µs (log)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    out.append(charts.save(fig, "latency"))
    out.append("")
    out.append(commands_block(res["commands"]))
    return "\n".join(out)
