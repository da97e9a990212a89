"""Alternating contenders within one run.

A contender is a name, a way to get a fresh URI before each measurement (and to put things
away after it), and the fio job to run. Rounds rotate the order so no contender always runs
first or last; or, with order="balanced", follow a Williams design, so each contender also comes
right after each other one equally often (rotation keeps one cyclic order: there a contender
always follows the same one, and what that one leaves behind, a warm or dropped page cache, a
co-tenant's burst it set off, lands on it in every round).
"""

import math

from .fio import run_fio


class Contender:
    def __init__(self, name, label, prepare, fio_kwargs, finish=None):
        self.name = name
        self.label = label
        self.prepare = prepare      # () -> uri
        self.finish = finish        # () -> dict of extra columns (or None)
        self.fio_kwargs = fio_kwargs


def balanced_orders(n, rounds):
    """Orders (lists of indexes 0..n-1) for `rounds` rounds: the rows of a Williams design,
    repeated. Over each full cycle (n rows for an even n, 2n for an odd one: the rows and their
    mirror images) every contender takes every position equally often and comes right after
    every other contender equally often; a cut-short cycle comes close."""
    if n <= 1:
        return [list(range(n)) for _ in range(rounds)]
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % n for x in first] for i in range(n)]
    if n % 2:
        rows += [list(reversed(row)) for row in rows]
    return [rows[r % len(rows)] for r in range(rounds)]


def alternate(ctx, contenders, rounds, rotate=True, order="rotate"):
    """Runs every contender once per round. order: "rotate" (each round starts one further
    along the list; the list itself when rotate=False) or "balanced" (balanced_orders)."""
    rows = []
    n = len(contenders)
    plan = balanced_orders(n, rounds) if order == "balanced" else None
    for r in range(rounds):
        if plan is not None:
            order_r = [contenders[i] for i in plan[r]]
        else:
            order_r = contenders[r % n:] + contenders[:r % n] if rotate else contenders
        for c in order_r:
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


def median_interval(xs, confidence=0.90):
    """(low, high): a distribution-free interval holding the median of what xs were drawn
    from with at least `confidence` (order statistics x(j) and x(n+1-j), the largest j whose
    binomial(n, 1/2) coverage reaches it); the whole range when xs are too few for it (fewer
    than 5 at 0.90). Exact for any distribution of independent rounds, no resampling."""
    xs = sorted(xs)
    lo = _interval_index(len(xs), confidence)
    return xs[lo], xs[len(xs) - 1 - lo]


def _interval_index(n, confidence):
    """The 0-based index j of the interval's low end (x(j+1) .. x(n-j))."""
    assert n > 0
    lo = 0
    for j in range(1, n // 2 + 1):
        if interval_coverage(n, j) < confidence:
            break
        lo = j
    return lo


def interval_coverage(n, j):
    """The chance that the (j+1)-th smallest and the (j+1)-th largest of n independent rounds
    hold the median of their distribution: 1 - 2 P(B <= j), B ~ binomial(n, 1/2)."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n


def median_interval_coverage(n, confidence=0.90):
    """The coverage median_interval reaches for n rounds (below `confidence` when n is too
    small: then the interval is the whole range)."""
    return interval_coverage(n, _interval_index(n, confidence))


def verdict(rs, goal, confidence=0.90):
    """"met" when the whole interval of the median (median_interval) is at or above the goal,
    "**not met**" when it is all below, else "undecided": the goal lies inside the noise of this
    run's rounds, and another run of the same code may land on either side of it."""
    lo, hi = median_interval(rs, confidence)
    if lo >= goal:
        return "met"
    if hi < goal:
        return "**not met**"
    return "undecided (the goal is inside the median's 90% interval)"


def spread(rs):
    """"0.93 (0.81–1.10, 8 rounds)": the median of per-round ratios, their min–max, and how
    many rounds; the median is the figure the goal is judged on (one outlying round cannot
    move it, as it moves a mean of two)."""
    return f"{median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f}, {len(rs)} round{'s' if len(rs) != 1 else ''})"
