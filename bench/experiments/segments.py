"""Experiment 2: segment size 1 MiB versus 32 KiB (seed 000: 259 vs 184 MB/s with the same
64 MiB RAM buffer), and the format and resume times of a big cache full of dirty data, after a
clean stop and after SIGKILL (seed 000, 24 GB cache: format 1.25 s / resume 4.38 s at 1 MiB,
36.8 s / 113.3 s at 32 KiB).

Throughput: seed 000's job (4 KiB random writes, iodepth 64) on logcache with each segment
size, cache file on /var/tmp, the emulated HDD behind it, alternated, fresh format each time,
fio stopping at 3/4 of the cache. Both use serve's default RAM buffer.

Resume: the cache is filled with 4 KiB random writes (3/4 of it, writeback held off with
writeback_threshold_percent=100 so all of it stays dirty), then serve is stopped with SIGTERM
and started again (timed from exec until an NBD handshake succeeds; logcache's own
recovery_duration_us from `status --json` too): first after SIGKILL right after the fill, then
after a clean stop (SIGTERM) of the recovered cache.
"""

import os
import time

from harness.context import pick
from harness.contenders import Contender, alternate, mean_by, median, spread
from harness.fio import run_fio
from harness.report import commands_block, fmt, fmt_int, human, plt, table
from harness.servers import GiB, MiB, Logcache, start_sim_hdd

NAME = "segments"
TITLE = "Segment size 1 MiB vs 32 KiB; format and resume of a full cache"
COLUMNS = {"kind": str, "segment": str}

SEGMENTS = {"1M": "1 MiB", "32K": "32 KiB"}
SEED = {"1M": {"mb_s": 259.0, "format_s": 1.25, "resume_s": 4.38},
        "32K": {"mb_s": 184.0, "format_s": 36.8, "resume_s": 113.3}}


def params(ctx):
    return pick(ctx, {
        "smoke": {"hdd_size": 1 * GiB, "cache_size": 256 * MiB, "runtime": 1, "rounds": 1,
                  "fill": 64 * MiB},
        "quick": {"hdd_size": 16 * GiB, "cache_size": 2 * GiB, "runtime": 3, "rounds": 3,
                  "fill": 512 * MiB},
        "full": {"hdd_size": 64 * GiB, "cache_size": 16 * GiB, "runtime": 15, "rounds": 3,
                 "fill": 12 * GiB},
    })


def timed_serve(lc):
    t = time.monotonic()
    lc.serve(timeout=3600)
    wall = time.monotonic() - t
    st = lc.status()
    return {"resume_wall_s": wall,
            "recovery_s": (st.get("recovery_duration_us") or 0) / 1e6,
            "recovery_clean": "yes" if st.get("recovery_clean") in (True, 1, "1", "true") else "no",
            "recovery_blocks_recovered": st.get("recovery_blocks_recovered"),
            "dirty_blocks": st.get("dirty_blocks"),
            "segment_size_bytes": st.get("segment_size_bytes"),
            "ram_buffer_bytes": st.get("ram_buffer_bytes")}


def run(ctx):
    p = params(ctx)
    hdd = start_sim_hdd(ctx, "hdd", p["hdd_size"])
    lcs = {seg: Logcache(ctx, f"lc-{seg}", os.path.join(ctx.tmp, f"lc-{seg}.img"), p["cache_size"],
                         hdd.uri, segment_size=seg, allocate=True) for seg in SEGMENTS}
    for lc in lcs.values():
        lc.create_cache_file()
    job = dict(rw="randwrite", bs="4k", iodepth=64, size=p["hdd_size"] - MiB, runtime=p["runtime"],
               io_size=p["cache_size"] * 3 // 4, time_based=False)

    def prep(lc):
        def f():
            lc.start_fresh()
            return lc.uri
        return f

    def stop_timed(lc):
        def f():
            # A clean stop right after the run, writeback to the emulated disk in flight.
            t = time.monotonic()
            lc.stop()
            return {"stop_after_run_s": time.monotonic() - t}
        return f

    contenders = [Contender(seg, SEGMENTS[seg], prep(lc), job, stop_timed(lc))
                  for seg, lc in lcs.items()]
    rows = []
    for r in alternate(ctx, contenders, p["rounds"]):
        r["kind"] = "throughput"
        r["segment"] = r.pop("contender")
        rows.append(r)

    for seg, lc in lcs.items():
        lc.stop()
        fmt_s = lc.format()
        lc.sets = ["writeback_threshold_percent=100", "writeback_idle_ms=0"]
        lc.serve()
        fill = run_fio(ctx, lc.uri, rw="randwrite", bs="4k", iodepth=64, size=p["hdd_size"] - MiB,
                       runtime=3600, io_size=p["fill"], time_based=False, label=f"fill-{seg}")
        dirty = lc.status().get("dirty_blocks")
        # SIGKILL right after the fill (the whole log since the format must be scanned), then
        # a clean stop of the recovered cache and a restart from its checkpoint.
        lc.stop(kill=True)
        crash = timed_serve(lc)
        t = time.monotonic()
        lc.stop()
        stop_s = time.monotonic() - t
        clean = timed_serve(lc)
        ctx.log(f"   {seg}: format {fmt_s:.2f}s, fill {fill['mb_s']:.0f} MB/s, {dirty} dirty; "
                f"stop {stop_s:.2f}s; resume clean {clean['resume_wall_s']:.2f}s "
                f"(recovery {clean['recovery_s']:.2f}s), after SIGKILL {crash['resume_wall_s']:.2f}s "
                f"(recovery {crash['recovery_s']:.2f}s)")
        rows.append({"kind": "format", "segment": seg, "seconds": fmt_s,
                     "cache_size_bytes": p["cache_size"]})
        rows.append({"kind": "resume", "segment": seg, "after": "SIGKILL",
                     "fill_dirty_blocks": dirty, "fill_mb_s": fill["mb_s"], **crash})
        rows.append({"kind": "resume", "segment": seg, "after": "clean stop (SIGTERM)",
                     "stop_s": stop_s, "fill_dirty_blocks": dirty, **clean})
        lc.remove()
    return {"rows": rows, "params": p}


def check(rows):
    kinds = {r["kind"] for r in rows}
    if kinds != {"throughput", "format", "resume"}:
        raise ValueError(f"segments: kinds {kinds}")
    for r in rows:
        if r["kind"] == "throughput" and not r["iops"] > 0:
            raise ValueError(f"segments: no IOPS {r}")
        if r["kind"] == "resume" and not r["resume_wall_s"] > 0:
            raise ValueError(f"segments: bad resume time {r}")


def round_ratios(rows):
    """Per-round ratios of 32 KiB's MB/s to 1 MiB's: the goal is judged on their median, as one
    3 s round of each swings 0.7-1.7 on this machine (2026-11-27)."""
    by_round = {}
    for r in rows:
        if r["kind"] == "throughput":
            by_round.setdefault(r["round"], {})[r["segment"]] = r["mb_s"]
    return [v["32K"] / v["1M"] for v in by_round.values() if v.get("1M") and "32K" in v]


def summary(res):
    rows, p = res["rows"], res["params"]
    out = []
    rs = round_ratios(rows)
    if rs:
        ratio = median(rs)
        out.append(["32 KiB segments lose ≤ 15% against 1 MiB, 4 KiB randwrite QD64 (seed 000: −29%)",
                    f"{ratio * 100:.0f}% of 1 MiB (median of {len(rs)} round(s), "
                    f"{min(rs) * 100:.0f}–{max(rs) * 100:.0f}%)",
                    "met" if ratio >= 0.85 else "**not met**"])
    fmt_1m = [r["seconds"] for r in rows if r["kind"] == "format" and r["segment"] == "1M"]
    if fmt_1m:
        out.append([f"format ≤ 0.2 s, 1 MiB segments ({human(p['cache_size'])} cache here)",
                    f"{fmt_1m[0]:.3f} s", "met" if fmt_1m[0] <= 0.2 else "**not met**"])
    # The resume goals are for a 24 GiB cache; this run's cache is smaller, so its figures are
    # shown without a verdict (the 24 GiB measurement is hand-made: see below).
    for r in rows:
        if r["kind"] == "resume" and r["segment"] == "1M":
            out.append([f"resume after {r['after']}, 1 MiB segments ({human(p['cache_size'])} cache, "
                        f"{fmt_int(r.get('fill_dirty_blocks'))} dirty blocks; the goal's 24 GiB: "
                        "see \"Resume of a 24 GiB cache\" below)",
                        f"{r['resume_wall_s']:.2f} s", "no verdict at this size"])
    return out


def render(res, charts):
    rows = res["rows"]
    p = res["params"]
    thr = [r for r in rows if r["kind"] == "throughput"]
    mb = mean_by(thr, "segment", "mb_s")
    io = mean_by(thr, "segment", "iops")
    ram = next((r.get("ram_buffer_bytes") for r in rows if r.get("ram_buffer_bytes")), None)
    out = [
        f"Seed 000's job (4 KiB random writes, iodepth 64) on logcache formatted with each segment "
        f"size (`logcache format --segment-size`), {human(p['cache_size'])} cache file on /var/tmp, "
        f"the emulated HDD behind it, the same RAM buffer for both (serve's default"
        + (f", {human(ram)}" if ram else "") + f"); {p['runtime']} s or 3/4 of the cache per "
        f"measurement, {p['rounds']} round(s), alternated.",
        "",
        table(["segment", "MB/s", "IOPS", "clean stop right after, s", "seed 000 MB/s"],
              [[SEGMENTS[s], fmt(mb[s], 1), fmt_int(io[s]),
                fmt(mean_by(thr, "segment", "stop_after_run_s").get(s)), fmt(SEED[s]["mb_s"], 0)]
               for s in SEGMENTS if s in mb],
              ["---", "---:", "---:", "---:", "---:"]),
        "",
        "The clean stop (SIGTERM) right after each run is timed too: serve then has writeback "
        "to the emulated disk in flight (the default threshold is 10% dirty) and waits for it.",
        "",
    ]
    rs = round_ratios(rows)
    if rs:
        out.append(f"32 KiB segments give {spread(rs)} of 1 MiB's throughput, median of per-round "
                   f"ratios (seed 000: {184 / 259:.2f}).")
        out.append("")
    out.append(
        f"Format and resume: the cache ({human(p['cache_size'])}) is formatted, then filled with "
        f"{human(p['fill'])} of 4 KiB random writes kept dirty (`--set writeback_threshold_percent=100`); "
        "resume is the wall time from starting `logcache serve` until an NBD handshake "
        "succeeds; recovery is what serve reports (`recovery_duration_us`). First serve is "
        "killed (SIGKILL) right after the fill and restarted, then that recovered cache is "
        "stopped cleanly (SIGTERM) and restarted.")
    out.append("")
    trs = []
    for seg in SEGMENTS:
        f = next((r for r in rows if r["kind"] == "format" and r["segment"] == seg), None)
        for r in rows:
            if r["kind"] == "resume" and r["segment"] == seg:
                key = "clean" if r["after"].startswith("clean") else "crash"
                trs.append([SEGMENTS[seg], fmt(f["seconds"]) if f else "–", fmt_int(r.get("fill_dirty_blocks")),
                            r["after"], fmt(r["resume_wall_s"]), fmt(r.get("recovery_s")),
                            r.get("recovery_clean"), fmt_int(r.get("recovery_blocks_recovered")),
                            f"{SEED[seg]['format_s']} / {SEED[seg]['resume_s']}" if key == "clean" else ""])
    out.append(table(["segment", "format s", "dirty blocks", "restart after", "resume s (wall)",
                      "recovery s (serve)", "clean?", "blocks recovered", "seed 000 format / resume s (24 GB)"],
                     trs, ["---", "---:", "---:", "---", "---:", "---:", "---", "---:", "---:"]))
    out.append("")
    pl = plt()
    fig, axes = pl.subplots(1, 2, figsize=(9, 3.4))
    segs = [s for s in SEGMENTS if s in mb]
    axes[0].bar([SEGMENTS[s] for s in segs], [mb[s] for s in segs], color="tab:green")
    axes[0].set_ylabel("MB/s")
    axes[0].set_title("4 KiB random writes by segment size")
    labels, vals = [], []
    for r in rows:
        if r["kind"] == "resume":
            labels.append(f"{SEGMENTS[r['segment']]}\n{'clean' if r['after'].startswith('clean') else 'SIGKILL'}")
            vals.append(r["resume_wall_s"])
    axes[1].bar(labels, vals, color="tab:blue")
    axes[1].set_ylabel("seconds until serving")
    axes[1].set_title("resume of a cache full of dirty data")
    fig.tight_layout()
    out.append(charts.save(fig, "segments"))
    out.append("")
    out.append(commands_block(res["commands"]))
    return "\n".join(out)
