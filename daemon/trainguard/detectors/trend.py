"""Time-to-full forecast from the trend of available bytes.

Disks of training hosts fill in steps (a checkpoint every N minutes) and empty in
drops (a cleanup). A least-squares line through such a staircase swings with
every step; instead the slope is a Theil-Sen estimate (median of pairwise slopes)
over points bucketed across the window, using only pairs far enough apart that a
single step or drop cannot dominate.

A single large write (a dataset download) followed by at least min_span of quiet
is a change point too: in the middle of the window it would tilt the fit by about
its size over the window, a forecast for a disk that has stopped filling. Two or
more such steps are a rhythm (checkpoints) and the whole window is fitted. (A run
saving a huge checkpoint only every few hours is therefore forecast only once two
of its steps are in the window; the usage thresholds cover it meanwhile.)

Drops (free space rising by a deletion-sized amount, over one sample or a run of
them) are handled by what they mean:
- one drop long enough ago is a change point (someone cleaned up, a run
  restarted): the trend is fitted on the data after it;
- one recent drop: the fill rate is measured with the deletion taken out, and
  nothing is assumed to be deleted again;
- repeated drops are a regime (a cron cleanup, a trainer keeping its last N
  checkpoints). Between drops the disk fills at the gross rate; the forecast
  runs that saw-tooth forward, so a disk that hits zero *before the next
  cleanup* is caught, and one whose cleanups keep up is left alone.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from trainguard.detectors import filesystem
from trainguard.records import Finding, FsSample, Severity
from trainguard.units import format_bytes, format_duration, format_ratio

if TYPE_CHECKING:
    from trainguard.config import Forecast
    from trainguard.store.history import History

BUCKETS = 48  # points the window is reduced to; 48 -> ~1100 pairs, cheap in pure Python
MIN_POINTS = 4
DROP_FRACTION = 0.005  # a rise in free space of >= 0.5 % of the filesystem is a deletion, not noise


@dataclass(frozen=True, slots=True)
class Trend:
    slope: float  # bytes per second of *consumption* (positive: filling) the ETA is based on
    span: float  # seconds of data the slope was fitted on
    points: int
    eta: float | None  # seconds until avail reaches 0; None when not filling
    cleanup_every: float | None = None  # repeated drops: their median interval, seconds
    cleanup_frees: float | None = None  # and the median bytes each one frees


@dataclass(frozen=True, slots=True)
class Drop:
    ts: float  # time of the first sample after the deletion
    index: int  # its index in the points
    freed: float  # bytes the deletion gave back


def _bucketed(points: Sequence[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """Last point per time bucket: a staircase keeps its steps, memory and work stay bounded."""
    width = max((end - start) / BUCKETS, 1e-9)
    out: dict[int, tuple[float, float]] = {}
    for ts, value in points:
        out[int((ts - start) / width)] = (ts, value)
    return [out[k] for k in sorted(out)]


def theil_sen(points: Sequence[tuple[float, float]], min_gap: float) -> float | None:
    slopes = [
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(points)
        for t2, v2 in points[i + 1:]
        if t2 - t1 >= min_gap
    ]
    return statistics.median(slopes) if slopes else None


def _consumption(points: Sequence[tuple[float, float]]) -> float | None:
    """Robust bytes/s of consumption (positive: filling) over the points."""
    span = points[-1][0] - points[0][0]
    reduced = _bucketed(points, points[0][0], points[-1][0])
    if len(reduced) < MIN_POINTS:
        return None
    slope = theil_sen(reduced, min_gap=span / 4)
    return None if slope is None else -slope


def _jumps(points: Sequence[tuple[float, float]], size: float, rising: bool) -> list[Drop]:
    """Runs of consecutive rises (deletions) or falls (one large write) in free space that add up to
    a deletion-sized amount. A large rm takes several samples; counting each sample as its own drop
    would make one deletion look like a fast periodic cleanup."""
    limit = max(size * DROP_FRACTION, 1.0)
    sign = 1.0 if rising else -1.0
    jumps: list[Drop] = []
    i = 1
    while i < len(points):
        if sign * (points[i][1] - points[i - 1][1]) > 0:
            j = i
            while j + 1 < len(points) and sign * (points[j + 1][1] - points[j][1]) > 0:
                j += 1
            moved = sign * (points[j][1] - points[i - 1][1])
            if moved >= limit:
                jumps.append(Drop(points[j][0], j, sign * moved))
            i = j + 1
        else:
            i += 1
    return jumps


def _drops(points: Sequence[tuple[float, float]], size: float) -> list[Drop]:
    """Deletions: free space rising by a deletion-sized amount."""
    return _jumps(points, size, rising=True)


def _without_drops(points: Sequence[tuple[float, float]], drops: Sequence[Drop]) -> list[tuple[float, float]]:
    """The points as if nothing had been deleted: each deletion's bytes taken back out from then on."""
    out = list(points[:drops[0].index])
    given_back = 0.0
    for k, drop in enumerate(drops):
        given_back += drop.freed
        end = drops[k + 1].index if k + 1 < len(drops) else len(points)
        out.extend((ts, value - given_back) for ts, value in points[drop.index:end])
    return out


def _sawtooth_eta(avail: float, gross: float, freed: float, first_in: float, period: float) -> float | None:
    """Seconds until free space reaches 0 filling at `gross` bytes/s, with `freed` bytes given back
    `first_in` seconds from now and then every `period` seconds; None when the cleanups keep up."""
    if avail <= gross * first_in:
        return avail / gross  # full before the next cleanup
    level = avail - gross * first_in + freed  # just after the next cleanup
    loss = gross * period - freed  # net bytes lost per period
    if loss <= 0:
        return None
    # The lowest point of each period is just before its cleanup: the first period whose low reaches 0.
    k = max(0, math.ceil((level - gross * period) / loss))
    return first_in + k * period + (level - k * loss) / gross


def fill_trend(avail: Sequence[tuple[float, float]], size: float, now: float, window: float,
               min_span: float) -> Trend | None:
    """Trend of available bytes over the window; None until min_span of data exists."""
    pts = [p for p in avail if now - window <= p[0] <= now]
    if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < min_span:
        return None
    latest = pts[-1][1]
    drops = _drops(pts, size)
    if len(drops) == 1 and pts[-1][0] - drops[0].ts >= min_span:
        pts = pts[drops[0].index:]  # a change point with enough data after it
        drops = []
    if not drops:
        steps = _jumps(pts, size, rising=False)
        if len(steps) == 1 and pts[-1][0] - steps[0].ts >= min_span and steps[0].index > 0:
            # One large write (a dataset download, a single checkpoint) and quiet since: in the middle
            # of the window it would tilt the whole fit; what happened after it is the trend.
            pts = pts[steps[0].index:]
    span = pts[-1][0] - pts[0][0]
    if not drops:
        rate = _consumption(pts)
        if rate is None:
            return None
        return Trend(slope=rate, span=span, points=len(pts), eta=latest / rate if rate > 0 else None)
    gross = _consumption(_without_drops(pts, drops))
    if gross is None:
        return None
    if len(drops) == 1 or gross <= 0:
        # One recent deletion: the writer's pace, without assuming someone deletes again.
        return Trend(slope=gross, span=span, points=len(pts), eta=latest / gross if gross > 0 else None)
    period = statistics.median(b.ts - a.ts for a, b in zip(drops, drops[1:]))
    freed = statistics.median(d.freed for d in drops)
    overdue_at = drops[-1].ts + 1.5 * period
    if now >= overdue_at:
        # The cleanup did not come when it used to: it may have stopped, so count on none.
        return Trend(slope=gross, span=span, points=len(pts), eta=latest / gross)
    # Expected one period after the last; a late one is still awaited until it is overdue.
    first_in = max(drops[-1].ts + period, now) - now
    eta = _sawtooth_eta(latest, gross, freed, first_in or overdue_at - now, period)
    return Trend(slope=gross, span=span, points=len(pts), eta=eta, cleanup_every=period, cleanup_frees=freed)


def mount_trend(sample: FsSample, history: History, cfg: Forecast, now: float) -> Trend | None:
    """A sampled mount's fill trend from its history: the one fit the detector, the metrics
    and `status` all show. None for a mount without usable usage."""
    if not sample.responsive or sample.usage is None or sample.usage.size_bytes <= 0:
        return None
    points = history.points(f"fs.avail_bytes:{sample.mount.mount_point}", now - cfg.window)
    return fill_trend(points, sample.usage.size_bytes, now, cfg.window, cfg.min_span)


HINT = "free space now (trainguard cleanup --dry-run shows candidates) or move output to a larger volume"


def detect(inp) -> list[Finding]:
    cfg = inp.config.forecast
    if not cfg.enabled:
        return []
    findings: list[Finding] = []
    for sample in inp.snapshot.filesystems:
        mp = sample.mount.mount_point
        if filesystem.ignored(inp.config.filesystems, mp):
            continue
        trend = inp.trend(sample)
        if trend is None or trend.eta is None:
            continue
        key = f"fs.forecast:{mp}"
        active = inp.active.get(key)
        # Hysteresis in time: an active forecast alert clears only when the ETA moves 20 % past its limit.
        slack = 1.2 if active is not None else 1.0
        if trend.eta < cfg.critical * (slack if active is Severity.CRITICAL else 1.0):
            severity, threshold = Severity.CRITICAL, cfg.critical
        elif trend.eta < cfg.warning * slack:
            severity, threshold = Severity.WARNING, cfg.warning
        else:
            continue
        usage = sample.usage
        rate_per_hour = trend.slope * 3600
        findings.append(Finding(
            key=key, severity=severity,
            summary=(f"{mp} {format_ratio(usage.used_ratio)} full, ~{format_duration(trend.eta)} left "
                     f"at {format_bytes(rate_per_hour)}/h"
                     + (f", counting the cleanup that frees {format_bytes(trend.cleanup_frees)} every "
                        f"{format_duration(trend.cleanup_every)}" if trend.cleanup_every else "")),
            details={"mountpoint": mp, "eta_seconds": round(trend.eta), "fill_bytes_per_second": round(trend.slope, 1),
                     "avail_bytes": usage.avail_bytes, "used_ratio": round(usage.used_ratio, 4),
                     "fitted_span_seconds": round(trend.span)},
            labels=filesystem.labels_for(sample),
            value=trend.eta, threshold=threshold, hint=HINT,
        ))
    return findings
