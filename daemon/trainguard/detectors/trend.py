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
  a high-water mark), forecast as its next low by detectors.sawtooth from the cycles learned so far,
  but counted on only where the rhythm keeps the disk from filling (sawtooth.keeps_up); otherwise the
  alert comes no later than the plain line through the window, nor than the window alone says;
- outliers are taken out first (detectors.despike), and a rise at the newest samples waits until it stays;
- until the history covers a window the trend is `learning`, and a deletion in sight is not alerted on.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.detectors import sawtooth, staircase
from trainguard.detectors.despike import despiked
from trainguard.detectors.steps import DROP_FRACTION, steps

BUCKETS = 48  # points the window is reduced to; 48 -> ~1100 pairs, cheap in pure Python
MIN_POINTS = 4
RECENT = 60  # newest points the noise is judged on (10 min at the default interval)
CONSISTENT = 0.5  # halves of a regime whose rates differ by more than 2x are two regimes
GAP = 900.0  # seconds without a sample: the daemon was down (or the clock jumped); nothing was seen
NOISE_RATE = 1e-6  # fraction of the filesystem per second below which a rate is noise (~3.6 ‰/h)
MAX_ERROR = 0.1  # relative ETA error beyond which an alert counts on no earlier ETA (forecast.level)

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
    cycles: tuple = ()  # cleanup cycles learned so far (sawtooth.Cycle), handed to the next fit
    next_cleanup_in: float | None = None  # a saw-tooth: seconds until its next cleanup is expected
    eta_without_cleanup: float | None = None  # and seconds to full if it does not come
    cleanup_missed: bool = False  # a saw-tooth whose cleanup passed both its level and its time
    eta_error: float = 0.0  # relative standard error of the ETA where it is known (checkpoint steps)
    eta_early: float | None = None  # earliest credible ETA: a saw-tooth's lows, a staircase's writes at their error
    bounded: bool = False  # learned cleanups not known to keep up (sawtooth.keeps_up): no later than the plain fit
    learning: bool = False  # the history covers less than a window yet
    quiet: bool = False  # and shows a deletion whose rhythm is not known: shown, not alerted on

    def __post_init__(self) -> None:
        if not self.evidence:
            object.__setattr__(self, "evidence", self.span)


@dataclass(frozen=True, slots=True)
class Drop:
    ts: float  # time of the last sample of the jump
    index: int  # its index in the points
    freed: float  # bytes the deletion gave back (a write: minus the bytes written)
    start: int = 0  # index of the sample just before the jump


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
    fitted = _consistent(points, size, min_span)
    if fitted is None:
        return None
    rate, span = fitted
    # A rate that stopped holding (a download that ended): its last min_span says so before the halves
    # do. Then the trend is that tail, whose evidence is short, unless the difference is within noise.
    end = points[-1][0]
    tail = [p for p in points if p[0] >= end - min_span]
    # Not on a staircase (three or more steps, of any size beyond noise): between its steps it is as flat.
    if span > min_span and rate > 0 and len(steps(points, size, least=0.0)[0]) < 3:
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
    diffs = [b[1] - a[1] for a, b in zip(points, points[1:])]
    if len(diffs) < 3:
        return 0.0
    mid = statistics.median(diffs)
    return 1.4826 * statistics.median(abs(d - mid) for d in diffs)


def _consistent(points: Points, size: float, min_span: float) -> tuple[float, float] | None:
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
        if hi <= noise or lo >= CONSISTENT * hi:
            return rate, span
        part, span, halved = [p for p in part if p[0] >= end - half], half, True


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
            # A level that stays where the run took it (the median of three to five samples after it, of
            # up to five before), not a run of noise or outliers that the next samples take back.
            before = statistics.median(v for _, v in points[max(i - 5, 0):i])
            after = [v for _, v in points[j:j + 5]]
            if moved >= limit and len(after) >= 3 and sign * (statistics.median(after) - before) >= moved / 2:
                # What it freed (a write: minus what it wrote) is what the run moved plus what the writer
                # wrote meanwhile at the pace around it: a run of averaged history spans minutes, and
                # cleanups seen short by them leave that much of the fill in the line between them.
                took = points[j][0] - points[i - 1][0]
                pace = _pace(points[max(i - 5, 0):i], points[j:j + 5])
                found.append(Drop(points[j][0], j, points[j][1] - points[i - 1][1] + pace * took, i - 1))
            i = j + 1
        else:
            i += 1
    return found


def _pace(*parts: Points) -> float:
    """Bytes/s the free space falls between consecutive points of each part (the median: robust to noise)."""
    rates = [(a[1] - b[1]) / (b[0] - a[0]) for part in parts for a, b in zip(part, part[1:]) if b[0] > a[0]]
    return statistics.median(rates) if rates else 0.0


def _without_drops(points: Points, drops: Sequence[Drop]) -> list[tuple[float, float]]:
    """The points as if nothing had been deleted: each deletion's bytes taken back out from then on."""
    out = list(points[:drops[0].index])
    given_back = 0.0
    for k, drop in enumerate(drops):
        given_back += drop.freed
        end = drops[k + 1].index if k + 1 < len(drops) else len(points)
        out.extend((ts, value - given_back) for ts, value in points[drop.index:end])
    return out


def _low(points: Points, drop: Drop) -> float:
    """The saw-tooth's low before a cleanup: the least free space in the few samples before it (with
    averaged history a save just before the cleanup is spread over them)."""
    return min(v for _, v in points[max(drop.start - 3, 0):drop.start + 1])


def _burst(pts: Points, write: Drop) -> bool:
    """A run of falls that was much faster than what came after it (a download, one checkpoint), not a
    steady fill whose averaged points happen to fall sample after sample."""
    took = max(pts[write.index][0] - pts[write.start][0], 1.0)
    after = consumption(pts[write.index:])
    return after is None or after < CONSISTENT * (-write.freed / took)


def _cleanup_regime(pts: Points, cycles: Sequence[sawtooth.Cycle], gross: float, evidence: float, size: float,
                    largest_write: float, now: float) -> Trend:
    # Checkpoint writes decide how far past its mark a GC triggers: lows anywhere within one checkpoint
    # below the mark are neither a decline nor a missed cleanup.
    nxt = sawtooth.next_low(cycles, pts[-1][1], gross, size, largest_write, now)
    return Trend(slope=gross, span=pts[-1][0] - pts[0][0], points=len(pts), eta=nxt.eta,
                 cleanup_every=nxt.every, cleanup_frees=nxt.frees,
                 cleanup_low=nxt.low if nxt.eta is None else None, evidence=evidence, cycles=tuple(cycles),
                 next_cleanup_in=nxt.next_in, eta_without_cleanup=nxt.eta_without, cleanup_missed=nxt.stopped,
                 eta_error=nxt.error, eta_early=nxt.early)


def _plain(pts: Points, cycles: tuple) -> Trend:
    """The plain full-window fit: one robust line through the window as it is, no cleanup counted on;
    its evidence is the window, from the last gap in it on."""
    rate = consumption(pts) or 0.0
    span = pts[-1][0] - pts[0][0]
    gap = _seen_since(pts)
    return Trend(slope=rate, span=span, points=len(pts), eta=pts[-1][1] / rate if rate > 0 else None,
                 evidence=span if gap is None else max(pts[-1][0] - gap, 1.0), cycles=cycles)


def _no_later(rhythm: Trend, plain: Trend) -> Trend:
    """The trend of a rhythm that is not known to keep up (sawtooth.keeps_up): it alerts no later than the
    plain one. It is the rhythm's own forecast only where that alerts whenever the plain one would (its
    ETA as short, also where the alert counts on the earliest credible one, on as many samples, at least as
    well backed by its evidence; forecast.level is monotone in each), else the plain one."""
    mine, other = _alerted_eta(rhythm), _alerted_eta(plain)
    if mine is not None and (other is None or (
            mine <= other and rhythm.points >= plain.points and mine * plain.evidence <= other * rhythm.evidence)):
        return dataclasses.replace(rhythm, bounded=True)
    return dataclasses.replace(plain, bounded=True)


def _alerted_eta(trend: Trend) -> float | None:
    """The ETA forecast.level may alert on: the earliest credible one where its error is known well enough."""
    if trend.eta is None or trend.eta_early is None or trend.eta_error > MAX_ERROR:
        return trend.eta
    return min(trend.eta, trend.eta_early)


def _seen_since(pts: Points) -> float | None:
    """The first time after the last gap in the points (GAP without a sample: the daemon was down, or
    the clock jumped), None without one."""
    return next((b[0] for a, b in zip(reversed(pts[:-1]), reversed(pts[1:])) if b[0] - a[0] > GAP), None)


def _stepped(pts: Points, size: float, rate: float, now: float) -> staircase.Stepped | None:
    """The staircase forecast (detectors.staircase) where the window shows a checkpoint rhythm."""
    # Writes smaller than a deletion-sized share of the disk are a rhythm too: counted by them, the disk
    # is full during the write that does not fit, up to a period before a line through them says.
    found, background = steps(pts, size, least=0.0)
    found = [s for s in found if s.start > pts[min(3, len(pts) - 1)][0]]  # not one the window cuts into
    if len(found) < 3:
        return None
    return staircase.stepped_eta(pts, found, background, rate, now)


def fill_trend(avail: Points, size: float, now: float, window: float, min_span: float,
               known: Sequence[sawtooth.Cycle] = ()) -> Trend | None:
    """Trend of available bytes over the window; None until min_span of data exists. `known`: the
    cleanup cycles learned by earlier fits (Trend.cycles), for saw-tooths slower than the window shows."""
    pts = whole = _settled(despiked([p for p in avail if now - window <= p[0] <= now]), size)
    if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < min_span:
        return None
    drops = seen = jumps(pts, size, rising=True)
    cycles = sawtooth.merge(known, [sawtooth.Cycle(d.ts, _low(pts, d), d.freed) for d in drops if d.start >= 3],
                            now)
    if len(drops) == 1 and len(cycles) < 2 and pts[-1][0] - drops[0].ts >= min_span:
        pts = pts[drops[0].index:]  # a change point with enough data after it
        drops = []
    if not drops:
        writes = jumps(pts, size, rising=False)
        if len(writes) == 1 and pts[-1][0] - writes[0].ts >= min_span and writes[0].index > 0 \
                and _burst(pts, writes[0]) and len(steps(pts, size, least=0.0)[0]) < 3:
            # One large write (a dataset download, a single checkpoint) and quiet since: in the middle
            # of the window it would tilt the whole fit; what happened after it is the trend. Not the
            # one write of a rhythm that happened to pass the deletion-sized mark.
            pts = pts[writes[0].index:]
    fitted = regime(_without_drops(pts, drops) if drops else pts, size, min_span)
    if fitted is None:
        return None
    rate, evidence = fitted
    # A rate holds only over time that was watched: after a gap in the history (a restart) the
    # evidence starts again, whatever the fit across the gap says.
    seen_since = _seen_since(pts)
    if seen_since is not None:
        evidence = max(min(evidence, pts[-1][0] - seen_since), 1.0)  # (0 would read as "all of the span")
    trend, proven = _forecast(pts, whole, bool(drops), cycles, rate, evidence, size, now)
    if trend.bounded and known:
        # Cycles learned before the window, in a rhythm not known to keep up, may not delay the alert past
        # what the window alone says either (a fit with nothing learned: its own cycles, or the plain line).
        alone = fill_trend(avail, size, now, window, min_span)
        if alone is not None:
            trend = dataclasses.replace(_no_later(trend, alone), cycles=cycles)  # the learned ones go on
    if whole[0][0] > now - window + GAP:
        # Warm-up: the history covers less than a window. A fill with no deletion in sight is what it
        # seems, from when it began (a download that started minutes after the daemon has held only
        # since); with a deletion in sight it may be a churn not yet seen for one period: shown, not
        # alerted on.
        held = _held(pts, trend.slope, max(6 * noise(pts), max(
            (s.nbytes for s in steps(pts, size, least=0.0)[0]), default=0.0))) if trend.slope > 0 else trend.evidence
        trend = dataclasses.replace(trend, learning=True, quiet=bool(seen) and not proven,
                                    evidence=max(min(trend.evidence, held), 1.0))
    return trend


def _held(pts: Points, rate: float, tolerance: float) -> float:
    """Seconds back from the newest point over which every point lies within `tolerance` of the line at
    `rate` through the newest few: how long that rate has held. A noise-free series (whole blocks, a
    steady writer) has a jitter of 0: a second's fill is the least tolerance, a stamp is no finer."""
    tolerance = max(tolerance, abs(rate) * 1.0, 1.0)
    t_last = pts[-1][0]
    anchor = statistics.median(v - rate * (t_last - t) for t, v in pts[-5:])
    since = t_last
    for t, v in reversed(pts):
        if abs(v - anchor - rate * (t_last - t)) > tolerance:
            break
        since = t
    return t_last - since


def _settled(pts: Points, size: float) -> list[tuple[float, float]]:
    """The points without a deletion-sized rise at their end that jumps() does not count yet (fewer than
    three samples from its last rising one on: an outlier, or a deletion whose next samples are still to
    come). Kept, its first samples would read as a disk with that much more room at the same pace."""
    n = len(pts)
    for j in (n - 1, n - 2):  # where a rising run may end unconfirmed
        if j >= 1 and pts[j][1] > pts[j - 1][1] and (j == n - 1 or pts[j + 1][1] <= pts[j][1]):
            i = j
            while i > 1 and pts[i - 1][1] > pts[i - 2][1]:
                i -= 1
            # (a run of a few samples: a long one is a disk being drained, not one deletion)
            if j - i < 6 and pts[j][1] - pts[i - 1][1] >= max(size * DROP_FRACTION, 1.0):
                return list(pts[:i])
            break
    return list(pts)


def _forecast(pts: Points, whole: Points, dropped: bool, cycles: tuple, rate: float, evidence: float, size: float,
              now: float) -> tuple[Trend, bool]:
    """(the trend at `rate`, whether it counts on a rhythm that keeps up: sawtooth.keeps_up)."""
    span = pts[-1][0] - pts[0][0]
    if len(cycles) < 2 or rate <= 0:
        # No deletion, or one recent one: the writer's pace, without assuming someone deletes again.
        stepped = _stepped(pts, size, rate, now) if rate > 0 and not dropped else None
        if stepped is not None:
            return Trend(slope=rate, span=span, points=len(pts), eta=stepped.eta, evidence=evidence,
                         cycles=cycles, eta_error=stepped.error, eta_early=stepped.early), False
        return Trend(slope=rate, span=span, points=len(pts), eta=None if rate <= 0 else pts[-1][1] / rate,
                     evidence=evidence, cycles=cycles), False
    largest_write = max((s.nbytes for s in steps(pts, size)[0]), default=0.0)
    rhythm = _cleanup_regime(pts, cycles, rate, evidence, size, largest_write, now)
    if sawtooth.keeps_up(cycles, rate, size, largest_write, noise(whole)):
        return rhythm, True
    return _no_later(rhythm, _plain(whole, cycles)), False
