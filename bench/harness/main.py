"""bench/run: runs the experiments, stores their rows, regenerates the report."""

import argparse
import csv
import datetime
import importlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import machine
from .context import Context

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH_DIR)

# Report order. Each module lives in bench/experiments/<name>.py.
EXPERIMENTS = ["seed000", "peers", "writeback", "scaling", "matrix", "segments", "latency",
               "engine", "iopath", "mkfs"]

MODES = ("smoke", "quick", "full")


class MalformedRows(RuntimeError):
    pass


def load_experiment(name):
    return importlib.import_module(f"experiments.{name}")


def validate(mod, rows):
    """Every row a dict holding the module's COLUMNS with the right types; numbers finite."""
    if not isinstance(rows, list) or not rows:
        raise MalformedRows(f"{mod.NAME}: no rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise MalformedRows(f"{mod.NAME}: row {i} is not a dict")
        for col, typ in mod.COLUMNS.items():
            if col not in r:
                raise MalformedRows(f"{mod.NAME}: row {i} lacks {col!r}: {r}")
            v = r[col]
            if typ is float:
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                    raise MalformedRows(f"{mod.NAME}: row {i} {col}={v!r} is not a finite number")
                if v < 0:
                    raise MalformedRows(f"{mod.NAME}: row {i} {col}={v!r} is negative")
            elif not isinstance(v, typ):
                raise MalformedRows(f"{mod.NAME}: row {i} {col}={v!r} is not {typ.__name__}")
    check = getattr(mod, "check", None)
    if check:
        check(rows)


def write_results(results_dir, res):
    os.makedirs(results_dir, exist_ok=True)
    base = os.path.join(results_dir, res["experiment"])
    with open(base + ".json", "w") as f:
        json.dump(res, f, indent=1, sort_keys=False)
        f.write("\n")
    cols = []
    for r in res["rows"]:
        for k in r:
            if k not in cols:
                cols.append(k)
    with open(base + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in res["rows"]:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})


def find_binary(args):
    if args.bin:
        return os.path.abspath(args.bin)
    if os.environ.get("LOGCACHE_BIN"):
        return os.path.abspath(os.environ["LOGCACHE_BIN"])
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    profile = "release"
    path = os.path.join(os.path.abspath(target), profile, "logcache")
    if not args.no_build:
        print(f"building {path} and logcache-bench beside it "
              "(cargo build --release -p logcache -p logcache-bench) ...", flush=True)
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "logcache", "-p",
                        "logcache-bench"], cwd=REPO, check=True)
    if not os.path.exists(path):
        sys.exit(f"bench/run: no logcache binary at {path}")
    bench_path = os.path.join(os.path.dirname(path), "logcache-bench")
    if not os.path.exists(bench_path):
        sys.exit(f"bench/run: no logcache-bench binary at {bench_path} "
                 "(cargo build --release -p logcache-bench)")
    return path


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--quick", dest="mode", action="store_const", const="quick",
                   help="every experiment at small sizes; about 12 minutes")
    g.add_argument("--full", dest="mode", action="store_const", const="full",
                   help="every experiment at full sizes; long")
    g.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                   help="tiny sizes, results to a temp dir, checks only that rows are well-formed")
    p.add_argument("--only", help="comma-separated experiments: " + ",".join(EXPERIMENTS))
    p.add_argument("--out", help="write results/, BENCHMARKS.md and bench/*.png under DIR "
                                 "instead of bench/results and docs/")
    p.add_argument("--bin", help="the logcache binary, with logcache-bench beside it (default: "
                                 "$LOGCACHE_BIN, else cargo's release build, built first)")
    p.add_argument("--no-build", action="store_true", help="do not run cargo build")
    p.add_argument("--no-report", action="store_true", help="run and store results only")
    p.add_argument("--report-only", action="store_true",
                   help="regenerate the report from stored results, run nothing")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    mode = args.mode
    names = EXPERIMENTS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        bad = [n for n in names if n not in EXPERIMENTS]
        if bad:
            sys.exit(f"bench/run: unknown experiment(s) {bad}; known: {EXPERIMENTS}")
    sys.path.insert(0, BENCH_DIR)

    if args.out:
        out = os.path.abspath(args.out)
    elif mode == "smoke":
        out = tempfile.mkdtemp(prefix="lcbench-smoke.")
    else:
        out = None
    # A smoke run's temp dir is scratch: removed when it passes, kept (and named) when it fails.
    scratch = out if (mode == "smoke" and not args.out) else None
    code = run_all(args, argv, mode, names, out)
    if scratch and code == 0:
        shutil.rmtree(scratch, ignore_errors=True)
    elif scratch:
        print(f"bench/run: smoke results kept in {scratch}", file=sys.stderr)
    return code


def run_all(args, argv, mode, names, out):
    """Runs the experiments `names` into `out` (None: the repository) and writes the report."""
    results_dir = os.path.join(out, "results", mode) if out else os.path.join(BENCH_DIR, "results", mode)
    doc_path = os.path.join(out, "BENCHMARKS.md") if out else os.path.join(REPO, "docs", "BENCHMARKS.md")
    chart_dir = os.path.join(os.path.dirname(doc_path), "bench")

    invocation = "bench/run " + " ".join(shlex.quote(a) for a in argv)
    if args.report_only:
        from .report import render_report
        render_report(EXPERIMENTS, results_dir, doc_path, chart_dir, mode)
        print(f"wrote {doc_path}")
        return 0

    bin_path = find_binary(args)
    os.makedirs(results_dir, exist_ok=True)
    ctx = Context(mode, bin_path, log_file=os.path.join(results_dir, "run.log"))
    open(ctx.log_file, "w").close()

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    t_all = time.monotonic()
    failures = []
    mach = machine.describe(REPO)
    from .servers import hdd_model
    ctx.log(f"mode {mode}; results in {results_dir}; machine: {machine.one_line(mach)}")
    try:
        hdd = hdd_model(ctx)
        ctx.log(f"emulated HDD: {hdd['kind']} {hdd['params']}")
        for name in names:
            mod = load_experiment(name)
            ctx.begin_experiment()
            ctx.log(f"== {name}: {mod.TITLE}")
            started = datetime.datetime.now(datetime.timezone.utc)
            mach = dict(mach, loadavg_at_start=" ".join(open("/proc/loadavg").read().split()[:3]))
            t = time.monotonic()
            try:
                got = mod.run(ctx)
                validate(mod, got["rows"])
            except KeyboardInterrupt:
                raise
            except Exception as e:  # one experiment failing does not stop the others
                import traceback
                traceback.print_exc()
                ctx.log(f"!! {name} failed: {e}")
                failures.append((name, str(e).splitlines()[0] if str(e) else repr(e)))
                ctx.procs.stop_all()
                continue
            finally:
                ctx.procs.stop_all()
                ctx.remove_scratch()
            secs = time.monotonic() - t
            res = {
                "experiment": name,
                "title": mod.TITLE,
                "mode": mode,
                "date": started.strftime("%Y-%m-%d"),
                "started_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "seconds": round(secs, 1),
                "loadavg_end": " ".join(open("/proc/loadavg").read().split()[:3]),
                "invocation": invocation,
                "machine": mach,
                "hdd": hdd,
                "params": got.get("params", {}),
                "extra": got.get("extra", {}),
                "commands": ctx.commands,
                "rows": got["rows"],
            }
            write_results(results_dir, res)
            ctx.log(f"   {name}: {len(got['rows'])} rows in {secs:.1f}s")
    except KeyboardInterrupt as e:
        ctx.log(f"interrupted ({e}); stopping every server")
        ctx.cleanup()
        return 130
    finally:
        ctx.cleanup()

    total = time.monotonic() - t_all
    ctx.log(f"all experiments: {total:.1f}s")
    if not args.no_report:
        from .report import render_report
        render_report(EXPERIMENTS, results_dir, doc_path, chart_dir, mode)
        ctx.log(f"wrote {doc_path} and charts in {chart_dir}")
    if failures:
        for n, e in failures:
            print(f"FAILED {n}: {e}", file=sys.stderr)
        print(f"{len(names) - len(failures)} passed, {len(failures)} failed")
        return 1
    print(f"{len(names)} passed, 0 failed")
    return 0
