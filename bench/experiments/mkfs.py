"""Experiment 10 (issue 20): `mkfs.xfs` and `mkfs.ext4`, each with its default discard, of a
disk through logcache in front of the emulated HDD against the emulated HDD alone.

Runs scripts/bench-mkfs.sh (the hand-measured sections' command): each disk attached with
nbdfuse + losetup (no nbd kernel module here), the two alternated per round. Needs root and
/dev/fuse.
"""

import os

from harness.context import pick
from harness.contenders import median
from harness.report import commands_block, fmt, table
from harness.procs import run_tracked

NAME = "mkfs"
TITLE = "mkfs with its default discard (issue 20): logcache over the emulated HDD vs the HDD alone"
COLUMNS = {"round": int, "fs": str, "target": str, "seconds": float}

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "bench-mkfs.sh")
GOAL_RATIO = 2.0
FILESYSTEMS = ("xfs", "ext4")


def params(ctx):
    return pick(ctx, {
        "smoke": {"rounds": 1, "size": "1G", "cache_size": "256M"},
        "quick": {"rounds": 2, "size": "16G", "cache_size": "2G"},
        "full": {"rounds": 3, "size": "16G", "cache_size": "2G"},
    })


def run(ctx):
    p = params(ctx)
    env = {"BIN": os.path.dirname(ctx.bin), "SIZE": p["size"], "CACHE_SIZE": p["cache_size"]}
    argv = ["sh", SCRIPT, str(p["rounds"])]
    ctx.commands.append(" ".join(f"{k}={v}" for k, v in env.items() if k != "BIN")
                        + " scripts/bench-mkfs.sh " + str(p["rounds"]))
    rc, out, err = run_tracked(argv, timeout=1800, env=env)
    if rc != 0:
        raise RuntimeError(f"scripts/bench-mkfs.sh exited {rc}: {err[-1500:]}")
    rows = []
    seen = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[0] not in FILESYSTEMS:
            continue
        fs, target, secs = parts[0], parts[1], float(parts[2])
        seen[(fs, target)] = seen.get((fs, target), 0) + 1
        rows.append({"round": seen[(fs, target)], "fs": fs, "target": target, "seconds": secs})
        ctx.log(f"   round {seen[(fs, target)]} mkfs.{fs} {target:<8} {secs:.2f} s")
    return {"rows": rows, "params": p}


def check(rows):
    for fs in FILESYSTEMS:
        for target in ("hdd", "logcache"):
            if not any(r["fs"] == fs and r["target"] == target for r in rows):
                raise ValueError(f"mkfs: no mkfs.{fs} time on {target}")


def medians(rows, fs):
    m = {}
    for target in ("hdd", "logcache"):
        xs = [r["seconds"] for r in rows if r["fs"] == fs and r["target"] == target]
        if xs:
            m[target] = median(xs)
    return m


def summary(res):
    out = []
    for fs in FILESYSTEMS:
        m = medians(res["rows"], fs)
        if not m.get("hdd") or "logcache" not in m:
            continue
        ratio = m["logcache"] / m["hdd"]
        out.append([f"issue 20: mkfs.{fs} of a {res['params']['size']} disk (default discard) ≤ 2× "
                    "the time on the emulated HDD alone",
                    f"{ratio:.2f}× ({m['logcache']:.2f} s / {m['hdd']:.2f} s)",
                    "met" if ratio <= GOAL_RATIO else "**not met**",
                    {"issue20": f"mkfs-{fs}"}])
    return out


def render(res, charts):
    rows = res["rows"]
    p = res["params"]
    out = [
        f"`mkfs.xfs -f` and `mkfs.ext4 -F` (each discards the whole disk first) of a {p['size']} "
        f"disk: logcache ({p['cache_size']} cache file on /var/tmp) in front of the emulated HDD, "
        "and the emulated HDD alone, each attached with nbdfuse + losetup, alternated, "
        f"{p['rounds']} round(s); seconds per mkfs, medians compared.",
        "",
    ]
    tab = []
    for fs in FILESYSTEMS:
        m = medians(rows, fs)
        per = {t: " ".join(fmt(r["seconds"]) for r in rows if r["fs"] == fs and r["target"] == t)
               for t in ("hdd", "logcache")}
        ratio = m["logcache"] / m["hdd"] if m.get("hdd") and "logcache" in m else None
        tab.append([f"mkfs.{fs}", per["hdd"], per["logcache"],
                    f"**{ratio:.2f}**" if ratio is not None else "–",
                    f"≤ {GOAL_RATIO:.0f}: " + ("met" if ratio is not None and ratio <= GOAL_RATIO
                                              else "missed")])
    out.append(table(["seconds", "emulated HDD alone", "logcache over it", "ratio of medians",
                      "goal"], tab, ["---", "---", "---", "---:", "---"]))
    out.append("")
    out.append(commands_block(res["commands"]))
    return "\n".join(out)
