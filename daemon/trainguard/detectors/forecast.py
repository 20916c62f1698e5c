"""Time-to-full forecast from the trend of available bytes.

Disks of training hosts fill in steps (a checkpoint every N minutes) and empty in
drops (a cleanup). A least-squares line through such a staircase swings with
every step; instead the slope is a Theil-Sen estimate (median of pairwise slopes)
over points bucketed across the window, using only pairs far enough apart that a
single step or drop cannot dominate.

Drops are handled by what they mean:
- one drop in the window is a change point (someone cleaned up): the trend is
  fitted on the data after it when that span is long enough;
- repeated drops are a regime (periodic cleanup): their net effect is the
  trend, so the whole window is used.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from trainguard.records import Finding, Severity
from trainguard.units import format_bytes, format_duration, format_ratio

BUCKETS = 48  # points the window is reduced to; 48 -> ~1100 pairs, cheap in pure Python
MIN_POINTS = 4
DROP_FRACTION = 0.005  # a rise in free space of >= 0.5 % of the filesystem is a deletion, not noise


@dataclass(frozen=True, slots=True)
class Trend:
    slope: float  # bytes per second of *consumption* (positive: filling)
    span: float  # seconds of data the slope was fitted on
    points: int
    eta: float | None  # seconds until avail reaches 0; None when not filling


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


def _drops(points: Sequence[tuple[float, float]], size: float) -> list[int]:
    """Indexes where free space jumped up by a deletion-sized amount."""
    limit = max(size * DROP_FRACTION, 1.0)
    return [i for i in range(1, len(points)) if points[i][1] - points[i - 1][1] >= limit]


def fill_trend(avail: Sequence[tuple[float, float]], size: float, now: float, window: float,
               min_span: float) -> Trend | None:
    """Trend of available bytes over the window; None until min_span of data exists."""
    pts = [p for p in avail if now - window <= p[0] <= now]
    if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < min_span:
        return None
    drops = _drops(pts, size)
    if len(drops) == 1 and pts[-1][0] - pts[drops[0]][0] >= min_span:
        pts = pts[drops[0]:]
    span = pts[-1][0] - pts[0][0]
    reduced = _bucketed(pts, pts[0][0], pts[-1][0])
    if len(reduced) < MIN_POINTS:
        return None
    slope = theil_sen(reduced, min_gap=span / 4)
    if slope is None:
        return None
    consumption = -slope
    latest_avail = pts[-1][1]
    eta = latest_avail / consumption if consumption > 0 else None
    return Trend(slope=consumption, span=span, points=len(pts), eta=eta)


HINT = "free space now (trainguard cleanup --dry-run shows candidates) or move output to a larger volume"


def detect(inp) -> list[Finding]:
    cfg = inp.config.forecast
    if not cfg.enabled:
        return []
    findings: list[Finding] = []
    for sample in inp.snapshot.filesystems:
        if not sample.responsive or sample.usage is None or sample.usage.size_bytes <= 0:
            continue
        mp = sample.mount.mount_point
        if inp.config.filesystems.ignored(mp):
            continue
        series = inp.history.points(f"fs.avail_bytes:{mp}", inp.now - cfg.window)
        trend = fill_trend(series, sample.usage.size_bytes, inp.now, cfg.window, cfg.min_span)
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
                     f"at {format_bytes(rate_per_hour)}/h"),
            details={"mountpoint": mp, "eta_seconds": round(trend.eta), "fill_bytes_per_second": round(trend.slope, 1),
                     "avail_bytes": usage.avail_bytes, "used_ratio": round(usage.used_ratio, 4),
                     "fitted_span_seconds": round(trend.span)},
            labels={"mountpoint": mp, "fstype": sample.mount.fstype, "device": sample.mount.source},
            value=trend.eta, threshold=threshold, hint=HINT,
        ))
    return findings
