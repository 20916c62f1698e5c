"""The fill trend of a mount from its history of available bytes: rate, time to full, and how much
evidence backs them.

Disks of training hosts fill in steps (a checkpoint every N minutes) and empty in drops (a cleanup).
A least-squares line through such a staircase swings with every step; the slope is a Theil-Sen
estimate (median of pairwise slopes) over points bucketed across the window, using only pairs far
enough apart that a single step or drop cannot dominate.

Changes of regime:
- a single large write (a dataset download) followed by min_span of quiet is a change point: the trend
  is what happened after it. Two or more steps are a rhythm (checkpoints) and the whole window is fitted;
- a burst is not a trend until it has lasted: the window is halved from the old end while the older
  half's rate disagrees with the newer half's (a download that started or stopped), and the rate and
  the evidence (``Trend.evidence``) are those of the newest part that is consistent. The detector
  alerts only on an ETA no longer than ``evidence_ratio`` times that evidence, so a short burst cannot
  be extrapolated into an alarm;
- drops (free space rising by a deletion-sized amount) are read by what they mean: one long enough ago
  is a change point; one recent drop means the writer's pace counts, with nothing assumed to be deleted
  again; repeated drops are a regime (a cron cleanup, a trainer keeping its last N checkpoints, a GC at
  a high-water mark). The *envelope of the lows* (free space just before each cleanup) says whether the
  saw-tooth is still going down across cycles; only then is the saw-tooth run forward (a disk that hits
  zero before the next cleanup is caught), and one whose cleanups keep up is left alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

BUCKETS = 48  # points the window is reduced to; 48 -> ~1100 pairs, cheap in pure Python
MIN_POINTS = 4
DROP_FRACTION = 0.005  # a rise in free space of >= 0.5 % of the filesystem is a deletion, not noise
CONSISTENT = 0.5  # halves of a regime whose rates differ by more than 2x are two regimes
NOISE_RATE = 1e-6  # fraction of the filesystem per second below which a rate is noise (~3.6 ‰/h)

Points = Sequence[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Trend:
    slope: float  # bytes per second of *consumption* (positive: filling) the ETA is based on
    span: float  # seconds of data the slope was fitted on
    points: int
    eta: float | None  # seconds until avail reaches 0; None when not filling
    cleanup_every: float | None = None  # repeated drops: their median interval, seconds
    cleanup_frees: float | None = None  # and the median bytes each one frees
    cleanup_low: float | None = None  # the lowest free space a cleanup has come at (keeping up)
    evidence: float = 0.0  # seconds over which the rate has held (the ETA's support); defaults to span

    def __post_init__(self) -> None:
        if not self.evidence:
            object.__setattr__(self, "evidence", self.span)


@dataclass(frozen=True, slots=True)
class Drop:
    ts: float  # time of the last sample of the jump
    index: int  # its index in the points
    freed: float  # bytes the deletion gave back (a write: minus the bytes written)
    start: int = 0  # index of the sample just before the jump


@dataclass(frozen=True, slots=True)
class Step:
    start: float  # time of the sample before the fall
    end: float  # time of its last falling sample
    nbytes: float


def steps(points: Points, size: float) -> tuple[list[Step], float]:
    """Checkpoint-sized falls of free space (beyond noise and the background rate), and that background
    rate in bytes/s (positive: filling)."""
    if len(points) < 3:
        return [], 0.0
    diffs = [(points[i][1] - points[i - 1][1], points[i][0] - points[i - 1][0]) for i in range(1, len(points))]
    base = statistics.median(d / max(dt, 1e-9) for d, dt in diffs)
    spread = 1.4826 * statistics.median(abs(d - base * dt) for d, dt in diffs)
    found: list[Step] = []
    i = 0
    while i < len(diffs):
        if diffs[i][0] - base * diffs[i][1] < -4 * spread - 1.0:
            j = i
            # Hysteresis: a write starts beyond 4x the noise and goes on while it still falls past
            # half of it, so jitter on top of a slower write does not split it in two.
            while j + 1 < len(diffs) and diffs[j + 1][0] - base * diffs[j + 1][1] < -0.5 * spread - 1.0:
                j += 1
            first = i
            while first > 0 and (not found or points[first - 1][0] >= found[-1].end) \
                    and diffs[first - 1][0] - base * diffs[first - 1][1] < -0.5 * spread - 1.0:
                first -= 1  # its first, slower samples
            # One more sample each side: a write starts and ends between samples, and its partial
            # first and last changes would otherwise be left to the background.
            if first > 0 and (not found or points[first - 1][0] >= found[-1].end):
                first -= 1
            last = min(j + 2, len(points) - 1)
            fell = points[first][1] - points[last][1]  # the background's share over a write is small
            if fell >= max(size * DROP_FRACTION, 8 * spread):
                found.append(Step(points[i][0], points[j + 1][0], fell))  # timed by its clear part
            i = j + 1
        else:
            i += 1
    # The background: what fell outside the steps, over the span (the median of the per-sample changes
    # leans toward the steps when they take several samples each).
    span = points[-1][0] - points[0][0]
    outside = points[0][1] - points[-1][1] - sum(s.nbytes for s in found)
    return found, max(outside / span if span > 0 else -base, 0.0)


def _bucketed(points: Points, start: float, end: float) -> list[tuple[float, float]]:
    """Last point per time bucket: a staircase keeps its steps, memory and work stay bounded."""
    width = max((end - start) / BUCKETS, 1e-9)
    out: dict[int, tuple[float, float]] = {}
    for ts, value in points:
        out[int((ts - start) / width)] = (ts, value)
    return [out[k] for k in sorted(out)]


def theil_sen(points: Points, min_gap: float) -> float | None:
    slopes = [
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(points)
        for t2, v2 in points[i + 1:]
        if t2 - t1 >= min_gap
    ]
    return statistics.median(slopes) if slopes else None


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
    noise), the older half is another regime: a download that started, or one that stopped."""
    end = points[-1][0]
    span = end - points[0][0]
    part = list(points)
    noise = NOISE_RATE * size
    while True:
        rate = consumption(part)
        if rate is None:
            return None
        half = span / 2
        if half < min_span:
            return rate, span
        older = consumption([p for p in part if p[0] <= end - half])
        newer = consumption([p for p in part if p[0] >= end - half])
        if older is None or newer is None:
            return rate, span
        hi, lo = max(older, newer), min(older, newer)
        if hi <= noise or lo >= CONSISTENT * hi:
            return rate, span
        part, span = [p for p in part if p[0] >= end - half], half


def jumps(points: Points, size: float, rising: bool) -> list[Drop]:
    """Runs of consecutive rises (deletions) or falls (one large write) in free space that add up to
    a deletion-sized amount. A large rm takes several samples; counting each sample as its own drop
    would make one deletion look like a fast periodic cleanup."""
    limit = max(size * DROP_FRACTION, 1.0)
    sign = 1.0 if rising else -1.0
    found: list[Drop] = []
    i = 1
    while i < len(points):
        if sign * (points[i][1] - points[i - 1][1]) > 0:
            j = i
            while j + 1 < len(points) and sign * (points[j + 1][1] - points[j][1]) > 0:
                j += 1
            moved = sign * (points[j][1] - points[i - 1][1])
            if moved >= limit:
                found.append(Drop(points[j][0], j, sign * moved, i - 1))
            i = j + 1
        else:
            i += 1
    return found


def _without_drops(points: Points, drops: Sequence[Drop]) -> list[tuple[float, float]]:
    """The points as if nothing had been deleted: each deletion's bytes taken back out from then on."""
    out = list(points[:drops[0].index])
    given_back = 0.0
    for k, drop in enumerate(drops):
        given_back += drop.freed
        end = drops[k + 1].index if k + 1 < len(drops) else len(points)
        out.extend((ts, value - given_back) for ts, value in points[drop.index:end])
    return out


def _sawtooth_eta(avail: float, gross: float, loss: float, first_in: float, period: float) -> float | None:
    """Seconds until free space reaches 0 filling at `gross` bytes/s, with cleanups `first_in` seconds
    from now and then every `period` seconds that leave the disk `loss` bytes lower each period;
    None when the cleanups keep up."""
    if avail <= gross * first_in:
        return avail / gross  # full before the next cleanup
    if loss <= 0:
        return None
    freed = gross * period - loss
    level = avail - gross * first_in + freed  # just after the next cleanup
    # The lowest point of each period is just before its cleanup: the first period whose low reaches 0.
    k = max(0, math.ceil((level - gross * period) / loss))
    return first_in + k * period + (level - k * loss) / gross


def _low(points: Points, drop: Drop) -> tuple[float, float]:
    """The saw-tooth's low before a cleanup: the least free space in the few samples before it (with
    averaged history a save just before the cleanup is spread over them)."""
    return min(points[max(drop.start - 3, 0):drop.start + 1], key=lambda p: p[1])


def _lows_loss(points: Points, drops: Sequence[Drop], period: float, size: float, largest_write: float) -> float:
    """Bytes the saw-tooth loses per period, from the envelope of its lows (free space just before each
    cleanup); 0 when the lows are not going down beyond what their own scatter and the steps explain."""
    lows = [_low(points, d) for d in drops]
    slope = theil_sen(lows, 0.0) or 0.0
    decline = -slope * (lows[-1][0] - lows[0][0])
    scatter = max((abs(v - lows[0][1] - slope * (t - lows[0][0])) for t, v in lows), default=0.0)
    tolerance = max(size * DROP_FRACTION, 2 * scatter, largest_write)
    return -slope * period if decline > tolerance else 0.0


def _cleanup_regime(pts: Points, drops: Sequence[Drop], gross: float, evidence: float, size: float,
                    now: float) -> Trend:
    latest = pts[-1][1]
    span = pts[-1][0] - pts[0][0]
    whole = [d for d in drops if d.start >= 3]  # not one the window begins in, or too near for its low
    drops = whole if len(whole) >= 2 else drops
    period = statistics.median(b.ts - a.ts for a, b in zip(drops, drops[1:]))
    freed = statistics.median(d.freed for d in drops)
    lows = [_low(pts, d)[1] for d in drops]
    # Checkpoint writes decide how far past its mark a GC triggers: lows anywhere within one checkpoint
    # below the mark are neither a decline nor a missed cleanup.
    largest_write = max((s.nbytes for s in steps(pts, size)[0]), default=0.0)
    margin = max(size * DROP_FRACTION, max(lows) - min(lows), largest_write)
    overdue = now >= drops[-1].ts + 1.5 * period and latest < statistics.median(lows)
    if overdue or latest < min(lows) - margin:
        # The cleanup did not come when or where it used to: it may have stopped, so count on none.
        return Trend(slope=gross, span=span, points=len(pts), eta=latest / gross, evidence=evidence)
    loss = _lows_loss(pts, drops, period, size, largest_write)
    if loss <= 0:
        # The lows hold: each cleanup has come before the disk went lower (a high-water-mark GC, a
        # keep-last trainer). The next is awaited at that level, whenever the writer gets there.
        eta = None
    else:
        # Going down across cycles: run the saw-tooth forward, cleanups expected one period apart
        # (a late one is still awaited while the disk is above its lows).
        first_in = max(drops[-1].ts + period - now, 0.0)
        eta = _sawtooth_eta(latest, gross, loss, first_in, period)
    return Trend(slope=gross, span=span, points=len(pts), eta=eta, cleanup_every=period, cleanup_frees=freed,
                 cleanup_low=min(lows) if eta is None else None, evidence=evidence)


def _stepped_eta(pts: Points, size: float, rate: float, now: float) -> float | None:
    """With a checkpoint rhythm (size and period learned from the steps) that explains the rate, the disk
    is full during the write that does not fit: that write's time, not where a line through the
    staircase reaches zero (up to one period later). None without such a rhythm."""
    found, background = steps(pts, size)
    if len(found) < 3:
        return None
    every = statistics.median(b.start - a.start for a, b in zip(found, found[1:]))
    nbytes = statistics.median(s.nbytes for s in found[-5:])
    if every <= 0 or abs(nbytes / every + background - rate) > 0.3 * rate:
        return None
    write = statistics.median(s.end - s.start for s in found)
    avail, at = pts[-1][1], found[-1].start + every
    while at < now:
        at += every
    for k in range(int(avail / nbytes) + 2):
        free = avail - background * (at - now) - k * nbytes  # just before write k
        if free <= 0:
            return max(at - now + free / background, 0.0) if background > 0 else at - now
        if free < nbytes:
            return at - now + write * free / nbytes
        at += every
    return None


def fill_trend(avail: Points, size: float, now: float, window: float, min_span: float) -> Trend | None:
    """Trend of available bytes over the window; None until min_span of data exists."""
    pts = [p for p in avail if now - window <= p[0] <= now]
    if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < min_span:
        return None
    latest = pts[-1][1]
    drops = jumps(pts, size, rising=True)
    if len(drops) == 1 and pts[-1][0] - drops[0].ts >= min_span:
        pts = pts[drops[0].index:]  # a change point with enough data after it
        drops = []
    if not drops:
        steps = jumps(pts, size, rising=False)
        if len(steps) == 1 and pts[-1][0] - steps[0].ts >= min_span and steps[0].index > 0:
            # One large write (a dataset download, a single checkpoint) and quiet since: in the middle
            # of the window it would tilt the whole fit; what happened after it is the trend.
            pts = pts[steps[0].index:]
    span = pts[-1][0] - pts[0][0]
    fitted = regime(_without_drops(pts, drops) if drops else pts, size, min_span)
    if fitted is None:
        return None
    rate, evidence = fitted
    if not drops or len(drops) == 1 or rate <= 0:
        # No deletion, or one recent one: the writer's pace, without assuming someone deletes again.
        eta = None if rate <= 0 else (not drops and _stepped_eta(pts, size, rate, now)) or latest / rate
        return Trend(slope=rate, span=span, points=len(pts), eta=eta, evidence=evidence)
    return _cleanup_regime(pts, drops, rate, evidence, size, now)
