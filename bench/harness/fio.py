"""fio through its nbd engine: building the command line and reading its JSON.

fio's nbd engine prints a line to stdout, so the JSON always goes to a file (--output).
"""

import json
import os
import shlex

from .procs import run_tracked

PERCENTILES = [50, 90, 99, 99.9]


class FioError(RuntimeError):
    pass


def fio_argv(uri, rw, bs, iodepth, size, runtime, numjobs=1, io_size=None, name="job",
             output=None, time_based=True, extra=None):
    """The fio command line for one measurement.

    time_based: run for `runtime` seconds. Without it, fio stops after io_size bytes (per job)
    or runtime seconds, whichever comes first (used so a cache is never overfilled).
    A `uri` that is a path (starts with "/") is a file fio reads itself: io_uring, O_DIRECT
    (the device's own ceiling, no protocol)."""
    if uri.startswith("/"):
        target = ["--ioengine=io_uring", f"--filename={uri}"]
    else:
        target = ["--ioengine=nbd", f"--uri={uri}"]
    argv = [
        "fio",
        f"--name={name}",
        *target,
        f"--rw={rw}",
        f"--bs={bs}",
        f"--iodepth={iodepth}",
        f"--numjobs={numjobs}",
        f"--size={size}",
        "--direct=1",
        "--norandommap",
        "--randrepeat=0",
        f"--runtime={runtime}",
        "--group_reporting",
        "--percentile_list=" + ":".join(str(p) for p in PERCENTILES),
    ]
    if time_based:
        argv.append("--time_based")
    if io_size is not None:
        argv.append(f"--io_size={io_size}")
    for k, v in (extra or {}).items():
        argv.append(f"--{k}={v}" if v is not None else f"--{k}")
    argv += ["--output-format=json", f"--output={output or 'fio.json'}"]
    return argv


def _parse(path):
    with open(path, "r", errors="replace") as f:
        text = f.read()
    start = text.find("{")
    if start < 0:
        raise FioError(f"no JSON in {path}: {text[:500]!r}")
    return json.loads(text[start:])


def _pct(clat, p):
    pcts = (clat or {}).get("percentile") or {}
    for k, v in pcts.items():
        if abs(float(k) - p) < 1e-6:
            return v / 1000.0
    return None


def summarize(data):
    """Reads read+write figures of the (group-reported) job."""
    job = data["jobs"][0]
    if job.get("error"):
        raise FioError(f"fio job error {job['error']}")
    out = {"runtime_s": job.get("job_runtime", job.get("elapsed", 0)) / 1000.0}
    iops = bw = ios = 0.0
    lat_side = None
    for side in ("read", "write"):
        s = job.get(side) or {}
        if s.get("total_ios", 0) > 0:
            iops += s.get("iops", 0.0)
            bw += s.get("bw_bytes", 0)
            ios += s.get("total_ios", 0)
            if lat_side is None or s["total_ios"] > (job[lat_side].get("total_ios", 0)):
                lat_side = side
    out["iops"] = iops
    out["mb_s"] = bw / 1e6
    out["ios"] = int(ios)
    if lat_side:
        s = job[lat_side]
        clat = s.get("clat_ns") or {}
        lat = s.get("lat_ns") or {}
        out["lat_mean_us"] = (lat.get("mean") or clat.get("mean") or 0.0) / 1000.0
        for p in PERCENTILES:
            key = "p" + str(p).replace(".", "")
            out[f"{key}_us"] = _pct(clat, p)
    return out


def runtime_seconds(runtime):
    """fio's `--runtime` value in seconds: a number of seconds, or a string with one of fio's
    time suffixes ("500ms", "2s"). fio reads a fraction of a second written as a number
    (`--runtime=1.5`) as whole seconds (1 s), so shorter runs are written in ms."""
    if isinstance(runtime, str):
        for suffix, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0), ("m", 60.0)):
            if runtime.endswith(suffix):
                return float(runtime[:-len(suffix)]) * scale
    return float(runtime)


def run_fio(ctx, uri, rw, bs, iodepth, size, runtime, numjobs=1, io_size=None, label="fio",
            time_based=True, extra=None):
    """Runs one fio measurement; returns summarize() plus the command line."""
    ctx.fio_count += 1
    out_path = os.path.join(ctx.tmp, f"fio-{ctx.fio_count:04d}-{label}.json")
    argv = fio_argv(uri, rw, bs, iodepth, size, runtime, numjobs=numjobs, io_size=io_size,
                    name=label, output=out_path, time_based=time_based, extra=extra)
    ctx.record_command(argv)
    rc, out, err = run_tracked(argv, timeout=runtime_seconds(runtime) * 4 + 120)
    if rc != 0:
        raise FioError(f"fio failed ({rc}): {shlex.join(argv)}\n{err[-2000:]}\n{out[-500:]}")
    res = summarize(_parse(out_path))
    res["fio_command"] = ctx.redact(shlex.join(argv))
    return res
