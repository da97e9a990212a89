"""Experiment 3: seed 001's method. Block size × pattern × queue depth, through fio's nbd
engine, against logcache (cache file on /var/tmp, the emulated HDD behind it), the raw cache
device (nbdkit file cache=none on a file on /var/tmp) and the emulated HDD alone. The three are
alternated at every point.

Writes first, then reads: before the read points, every contender's region is written once
sequentially (1 MiB blocks, untimed), so reads of logcache hit its cache, and reads of the raw
file read real blocks rather than unwritten extents; then logcache is drained (its blocks stay
cached, clean), so its writeback does not load the disk during the HDD-alone points. logcache is formatted afresh before each
write point and fio stops before three quarters of the cache are written (io_size), so the log
never wraps during a measurement.
"""

import os

from harness.context import pick
from harness.fio import run_fio
from harness.report import commands_block, fmt, fmt_int, plt, table
from harness.servers import GiB, MiB, Logcache, make_file, parse_size, start_file, start_sim_hdd

NAME = "matrix"
TITLE = "Block size × pattern × queue depth (seed 001's method)"
COLUMNS = {"contender": str, "rw": str, "bs": str, "iodepth": int, "iops": float, "mb_s": float}

CONTENDERS = ["logcache", "cachedev", "hdd"]
LABELS = {"logcache": "HDD + logcache", "cachedev": "cache device alone", "hdd": "emulated HDD alone"}
RW_ORDER = ["write", "randwrite", "read", "randread"]


def params(ctx):
    return pick(ctx, {
        "smoke": {"bs": ["4k", "1m"], "rw": ["randwrite", "randread"], "iodepth": [16],
                  "runtime": 1, "span": 64 * MiB, "cache_size": 512 * MiB, "hdd_size": 1 * GiB},
        "quick": {"bs": ["4k", "1m"], "rw": ["write", "randwrite", "randread"], "iodepth": [1, 32],
                  "runtime": 1, "span": 512 * MiB, "cache_size": 4 * GiB, "hdd_size": 16 * GiB},
        "full": {"bs": ["4k", "16k", "64k", "256k", "1m", "4m"], "rw": RW_ORDER,
                 "iodepth": [1, 16, 32, 64, 128], "runtime": 5, "span": 4 * GiB,
                 "cache_size": 12 * GiB, "hdd_size": 16 * GiB},
    })


def run(ctx):
    p = params(ctx)
    hdd = start_sim_hdd(ctx, "hdd", p["hdd_size"])
    raw_path = os.path.join(ctx.tmp, "cachedev.img")
    make_file(raw_path, p["cache_size"], allocate=True)
    raw = start_file(ctx, "cachedev", raw_path)
    lc = Logcache(ctx, "lc", os.path.join(ctx.tmp, "lc-cache.img"), p["cache_size"], hdd.uri,
                  allocate=True)
    lc.create_cache_file()
    cap = p["cache_size"] * 3 // 4
    uris = {"hdd": hdd.uri, "cachedev": raw.uri}
    rows = []
    prefilled = False
    rws = [rw for rw in RW_ORDER if rw in p["rw"]]
    for rw in rws:
        reading = "read" in rw and "write" not in rw
        if reading and not prefilled:
            lc.start_fresh()
            uris["logcache"] = lc.uri
            for c in ("logcache", "cachedev"):
                run_fio(ctx, uris[c], rw="write", bs="1m", iodepth=16, size=p["span"],
                        runtime=600, time_based=False, label=f"prefill-{c}")
            # Written back before the reads (the blocks stay cached, clean), so logcache's
            # writeback does not load the disk while the HDD alone is measured.
            lc.drain()
            prefilled = True
        for bs in p["bs"]:
            for depth in p["iodepth"]:
                for c in CONTENDERS:
                    kw = {}
                    if c == "logcache":
                        if not reading:
                            lc.start_fresh()
                            kw = {"io_size": cap, "time_based": False}
                        uris["logcache"] = lc.uri
                    res = run_fio(ctx, uris[c], rw=rw, bs=bs, iodepth=depth, size=p["span"],
                                  runtime=p["runtime"], label=f"{c}-{rw}-{bs}-{depth}", **kw)
                    if c == "logcache" and not reading:
                        # Its writeback must not load the disk while the HDD alone is measured.
                        lc.stop(kill=True)
                    row = {"contender": c, "rw": rw, "bs": bs, "bs_bytes": parse_size(bs.upper()),
                           "iodepth": depth}
                    row.update(res)
                    rows.append(row)
                    ctx.log(f"   {rw:<9} {bs:>4} qd{depth:<3} {c:<9} {res['mb_s']:>10,.1f} MB/s "
                            f"{res['iops']:>10,.0f} IOPS")
    if lc.proc:
        st = lc.status()
        ctx.log(f"   logcache read hits {st.get('read_hits')} misses {st.get('read_misses')}")
    lc.remove()
    return {"rows": rows, "params": p}


def render(res, charts):
    rows = res["rows"]
    p = res["params"]
    out = [
        f"fio `--ioengine=nbd --direct=1 --norandommap`, {p['runtime']} s per point over a "
        f"{p['span'] / GiB:g} GiB region; block sizes {', '.join(p['bs'])}; patterns "
        f"{', '.join(r for r in RW_ORDER if r in p['rw'])}; iodepth {', '.join(map(str, p['iodepth']))}; "
        f"one job (one NBD connection). logcache's cache and the raw cache device are "
        f"{p['cache_size'] / GiB:g} GiB files on /var/tmp; the emulated HDD is "
        f"{p['hdd_size'] / GiB:g} GiB. Reads come after one sequential pass has written the "
        "region (so logcache's reads are cache hits) and logcache has been drained (`logcache "
        "drain`; the blocks stay cached, clean); logcache starts from a fresh format at "
        "every write point. MB/s (10^6 bytes/s):",
        "",
    ]
    rws = [rw for rw in RW_ORDER if any(r["rw"] == rw for r in rows)]
    bss = []
    for r in rows:
        if r["bs"] not in bss:
            bss.append(r["bs"])
    depths = sorted({r["iodepth"] for r in rows})
    tab = []
    for rw in rws:
        for bs in bss:
            for d in depths:
                cells = {r["contender"]: r for r in rows if r["rw"] == rw and r["bs"] == bs and r["iodepth"] == d}
                if not cells:
                    continue
                lc, raw, hd = (cells.get(c) for c in CONTENDERS)
                ratio = (lc["mb_s"] / raw["mb_s"]) if lc and raw and raw["mb_s"] > 0 else None
                tab.append([rw, bs, d] + [fmt(cells[c]["mb_s"], 1) if c in cells else "–" for c in CONTENDERS]
                           + [fmt_int(lc["iops"]) if lc else "–", f"{ratio:.2f}×" if ratio else "–"])
    big = len(tab) > 30
    t = table(["rw", "bs", "iodepth"] + [LABELS[c] + " MB/s" for c in CONTENDERS]
              + ["logcache IOPS", "logcache / cache device"], tab,
              ["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:"])
    if big:
        out += ["<details><summary>All " + str(len(tab)) + " points</summary>", "", t, "", "</details>"]
    else:
        out.append(t)
    out.append("")
    pl = plt()
    n = len(rws)
    fig, axes = pl.subplots(1, n, figsize=(4.2 * n, 3.8), squeeze=False)
    dmax, dmin = max(depths), min(depths)
    for ax, rw in zip(axes[0], rws):
        for c, color in zip(CONTENDERS, ["tab:green", "tab:blue", "tab:gray"]):
            for d, style in ((dmax, "-"), (dmin, "--")):
                pts = [r for r in rows if r["rw"] == rw and r["contender"] == c and r["iodepth"] == d]
                pts.sort(key=lambda r: r["bs_bytes"])
                if pts:
                    ax.plot([r["bs_bytes"] / 1024 for r in pts], [r["mb_s"] for r in pts], style,
                            color=color, marker="o", label=f"{LABELS[c]} qd{d}")
        ax.set_xscale("log", base=2)
        ticks = sorted({r["bs_bytes"] / 1024 for r in rows})
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("block size KiB")
        ax.set_title(rw)
    axes[0][0].set_ylabel("MB/s (log)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    out.append(charts.save(fig, "matrix-bs"))
    out.append("")
    out.append(commands_block(res["commands"], limit=8))
    return "\n".join(out)
