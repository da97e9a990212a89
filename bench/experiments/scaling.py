"""Experiment 5: seed 002's scaling check. IOPS must rise with parallelism and then plateau,
never fall. 4 KiB random and sequential writes against logcache (cache on /dev/shm, the emulated
HDD behind it), total requests in flight from 1 to 256, on one NBD connection (numjobs=1,
iodepth=N) and on several (fio's nbd engine opens one connection per job: numjobs=min(N, 8),
iodepth=N/numjobs). The series are interleaved point by point. Any point more than 5% below the
one before it in its series is flagged.
"""

import os

from harness.context import pick
from harness.fio import run_fio
from harness.report import commands_block, fmt_int, plt, table
from harness.servers import GiB, MiB, Logcache, start_null, start_sim_hdd

NAME = "scaling"
TITLE = "Scaling with parallelism (seed 002): 4 KiB writes, 1 to 256 in flight"
COLUMNS = {"series": str, "rw": str, "connections": str, "inflight": int, "numjobs": int,
           "iodepth": int, "iops": float, "mb_s": float}

MAX_CONNS = 8
DROP = 0.05


def params(ctx):
    return pick(ctx, {
        "smoke": {"points": [1, 16], "runtime": 1, "cache_size": 256 * MiB, "span": 64 * MiB,
                  "hdd_size": 1 * GiB, "null": False},
        "quick": {"points": [1, 4, 16, 64, 256], "runtime": 1.5, "cache_size": 2 * GiB,
                  "span": 256 * MiB, "hdd_size": 16 * GiB, "null": True},
        "full": {"points": [1, 2, 4, 8, 16, 32, 64, 128, 256], "runtime": 5, "cache_size": 4 * GiB,
                 "span": 512 * MiB, "hdd_size": 16 * GiB, "null": True},
    })


def series_list(p):
    out = []
    for rw in ("randwrite", "write"):
        for conns in ("one", "several"):
            out.append(("logcache", rw, conns))
    if p["null"]:
        out.append(("null", "randwrite", "one"))
    return out


def shape(n, conns):
    if conns == "one":
        return 1, n
    j = min(n, MAX_CONNS)
    return j, n // j


def flag_drops(rows):
    by = {}
    for r in sorted(rows, key=lambda r: r["inflight"]):
        prev = by.get(r["series"])
        r["drop_vs_prev_pct"] = None
        r["flag"] = ""
        if prev is not None and prev["iops"] > 0:
            d = (prev["iops"] - r["iops"]) / prev["iops"]
            r["drop_vs_prev_pct"] = round(100 * d, 1) if d > 0 else 0.0
            if d > DROP:
                r["flag"] = f"{100 * d:.1f}% below {prev['inflight']} in flight"
        by[r["series"]] = r
    return rows


def run(ctx):
    p = params(ctx)
    hdd = start_sim_hdd(ctx, "hdd", p["hdd_size"])
    lc = Logcache(ctx, "lc", os.path.join(ctx.shm, "lc-cache.img"), p["cache_size"], hdd.uri)
    lc.create_cache_file()
    null = start_null(ctx, "null", p["hdd_size"]) if p["null"] else None
    rows = []
    for n in p["points"]:
        for target, rw, conns in series_list(p):
            numjobs, iodepth = shape(n, conns)
            if target == "logcache":
                # A fresh cache for every point, and fio stops before 3/4 of it is written
                # (io_size, per job): the log never wraps, so the curve shows parallelism only.
                # (What a wrap over a slow disk costs is another question.)
                lc.start_fresh()
                uri = lc.uri
                cap = {"io_size": p["cache_size"] * 3 // 4 // numjobs, "time_based": False}
            else:
                uri = null.uri
                cap = {}
            name = f"{target}-{rw}-{conns}"
            # Several jobs on the same region would collide on sequential writes; offset them.
            extra = {"offset_increment": p["span"] // numjobs} if numjobs > 1 else None
            size = p["span"] // numjobs if numjobs > 1 else p["span"]
            res = run_fio(ctx, uri, rw=rw, bs="4k", iodepth=iodepth, numjobs=numjobs, size=size,
                          runtime=p["runtime"], label=name, extra=extra, **cap)
            row = {"series": name, "target": target, "rw": rw, "connections": conns,
                   "inflight": n, "numjobs": numjobs, "iodepth": iodepth}
            row.update(res)
            rows.append(row)
            ctx.log(f"   {name:<28} {n:>4} in flight ({numjobs}x{iodepth}) {res['iops']:>10,.0f} IOPS")
    st = lc.status()
    lc.remove()
    flag_drops(rows)
    return {"rows": rows, "params": p,
            "extra": {"status_after": {k: st.get(k) for k in (
                "dirty_blocks", "blocks_relocated", "writeback_blocks", "nbd_connections_total")}}}


def null_drops(rows):
    """In-flight points where the nbdkit null reference itself fell more than 5%."""
    return {r["inflight"] for r in rows if r.get("target") == "null" and r.get("flag")}


def summary(res):
    rows = res["rows"]
    flags = [r for r in rows if r.get("flag") and r.get("target", "logcache") == "logcache"]
    shared = [r for r in flags if r["inflight"] in null_drops(rows)]
    figure = f"{len(flags)} flagged point(s)"
    if shared:
        figure += f", {len(shared)} where nbdkit null fell too"
    return [["IOPS never fall more than 5% as parallelism rises, 1 to 256 in flight (seed 002)",
             figure, "met" if not flags else "**not met**"]]


def render(res, charts):
    rows = res["rows"]
    p = res["params"]
    out = [
        f"logcache with a {p['cache_size'] / GiB:g} GiB cache file on /dev/shm in front of the "
        f"emulated HDD ({p['hdd_size'] / GiB:g} GiB); fio writes 4 KiB blocks over a "
        f"{p['span'] / MiB:g} MiB region (split between jobs with `offset_increment`), "
        f"{p['runtime']} s per point. \"one\" connection: `numjobs=1 iodepth=N`; \"several\": "
        f"`numjobs=min(N,{MAX_CONNS}) iodepth=N/numjobs` (fio's nbd engine opens one connection per "
        "job). All series are measured at one parallelism before the next (interleaved), "
        "logcache formatted afresh before each point, and each point stops before three quarters of the "
        "cache are written (`io_size`), so the log never wraps: the curve shows parallelism, not "
        "reclaim."
        + (" `nbdkit null` on one connection is the reference." if p["null"] else ""),
        "",
    ]
    series = []
    for r in rows:
        if r["series"] not in series:
            series.append(r["series"])
    points = sorted({r["inflight"] for r in rows})
    tab = []
    for n in points:
        line = [str(n)]
        for s in series:
            r = next((r for r in rows if r["series"] == s and r["inflight"] == n), None)
            if r is None:
                line.append("–")
            else:
                line.append(fmt_int(r["iops"]) + (" ⚠" if r.get("flag") else ""))
        tab.append(line)
    out.append(table(["in flight"] + [s.replace("logcache-", "") for s in series], tab))
    out.append("")
    flags = [r for r in rows if r.get("flag")]
    if flags:
        out.append("**Flagged** (more than 5% below the point before it in the same series; seed "
                   "002's warning sign):")
        out.append("")
        ref = null_drops(rows)
        for r in flags:
            also = (" (nbdkit null, the reference, fell more than 5% at this point too: the "
                    "protocol path or the client, not logcache)"
                    if r.get("target") == "logcache" and r["inflight"] in ref else "")
            out.append(f"- {r['series']} at {r['inflight']} in flight: {fmt_int(r['iops'])} IOPS, "
                       f"{r['flag']}{also}.")
    else:
        out.append("No point is more than 5% below the one before it: IOPS rise with parallelism "
                   "and then hold, in every series.")
    out.append("")
    pl = plt()
    fig, ax = pl.subplots(figsize=(8, 4.2))
    for s in series:
        pts = sorted((r for r in rows if r["series"] == s), key=lambda r: r["inflight"])
        ax.plot([r["inflight"] for r in pts], [r["iops"] for r in pts], marker="o", label=s)
        for r in pts:
            if r.get("flag"):
                ax.plot([r["inflight"]], [r["iops"]], "rx", markersize=12)
    ax.set_xscale("log", base=2)
    ax.set_xticks(points)
    ax.set_xticklabels([str(n) for n in points])
    ax.minorticks_off()
    ax.set_xlabel("requests in flight (numjobs × iodepth)")
    ax.set_ylabel("IOPS")
    ax.set_ylim(bottom=0)
    ax.set_title("4 KiB writes vs parallelism (red ×: >5% below the previous point)")
    ax.legend(fontsize=8)
    out.append(charts.save(fig, "scaling-iops"))
    out.append("")
    out.append(commands_block(res["commands"]))
    return "\n".join(out)
