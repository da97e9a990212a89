#!/usr/bin/env python3
"""How evenly a load run served its connections at the start (docs/RELIABILITY.md, "Load").

Reads fio's per-request completion-latency logs (DIR/lat_clat.N.log, one per job, written with
`--write_lat_log=DIR/lat` and no `--log_avg_msec`: columns are job-relative completion time in
ms, latency in ns, direction, size) and prints, as JSON:
  - per connection, the time its first 64 requests were complete and how many requests it
    completed in the first second (an even start has these close together);
  - per 500 ms of the run, the completions and the longest request that completed in it.

usage: scripts/soak-start.py DIR [FIRST_ROUND=64]
"""
import collections
import glob
import json
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    log_dir = sys.argv[1]
    first_round = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    paths = glob.glob(f"{log_dir}/lat_clat.*.log")
    if not paths:
        sys.exit(f"no fio latency logs (lat_clat.N.log) in {log_dir}: run fio with --write_lat_log={log_dir}/lat")
    round_ms, first_second = [], []
    per_window = collections.defaultdict(lambda: [0, 0.0])
    for path in paths:
        rows = []
        with open(path) as log:
            for line in log:
                fields = line.split(",")
                rows.append((int(fields[0]), int(fields[1]) / 1e6))
        rows.sort()
        if len(rows) >= first_round:
            round_ms.append(rows[first_round - 1][0])
        first_second.append(sum(1 for t, _ in rows if t < 1000))
        for t, latency_ms in rows:
            window = per_window[t // 500 * 500]
            window[0] += 1
            window[1] = max(window[1], latency_ms)
    print(json.dumps({
        "connections": len(paths),
        f"first_{first_round}_done_ms": sorted(round_ms),
        "completed_in_first_second": sorted(first_second),
        "per_500ms": [{"from_ms": w, "completions": n, "max_latency_ms": round(m)}
                      for w, (n, m) in sorted(per_window.items())],
    }))


if __name__ == "__main__":
    main()
