"""A description of the machine and software a run measured."""

import os
import platform
import re
import subprocess


def _cmd(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:
        return ""


def _fs(path):
    out = _cmd(["findmnt", "-n", "-o", "FSTYPE", "--target", path]).splitlines()[:1]
    out = out[0].strip() if out else ""
    return out or "?"


def describe(repo):
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"MemTotal:\s+(\d+)", f.read())
            mem_kib = int(m.group(1)) if m else 0
    except OSError:
        pass
    commit = _cmd(["git", "-C", repo, "rev-parse", "--short=12", "HEAD"])
    # What the harness itself writes (results, the report) does not make the build dirty.
    dirty = _cmd(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no", "--", ".",
                  ":!bench/results", ":!docs/bench", ":!docs/BENCHMARKS.md"])
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / (1 << 20), 1),
        "kernel": platform.release(),
        "os": _cmd(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "loadavg_at_start": " ".join(open("/proc/loadavg").read().split()[:3]),
        "var_tmp_fs": _fs("/var/tmp"),
        "dev_shm_fs": _fs("/dev/shm"),
        "fio": _cmd(["fio", "--version"]),
        "nbdkit": _cmd(["nbdkit", "--version"]),
        "python": platform.python_version(),
        "commit": commit + ("-dirty" if dirty else ""),
    }


def one_line(m):
    return (f"{m['nproc']} vCPUs ({m['cpu']}), {m['memory_gib']} GiB RAM, Linux {m['kernel']}, "
            f"/var/tmp on {m['var_tmp_fs']}, /dev/shm on {m['dev_shm_fs']}; {m['fio']}, "
            f"{m['nbdkit']}; load average at start {m['loadavg_at_start']}; "
            f"logcache at commit {m['commit']}")
