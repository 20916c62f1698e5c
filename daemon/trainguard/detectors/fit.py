"""The robust fit of a free-space series: one Theil-Sen slope, the consumption rate it gives, the newest
consistent regime of it, and the measurement noise.

Disks of training hosts fill in steps (a checkpoint every N minutes) and empty in drops (a cleanup).
A least-squares line through such a staircase swings with every step; the slope is a Theil-Sen
estimate (median of pairwise slopes) over points bucketed across the window, using only pairs far
enough apart that a single step or drop cannot dominate.

A burst is not a trend until it has lasted: the window is halved from the old end while the older
half's rate disagrees with the newer half's (a download that started or stopped), and the rate and
the evidence are those of the newest part that is consistent.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

from trainguard.detectors.steps import steps

BUCKETS = 48  # points the window is reduced to; 48 -> ~1100 pairs, cheap in pure Python
MIN_POINTS = 4
RECENT = 60  # newest points the noise is judged on (10 min at the default interval)
CONSISTENT = 0.5  # halves of a regime whose rates differ by more than 2x are two regimes
NOISE_RATE = 1e-6  # fraction of the filesystem per second below which a rate is noise (~3.6 ‰/h)

Points = Sequence[tuple[float, float]]


STANDS_FOR = 300.0  # seconds of samples a history point stands for at most (a rollup's)


def theil_sen(points: Points, min_gap: float = 0.0) -> float | None:
    """The median of the slopes between pairs of points at least `min_gap` apart in time (and apart at
    all); None without such a pair. The one robust slope of the forecast: of the window, of the lows of
    a saw-tooth, of a neighbourhood of samples (detectors.despike)."""
    slopes = [
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(points)
        for t2, v2 in points[i + 1:]
        if t2 - t1 >= min_gap and t2 > t1
    ]
    return statistics.median(slopes) if slopes else None


def _bucketed(points: Points, start: float, end: float) -> list[tuple[float, float]]:
    """Last point per time bucket: a staircase keeps its steps, memory and work stay bounded."""
    width = max((end - start) / BUCKETS, 1e-9)
    out: dict[int, tuple[float, float]] = {}
    for ts, value in points:
        out[int((ts - start) / width)] = (ts, value)
    return [out[k] for k in sorted(out)]


def consumption(points: Points) -> float | None:
    """Robust bytes/s of consumption (positive: filling) over the points."""
    if len(points) < MIN_POINTS:
        return None
    span = points[-1][0] - points[0][0]
    reduced = _bucketed(points, points[0][0], points[-1][0])
    if len(reduced) < MIN_POINTS:
        return None
    slope = theil_sen(reduced, min_gap=span / 4)
    return None if slope is None else -slope


def regime(points: Points, size: float, min_span: float) -> tuple[float, float] | None:
    """(rate, evidence): the consumption rate of the newest consistent part of the points, and its span.

    While the older half of the span disagrees with the newer half (rates more than 2x apart, beyond
    noise and, on a staircase, beyond one write), the older half is another regime: a download that
    started, or one that stopped."""
    found = steps(points, size, least=0.0)[0]
    fitted = _consistent(points, size, min_span, found)
    if fitted is None:
        return None
    rate, span = fitted
    end = points[-1][0]
    if len(found) >= 3:
        # A staircase is as flat between its writes as after its last: it stopped only when the quiet
        # since its last write outlasts twice its longest interval (a write too small to tell from the
        # noise makes one interval of two).
        quiet = end - found[-1].end
        longest = max(b.start - a.start for a, b in itertools.pairwise(found))
        if rate > 0 and quiet >= max(min_span, 2 * longest):
            tail = [p for p in points if p[0] >= found[-1].end]
            now_rate = consumption(tail)
            if now_rate is not None and now_rate < CONSISTENT * rate:
                return now_rate, quiet
        return rate, span
    # A rate that stopped holding (a download that ended): its last min_span says so before the halves
    # do. Then the trend is that tail, whose evidence is short, unless the difference is within noise.
    tail = [p for p in points if p[0] >= end - min_span]
    if span > min_span and rate > 0:
        now_rate = consumption(tail)
        if now_rate is not None and now_rate < CONSISTENT * rate \
                and (rate - now_rate) * min_span > 4 * _jitter(tail) + NOISE_RATE * size * min_span:
            return now_rate, tail[-1][0] - tail[0][0]
    return rate, span


def noise(points: Points) -> float:
    """The measurement noise now: the jitter of the newest RECENT points."""
    return _jitter(points[-RECENT:])


def _jitter(points: Points) -> float:
    """Spread of the sample-to-sample changes around their median (the measurement noise)."""
    diffs = [b[1] - a[1] for a, b in itertools.pairwise(points)]
    if len(diffs) < 3:
        return 0.0
    mid = statistics.median(diffs)
    return 1.4826 * statistics.median(abs(d - mid) for d in diffs)


def _consistent(points: Points, size: float, min_span: float, found: Sequence) -> tuple[float, float] | None:
    end = points[-1][0]
    span = end - points[0][0]
    part = list(points)
    noise = NOISE_RATE * size
    halved = False
    while True:
        rate = consumption(part)
        if rate is None:
            return None
        half = span / 2
        if half < min_span:
            # Too short to halve again after a change: where in this part the new regime began is not
            # known, so it has held for half of it at most as far as evidence goes.
            return rate, (half if halved else span)
        older = consumption([p for p in part if p[0] <= end - half])
        newer = consumption([p for p in part if p[0] >= end - half])
        if older is None or newer is None:
            return rate, span
        hi, lo = max(older, newer), min(older, newer)
        if hi <= noise or lo >= CONSISTENT * hi or _one_write_apart(found, end - span, half, hi, lo):
            return rate, span
        part, span, halved = [p for p in part if p[0] >= end - half], half, True


def _one_write_apart(found: Sequence, start: float, half: float, hi: float, lo: float) -> bool:
    """On a staircase (three or more writes since `start`) a half's rate counts whole writes, of sizes that
    scatter: halves whose rates agree once its largest write moves from the faster to the slower are one
    rhythm whose writes fell unevenly, not two regimes."""
    sizes = [s.nbytes for s in found if s.start >= start]
    if len(sizes) < 3:
        return False
    moved = max(sizes) / half
    return lo + moved >= CONSISTENT * (hi - moved)


def least_squares(points: Points) -> tuple[float, float] | None:
    """(bytes/s of consumption, free bytes at the newest point) by the plain least-squares line through the
    samples (predict_linear's method: the line's value at the newest time, not the sample's); None without
    two distinct times. History keeps older samples as bucket means: each point weighs the time it stands
    for (half the way to each neighbour, at most STANDS_FOR: across a restart's gap nothing was sampled), so
    the line is that through the samples themselves, not one tilted toward the fine recent ones."""
    n = len(points)
    if n < 2:
        return None
    ts = [t for t, _ in points]
    gaps = [min(b - a, STANDS_FOR) for a, b in zip(ts, ts[1:])]
    weights = [(left + right) / 2 for left, right in zip([gaps[0], *gaps], [*gaps, gaps[-1]])]
    total = sum(weights)
    if total <= 0:
        return None
    mt = sum(w * t for w, t in zip(weights, ts)) / total
    mv = sum(w * v for w, (_, v) in zip(weights, points)) / total
    var = sum(w * (t - mt) ** 2 for w, t in zip(weights, ts))
    if var <= 0:
        return None
    slope = sum(w * (t - mt) * (v - mv) for w, (t, v) in zip(weights, points)) / var
    return -slope, mv + slope * (ts[-1] - mt)
