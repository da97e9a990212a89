"""Experiment 6: a peer on the same emulated HDD. nbdkit's cache filter in write-back mode
(`nbdkit --filter=cache nbd socket=<hdd> cache=writeback`, its cache a temporary file on
/var/tmp) against logcache (cache file on /var/tmp) and the HDD alone, on seed 000's job (4 KiB
random writes, iodepth 64) and, where cheap, 1 MiB sequential writes and 4 KiB random reads of
a region written just before. Every contender starts afresh (new cache) for each measurement;
contenders alternate.
"""

import os

from harness.context import pick
from harness.contenders import Contender, alternate, mean_by
from harness.fio import run_fio
from harness.report import commands_block, fmt, fmt_int, plt, table
from harness.servers import GiB, MiB, Logcache, start_cache_filter, start_sim_hdd

NAME = "peers"
TITLE = "Peers on the same emulated HDD: nbdkit cache filter (write-back) and logcache"
COLUMNS = {"round": int, "contender": str, "job": str, "iops": float, "mb_s": float}

LABELS = {"hdd": "emulated HDD alone",
          "nbdkit_cache": "nbdkit cache filter, cache=writeback, 4 KiB cache blocks",
          "nbdkit_cache_64k": "nbdkit cache filter, cache=writeback, default (64 KiB) blocks",
          "logcache": "logcache"}
ORDER = ["hdd", "nbdkit_cache_64k", "nbdkit_cache", "logcache"]


def params(ctx):
    return pick(ctx, {
        "smoke": {"hdd_size": 1 * GiB, "cache_size": 512 * MiB, "runtime": 1, "rounds": 1,
                  "read_span": 16 * MiB, "jobs": ["randwrite-4k", "randread-4k"]},
        "quick": {"hdd_size": 16 * GiB, "cache_size": 4 * GiB, "runtime": 3, "rounds": 1,
                  "read_span": 64 * MiB, "jobs": ["randwrite-4k", "write-1m", "randread-4k"]},
        "full": {"hdd_size": 16 * GiB, "cache_size": 12 * GiB, "runtime": 15, "rounds": 3,
                 "read_span": 512 * MiB, "jobs": ["randwrite-4k", "write-1m", "randread-4k"]},
    })


def job_kwargs(job, p):
    rw, bs = job.split("-")
    if rw == "randwrite":
        return dict(rw="randwrite", bs="4k", iodepth=64, size=p["hdd_size"] - MiB, runtime=p["runtime"])
    if rw == "write":
        return dict(rw="write", bs="1M", iodepth=32, size=p["hdd_size"] - MiB, runtime=p["runtime"])
    return dict(rw="randread", bs="4k", iodepth=32, size=p["read_span"], runtime=p["runtime"])


def run(ctx):
    p = params(ctx)
    hdd = start_sim_hdd(ctx, "hdd", p["hdd_size"])
    lc = Logcache(ctx, "lc", os.path.join(ctx.tmp, "lc-cache.img"), p["cache_size"], hdd.uri,
                  allocate=True)
    lc.create_cache_file()
    nk = {"proc": None}
    cache_dir = os.path.join(ctx.tmp, "nbdkit-cache")
    cap = p["cache_size"] * 3 // 4

    def prefill(uri, reading):
        if reading:  # the region to read is written first, so a cache can hold it
            run_fio(ctx, uri, rw="write", bs="1m", iodepth=16, size=p["read_span"], runtime=600,
                    time_based=False, label="prefill")

    def start_lc(reading):
        def f():
            lc.start_fresh()
            prefill(lc.uri, reading)
            return lc.uri
        return f

    def stop_lc():
        lc.stop(kill=True)  # thrown away; a clean stop waits for writeback in flight

    def start_nk(reading, block_size="4K"):
        def f():
            nk["proc"] = start_cache_filter(ctx, "nbdkit-cache", hdd.socket, cache_dir,
                                            block_size=block_size)
            prefill(nk["proc"].uri, reading)
            return nk["proc"].uri
        return f

    def stop_nk():
        # Its dirty blocks would be written to the slow disk only on a flush; they are thrown
        # away with the temporary cache (a short timeout, then SIGKILL).
        ctx.procs.stop(nk["proc"], timeout=10)

    rows = []
    for job in p["jobs"]:
        reading = job.startswith("randread")
        kw = job_kwargs(job, p)
        capped = dict(kw, io_size=cap, time_based=False) if not reading else kw
        contenders = [
            Contender("hdd", LABELS["hdd"], lambda: hdd.uri, kw),
            Contender("nbdkit_cache", LABELS["nbdkit_cache"], start_nk(reading), capped, stop_nk),
            Contender("logcache", LABELS["logcache"], start_lc(reading), capped, stop_lc),
        ]
        if job == "randwrite-4k":
            # Out of the box, its cache block is 64 KiB: a 4 KiB write to an uncached block
            # first reads the block from the disk.
            contenders.insert(1, Contender("nbdkit_cache_64k", LABELS["nbdkit_cache_64k"],
                                           start_nk(reading, "64K"), capped, stop_nk))
        ctx.log(f"   job {job}")
        for r in alternate(ctx, contenders, p["rounds"]):
            r["job"] = job
            rows.append(r)
    lc.remove()
    return {"rows": rows, "params": p}


def render(res, charts):
    rows = res["rows"]
    p = res["params"]
    jobs = []
    for r in rows:
        if r["job"] not in jobs:
            jobs.append(r["job"])
    out = [
        "Each contender on the same emulated HDD. nbdkit's cache filter keeps its cache in a "
        "temporary file on /var/tmp (through the page cache), in 4 KiB blocks (`cache-min-block-size=4K`; its default, 64 KiB, is measured too on the first job); it writes dirty blocks to the "
        "disk only when the client flushes, and fio sends no flush here. logcache's cache file "
        f"({p['cache_size'] / GiB:g} GiB) is on /var/tmp too. Jobs: `randwrite-4k` = seed 000's "
        "(4 KiB, iodepth 64), `write-1m` = 1 MiB sequential, iodepth 32, `randread-4k` = 4 KiB "
        f"random reads, iodepth 32, of a {p['read_span'] / MiB:g} MiB region written (sequentially) "
        f"just before. {p['runtime']} s per measurement, {p['rounds']} round(s), means shown; "
        "write measurements on the caches stop at three quarters of logcache's cache size.",
        "",
    ]
    tab = []
    for job in jobs:
        mb = mean_by(rows, "contender", "mb_s", where=lambda r: r["job"] == job)
        io = mean_by(rows, "contender", "iops", where=lambda r: r["job"] == job)
        p99 = mean_by([r for r in rows if r.get("p99_us") is not None], "contender", "p99_us",
                      where=lambda r: r["job"] == job)
        base = mb.get("hdd")
        for c in ORDER:
            if c in mb:
                tab.append([job, LABELS[c], fmt(mb[c], 2), fmt_int(io[c]), fmt(p99.get(c), 0),
                            f"{mb[c] / base:,.1f}×" if base else "–"])
    out.append(table(["job", "contender", "MB/s", "IOPS", "p99 µs", "vs HDD alone"], tab,
                     ["---", "---", "---:", "---:", "---:", "---:"]))
    out.append("")
    pl = plt()
    fig, ax = pl.subplots(figsize=(8, 3.8))
    present = [c for c in ORDER if any(r["contender"] == c for r in rows)]
    w = 0.8 / len(present)
    for i, c in enumerate(present):
        vals = [mean_by(rows, "contender", "mb_s", where=lambda r, j=j: r["job"] == j).get(c, 0) for j in jobs]
        ax.bar([x + (i - (len(present) - 1) / 2) * w for x in range(len(jobs))], vals, w, label=LABELS[c])
    ax.set_xticks(range(len(jobs)))
    ax.set_xticklabels(jobs)
    ax.set_yscale("log")
    ax.set_ylabel("MB/s (log)")
    ax.set_title("Same emulated HDD behind each cache")
    ax.legend(fontsize=8)
    out.append(charts.save(fig, "peers-mbs"))
    out.append("")
    out.append(commands_block(res["commands"]))
    return "\n".join(out)
