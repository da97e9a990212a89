#!/usr/bin/python3
"""Medians of scripts/bench-rbd-matrix.sh's matrix lines (ROUNDS > 1 gives several per config),
and each config's median over a reference config's, row by row; then the latency lines'
medians (foreground IOPS, p99, p99.9, max) per background-job count and config.

usage: scripts/rbd-matrix-medians.py OUT [REFERENCE...]   (default references: rbd-alone lc-qnbd)
Reads the lines after the last "# <date> secs=..." header of OUT (one invocation's run).
"""
import statistics
import sys

path = sys.argv[1]
refs = sys.argv[2:] or ["rbd-alone", "lc-qnbd"]
lines = open(path).read().splitlines()
start = max((i for i, l in enumerate(lines) if l.startswith("# ") and " secs=" in l), default=-1)
runs = {}
latency = {}
for line in lines[start + 1:]:
    f = line.split()
    if len(f) >= 6 and f[0] == "matrix":
        runs.setdefault((f[2], f[3], f[4]), {}).setdefault(f[1], []).append(float(f[5]))
    if len(f) >= 7 and f[0] == "latency":
        latency.setdefault((int(f[2]), f[1]), []).append([float(x) for x in f[3:7]])
print(lines[start] if start >= 0 else "# (no header)")
for (rw, bs, depth), by in runs.items():
    med = {c: statistics.median(v) for c, v in by.items()}
    cols = " ".join(f"{c}={m:.1f}(n={len(by[c])})" for c, m in med.items())
    ratios = " ".join(
        f"{c}/{r}={med[c] / med[r]:.2f}"
        for r in refs if med.get(r)
        for c in med if c != r and c.startswith("lc-")
    )
    print(f"{rw} {bs} qd{depth}: {cols} | {ratios}")
for (bg, c), rows in sorted(latency.items()):
    med = [statistics.median(r[i] for r in rows) for i in range(4)]
    print(f"latency bg={bg} {c} (n={len(rows)}): fg_IOPS {med[0]:.0f} p99 {med[1]:.0f} us "
          f"p99.9 {med[2]:.0f} us max {med[3]:.0f} us")
