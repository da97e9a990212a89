"""Alternating contenders within one run.

A contender is a name, a way to get a fresh URI before each measurement (and to put things
away after it), and the fio job to run. Rounds rotate the order so no contender always runs
first or last.
"""

from .fio import run_fio


class Contender:
    def __init__(self, name, label, prepare, fio_kwargs, finish=None):
        self.name = name
        self.label = label
        self.prepare = prepare      # () -> uri
        self.finish = finish        # () -> dict of extra columns (or None)
        self.fio_kwargs = fio_kwargs


def alternate(ctx, contenders, rounds, rotate=True):
    rows = []
    n = len(contenders)
    for r in range(rounds):
        order = contenders[r % n:] + contenders[:r % n] if rotate else contenders
        for c in order:
            uri = c.prepare()
            try:
                res = run_fio(ctx, uri, label=c.name, **c.fio_kwargs)
            finally:
                extra = c.finish() if c.finish else None
            row = {"round": r + 1, "contender": c.name, "label": c.label}
            row.update({k: v for k, v in c.fio_kwargs.items() if k in ("rw", "bs", "iodepth", "numjobs")})
            row.update(res)
            if extra:
                row.update(extra)
            ctx.log(f"   round {r + 1} {c.name:<14} {res['iops']:>12,.0f} IOPS {res['mb_s']:>10,.1f} MB/s")
            rows.append(row)
    return rows


def mean_by(rows, key, value, where=None):
    acc = {}
    for r in rows:
        if where and not where(r):
            continue
        acc.setdefault(r[key], []).append(r[value])
    return {k: sum(v) / len(v) for k, v in acc.items()}


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2


def spread(rs):
    """"0.93 (0.81–1.10, 8 rounds)": the median of per-round ratios, their min–max, and how
    many rounds; the median is the figure the goal is judged on (one outlying round cannot
    move it, as it moves a mean of two)."""
    return f"{median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f}, {len(rs)} round{'s' if len(rs) != 1 else ''})"
