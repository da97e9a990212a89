"""Builds BENCHMARKS.md from stored results (bench/results/<mode>/<experiment>.json), charts
included, followed verbatim by the hand-written part (bench/manual.md)."""

import datetime
import re
import importlib
import json
import os

from . import machine

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANUAL = os.path.join(BENCH_DIR, "manual.md")


class Charts:
    """Where an experiment's PNG charts go, and the link the markdown uses."""

    def __init__(self, chart_dir, doc_dir):
        self.dir = chart_dir
        self.doc_dir = doc_dir
        os.makedirs(chart_dir, exist_ok=True)

    def save(self, fig, name):
        path = os.path.join(self.dir, name + ".png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        import matplotlib.pyplot as plt
        plt.close(fig)
        rel = os.path.relpath(path, self.doc_dir)
        return f"![{name}]({rel})"


def plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as p
    return p


# -- formatting helpers used by the experiments --------------------------------------------------

def fmt_int(v):
    return "–" if v is None else f"{v:,.0f}"


def human(n):
    """Bytes as the largest binary unit that keeps a whole number: 4 GiB, 256 MiB."""
    for unit, mult in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return f"{n:,} bytes"


def fmt(v, nd=2):
    if v is None:
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


def table(headers, rows, align=None):
    align = align or ["---:" if i else "---" for i in range(len(headers))]
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def header(res):
    """The lines every section starts with: date, mode, machine, how long, how to rerun."""
    m = res["machine"]
    return (
        f"*Measured {res['started_utc']} by `{res['invocation']}` ({res['mode']} mode, "
        f"{res['seconds']:.0f} s). Machine: {machine.one_line(m)}"
        + (f", at end {res['loadavg_end']}" if res.get("loadavg_end") else "")
        + " (other work on this shared machine shows here and moves every figure).*\n\n"
        f"Raw rows: `bench/results/{res['mode']}/{res['experiment']}.csv` and `.json` (the JSON "
        f"also lists every command run)."
    )


def commands_block(cmds, limit=12):
    """Distinct commands, in order, in a sh block (at most `limit`, then a count)."""
    seen = []
    for c in cmds:
        c = re.sub(r"fio-\d{4}-", "fio-N-", c)
        if c not in seen:
            seen.append(c)
    shown = seen[:limit]
    more = len(seen) - len(shown)
    text = "```sh\n" + "\n".join(shown) + "\n```"
    if more > 0:
        text += f"\n\n({more} more distinct commands in the JSON.)"
    return text


def hdd_text(hdd):
    params = ", ".join(f"`--{k} {v}`" for k, v in hdd["params"].items())
    return (
        "The hard disk is an **emulation**, not a disk: `logcache-bench sim-hdd` serves a sparse file "
        "over NBD and makes each request take as long as a 7200 rpm disk would. Its model "
        "(`crates/testkit/src/hdd.rs`): tracks of what passes the head in one revolution; a "
        "seek when the track changes, from the settle time rising with the square root of the "
        "distance to a full stroke across the platter; then the wait until the sector comes "
        "round (the angle under the head is the time modulo a revolution); then the transfer at "
        "the media rate; a back-to-back continuation pays only the transfer; one actuator; up "
        "to the NCQ depth of queued requests served in elevator order; a flush costs a fixed "
        "time and is a barrier; no on-disk write cache. What it delivers through NBD is measured "
        "below (experiment `seed000`, contender (1); seed 000's real disk: 883 KB/s, 221 IOPS). "
        "Parameters used (the command's defaults unless the harness set "
        f"them): {params}."
    )


# Issue 20's goals ("The speed it must reach"), in the issue's order: key (the fourth element
# an experiment's summary() row carries, {"issue20": key, ...}), the goal, and the experiment
# that measures it. The report gives each its own row, "not measured" when no stored result has it.
ISSUE20 = [
    ("seqread-1m-qd8", "1 MiB sequential read of cached data, clean, iodepth 8: ≥ 0.90 of nbdkit "
     "file", "iopath"),
    ("seqread-dirty-1m-qd8", "1 MiB sequential read of cached data, dirty, iodepth 8: ≥ 0.90 of "
     "nbdkit file", "iopath"),
    ("randread-4k-qd32", "4 KiB random read of cached data, iodepth 32: ≥ 1.00 of nbdkit file",
     "iopath"),
    ("randread-4k-qd1", "4 KiB random read of cached data, iodepth 1: ≥ 0.90 of nbdkit file",
     "iopath"),
    ("seqwrite-1m-qd8", "1 MiB sequential write, iodepth 8: ≥ 0.90 of nbdkit file", "iopath"),
    ("randread-miss-4k-qd32", "4 KiB random read misses to the emulated HDD, iodepth 32: ≥ 0.95 "
     "of the emulated HDD alone", "iopath"),
    ("randwrite-wt-4k-qd16", "write-through 4 KiB random writes, iodepth 16: ≥ 0.90 of the "
     "emulated HDD alone", "iopath"),
    ("mkfs-xfs", "`mkfs.xfs` (default discard) of a 16 GiB disk over the emulated HDD: ≤ 2× the "
     "HDD alone", "mkfs"),
    ("mkfs-ext4", "`mkfs.ext4` (default discard) of a 16 GiB disk over the emulated HDD: ≤ 2× "
     "the HDD alone", "mkfs"),
    ("randwrite-4k-qd64-null", "still holds: 4 KiB random writes, iodepth 64 (HDD + logcache, "
     "seed 000's job): ≥ 0.95 of nbdkit null", "seed000"),
    ("engine-1", "still holds: `bench engine` ≥ 1M writes/s with p50 ≤ 1 µs, one writer",
     "engine"),
    ("engine-2", "still holds: `bench engine` ≥ 1M writes/s with p50 ≤ 1 µs, two writers",
     "engine"),
    ("fg-read-p999", "still holds: foreground read p99.9 ≤ 1 ms with writeback running (seed "
     "004's job, write-back)", "latency"),
]


def split_goals(summaries):
    """The general Goals rows, and issue 20's rows by key (with their CPU column)."""
    general, issue20 = [], {}
    for row in summaries:
        tag = row[3] if len(row) > 3 else None
        if tag and tag.get("issue20"):
            issue20[tag["issue20"]] = (row[1], row[2], tag.get("cpu", "–"))
            if tag.get("also_general"):
                general.append(row[:3])
        else:
            general.append(row[:3])
    return general, issue20


def issue20_table(issue20):
    rows = []
    for key, goal, exp in ISSUE20:
        if key in issue20:
            figure, verdict, cpu = issue20[key]
        else:
            figure, verdict, cpu = ("not in the stored results", f"not measured: `bench/run --quick "
                                    f"--only {exp}`", "–")
        rows.append([goal, figure, cpu, verdict, f"`{exp}`"])
    return table(["goal", "figure (this run; ratios: median (min–max, rounds) of per-round ratios)",
                  "server CPU µs/IO (logcache / reference)", "verdict", "experiment"], rows,
                 ["---", "---:", "---:", "---", "---"])


def render_report(names, results_dir, doc_path, chart_dir, mode):
    doc_dir = os.path.dirname(doc_path)
    os.makedirs(doc_dir, exist_ok=True)
    charts = Charts(chart_dir, doc_dir)
    sections = []
    summaries = []
    loaded = []
    for name in names:
        path = os.path.join(results_dir, name + ".json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            res = json.load(f)
        mod = importlib.import_module(f"experiments.{name}")
        loaded.append(res)
        body = mod.render(res, charts)
        sections.append(f"## {res['title']}\n\n{header(res)}\n\n{body}\n")
        summ = getattr(mod, "summary", None)
        if summ:
            summaries.extend(summ(res))
    missing = [n for n in names if not os.path.exists(os.path.join(results_dir, n + ".json"))]

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "# logcache benchmarks",
        "",
        "<!-- Generated by bench/run from bench/results/" + mode + "/*.json and bench/manual.md. "
        "Do not edit: change the experiments (bench/experiments/) or bench/manual.md and rerun. -->",
        "",
        f"Generated {now} from the results of `bench/run --{mode}` (each section gives its own "
        "date, command and machine). Regenerate everything with `bench/run --quick` (about 12 "
        "minutes) or `bench/run --full` (long); `bench/run --smoke` is the CI check. All "
        "figures of the generated sections go through fio's nbd engine (`--ioengine=nbd`, one "
        "NBD connection per fio job) to servers on Unix sockets, and contenders are alternated "
        "within one run, because absolute numbers on this shared 2-vCPU virtual machine drift "
        "from run to run: compare figures within a section, not across sections or runs.",
        "",
    ]
    if loaded:
        parts += [hdd_text(loaded[0]["hdd"]), ""]
    if summaries:
        general, issue20 = split_goals(summaries)
        parts += ["## Goals", "", table(["goal", "figure", "verdict"], general,
                                        ["---", "---:", "---"]), ""]
        parts += ["### Issue 20: the speed it must reach", "",
                  "One row per goal of issue 20, each from its experiment's section below (server "
                  "CPU: the server process's user+system time over the measurement ÷ fio's IOs; "
                  "the emulated HDD's includes its timing loop).", "",
                  issue20_table(issue20), ""]
    loads = []
    starts = []
    for res in loaded:
        v = res["machine"].get("loadavg_at_start")
        if v:
            starts.append(float(v.split()[0]))
            loads.append(starts[-1])
        if res.get("loadavg_end"):
            loads.append(float(res["loadavg_end"].split()[0]))
    if loads:
        nproc = loaded[0]["machine"].get("nproc") or 0
        # A 1-minute average at an experiment's start still carries the previous experiment's
        # own fio jobs; only a start above the vCPU count says that other work competed.
        parts += [
            f"Verdicts are this run's alone. The 1-minute load average ranged from "
            f"{min(loads):.2f} to {max(loads):.2f} at the starts and ends of the experiments "
            f"on {nproc} vCPUs (the benchmark's own fio jobs and servers count in it)"
            + (": at some starts other work was competing for the CPUs, which lowers every "
               "figure not taken from the emulated disk's clock (each section gives its own load)."
               if starts and max(starts) > nproc else "."),
            "",
            "Goals not met are analysed, with the experiments that test each explanation, among "
            "the hand-measured sections at the end (\"What holds (3) below 95% of nbdkit null\", "
            "\"Resume of the 24 GiB cache, rerun\", \"The scaling flag at 256 in flight, "
            "rerun\" and \"`scaling` with rounds\" (its undecided verdict); "
            "issue 20's: \"The IO path: cached reads and large IO against nbdkit's file plugin\" "
            "and the issue-20 subsections after it).",
            ""]
    if missing:
        parts += ["Not run yet in this mode: " + ", ".join(f"`{m}`" for m in missing) + ".", ""]
    parts += sections
    if os.path.exists(MANUAL):
        with open(MANUAL) as f:
            parts += ["", f.read().rstrip(), ""]
    with open(doc_path, "w") as f:
        f.write("\n".join(parts).rstrip() + "\n")
    return doc_path
