"""Experiment 7: writeback, through `logcache-bench drain --json` (its own rig: memory cache,
the emulated HDD in-process). Sorted versus unsorted drain time of the same random dirty blocks,
and a paced foreground writer's latency with and without writeback running. Full mode adds the
density sweep (the same blocks spread over wider spans).

This module only reads the JSON; it tolerates keys being added or renamed: every top-level
object holding "seconds" is a drain case, every object under "foreground" holding "p50_us" is a
latency case.
"""

import json

from harness.context import pick
from harness.report import commands_block, fmt, fmt_int, plt, table

NAME = "writeback"
TITLE = "Writeback: sorted versus unsorted drain to the emulated HDD, foreground latency"
COLUMNS = {"kind": str, "case": str, "span_mib": float}

CASE_LABELS = {
    "direct": "(a) the same writes straight to the disk",
    "drain_unsorted": "(b) drain, unsorted (log order)",
    "drain_sorted": "(c) drain, sorted (default writeback)",
}


def params(ctx):
    return pick(ctx, {
        # blocks and span scale together: the density (dirty share of the span) is what the
        # disk feels; the default is 4096 blocks over 128 MiB (12.5%).
        "smoke": {"main": ["--blocks", "64", "--span-mib", "2", "--writer-seconds", "0.5"],
                  "sweep": []},
        "quick": {"main": ["--blocks", "1024", "--span-mib", "32", "--writer-seconds", "3"],
                  "sweep": []},
        "full": {"main": [], "sweep": [8000, 1024, 256, 64]},
    })


def _drain(ctx, extra):
    argv = [ctx.bench_bin, "drain", "--json"] + [str(a) for a in extra]
    rc, out, err = ctx.run_output(argv, timeout=3600)
    if rc != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {rc}: {err[-1500:]}")
    objs = [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]
    if not objs:
        raise RuntimeError(f"no JSON from bench drain: {out[-500:]}")
    return objs[-1], ctx.redact(" ".join(argv))


def _rows(v, series, command):
    span_mib = v.get("span_bytes", 0) / (1 << 20)
    blocks = v.get("blocks")
    rows = []
    for key, val in v.items():
        if isinstance(val, dict) and "seconds" in val and key != "foreground":
            secs = float(val["seconds"])
            rows.append({
                "kind": "drain", "series": series, "case": key, "span_mib": span_mib,
                "blocks": blocks, "seconds": secs,
                "modelled_seconds": val.get("modelled_seconds"),
                "backing_ios": val.get("backing_ios"),
                "blocks_per_s": (blocks / secs) if blocks and secs > 0 else None,
                "command": command,
            })
    fg = v.get("foreground") or {}
    for key, val in fg.items():
        if isinstance(val, dict) and "p50_us" in val:
            rows.append({
                "kind": "foreground", "series": series, "case": key, "span_mib": span_mib,
                "writes": val.get("writes"), "p50_us": val.get("p50_us"),
                "p99_us": val.get("p99_us"), "p999_us": val.get("p999_us"),
                "writer_rate_per_s": fg.get("writer_rate_per_s"), "command": command,
            })
    return rows


def run(ctx):
    p = params(ctx)
    v, cmd = _drain(ctx, p["main"])
    ctx.log(f"   drain: speedup sorted vs unsorted {v.get('speedup_sorted_vs_unsorted')}")
    rows = _rows(v, "main", cmd)
    sweep = []
    for span in p["sweep"]:
        sv, scmd = _drain(ctx, ["--span-mib", span, "--writer-seconds", "0"])
        rows += _rows(sv, f"sweep-{span}", scmd)
        sweep.append(sv)
    return {"rows": rows, "params": p, "extra": {"json": v, "sweep_json": sweep}}


def check(rows):
    cases = {r["case"] for r in rows if r["kind"] == "drain"}
    if not cases:
        raise ValueError("writeback: no drain case in bench drain's JSON")
    for r in rows:
        if r["kind"] == "drain" and not (r["seconds"] > 0):
            raise ValueError(f"writeback: bad drain time {r}")


def _speedup(v):
    s = v.get("speedup_sorted_vs_unsorted")
    if s is None:
        try:
            s = v["drain_unsorted"]["seconds"] / v["drain_sorted"]["seconds"]
        except (KeyError, ZeroDivisionError, TypeError):
            return None
    return s


def summary(res):
    s = _speedup(res["extra"]["json"])
    if s is None:
        return []
    return [["sorted drain ≥ 3× faster than unsorted (bench drain, its dataset)", f"{s:.2f}×",
             "met" if s >= 3 else "**not met**"]]


def render(res, charts):
    v = res["extra"]["json"]
    rows = [r for r in res["rows"] if r["series"] == "main"]
    hdd = v.get("hdd", {})
    out = []
    out.append(
        f"`logcache-bench drain --json` (command below): {v.get('blocks')} distinct random 4 KiB "
        f"blocks over the first {v.get('span_bytes', 0) / (1 << 20):.0f} MiB of an "
        f"{v.get('backing_size_bytes', 0) / (1 << 30):.0f} GiB **emulated** 7200 rpm disk "
        f"(the in-process `HddDevice`: {hdd.get('rpm')} rpm, settle {hdd.get('settle_us')} µs, "
        f"full stroke {hdd.get('full_stroke_us')} µs, {fmt_int((hdd.get('bandwidth_bytes_per_s') or 0) / 1e6)} MB/s, "
        f"NCQ depth {hdd.get('ncq_depth')}), memory cache; writeback batches of "
        f"{v.get('writeback_batch_blocks')} blocks, {v.get('writeback_io_depth')} writes in flight. "
        "This benchmark runs the engine in-process (no NBD, no fio): it times writeback itself.")
    out.append("")
    order = ["direct", "drain_unsorted", "drain_sorted"]
    drains = sorted((r for r in rows if r["kind"] == "drain"),
                    key=lambda r: (order.index(r["case"]) if r["case"] in order else len(order), r["case"]))
    out.append(table(
        ["case", "wall s", "modelled disk s", "backing IOs", "blocks/s"],
        [[CASE_LABELS.get(r["case"], r["case"]), fmt(r["seconds"]), fmt(r.get("modelled_seconds")),
          fmt_int(r.get("backing_ios")), fmt_int(r.get("blocks_per_s"))] for r in drains],
        ["---", "---:", "---:", "---:", "---:"]))
    out.append("")
    s = _speedup(v)
    if s is not None:
        out.append(f"**Goal: sorted ≥ 3× faster than unsorted: {'met' if s >= 3 else 'not met'} "
                   f"({s:.2f}×)** on this dataset; dm-writeboost's own figure on its dataset: 2.4×.")
        out.append("")
    fgs = sorted((r for r in rows if r["kind"] == "foreground"), key=lambda r: r["case"] != "no_writeback")
    if fgs:
        fg = v.get("foreground", {})
        out.append(
            f"Foreground writer: {fmt_int(fg.get('writer_rate_per_s'))} random 4 KiB writes/s over "
            f"{(fg.get('span_bytes') or 0) / (1 << 20):.0f} MiB for {fg.get('seconds')} s per case "
            f"(latency per write call; the drain ran throughout: {fg.get('drain_ran_throughout')}).")
        out.append("")
        out.append(table(["foreground writes", "writes", "p50 µs", "p99 µs", "p99.9 µs"],
                         [[r["case"].replace("_", " "), fmt_int(r.get("writes")), fmt(r.get("p50_us")),
                           fmt(r.get("p99_us")), fmt(r.get("p999_us"))] for r in fgs],
                         ["---", "---:", "---:", "---:", "---:"]))
        out.append("")
    pl = plt()
    ncharts = 2 if fgs else 1
    fig, axes = pl.subplots(1, ncharts, figsize=(5 * ncharts, 3.6))
    if ncharts == 1:
        axes = [axes]
    ax = axes[0]
    ax.bar([CASE_LABELS.get(r["case"], r["case"]).split(" ")[0] for r in drains],
           [r["seconds"] for r in drains], color=["#999", "#c44", "#4a4"][:len(drains)])
    ax.set_ylabel("seconds to write the dirty set")
    ax.set_title("drain time (a) direct, (b) unsorted, (c) sorted")
    if fgs:
        ax = axes[1]
        xs = range(len(fgs))
        for i, (k, lab) in enumerate([("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9")]):
            ax.bar([x + (i - 1) * 0.25 for x in xs], [r.get(k) or 0 for r in fgs], 0.25, label=lab)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["case"].replace("_", " ") for r in fgs])
        ax.set_yscale("log")
        ax.set_ylabel("µs per write")
        ax.set_title("foreground write latency")
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.append(charts.save(fig, "writeback-drain"))
    out.append("")
    sweep = [r for r in res["rows"] if r["series"].startswith("sweep-") or r["series"] == "main"]
    spans = sorted({r["span_mib"] for r in sweep if r["kind"] == "drain"}, reverse=True)
    if len(spans) > 1:
        out.append("Density sweep: the same number of blocks spread over wider spans "
                   "(`--span-mib N --writer-seconds 0`):")
        out.append("")
        trs = []
        for sp in spans:
            d = {r["case"]: r["seconds"] for r in sweep if r["kind"] == "drain" and r["span_mib"] == sp}
            sp_x = (d["drain_unsorted"] / d["drain_sorted"]) if d.get("drain_sorted") and d.get("drain_unsorted") else None
            trs.append([fmt_int(sp), fmt(d.get("direct")), fmt(d.get("drain_unsorted")),
                        fmt(d.get("drain_sorted")), f"{sp_x:.2f}×" if sp_x else "–"])
        out.append(table(["span MiB", "(a) direct s", "(b) unsorted s", "(c) sorted s", "sorted vs unsorted"], trs))
        out.append("")
    out.append(commands_block(res["commands"]))
    return "\n".join(out)
