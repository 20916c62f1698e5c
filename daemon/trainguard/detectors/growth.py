"""A fill whose rate grows steadily (a run that saves more as it goes, a log that grows with the data seen):
the window's line takes the rate of its middle, hours behind the rate now, and its ETA comes late by as much.

The rate of each sixth of the window is fitted on its own; where every one is positive, each is within
STEP_MAX of the one before (a download that starts, a burst of logs, is a step, not growth), and their
logarithms rise along a line more than ERRORS standard errors from flat, the growth is run forward: the
time to full at the rate now growing at that pace. It may only make the warning earlier (Trend.eta_early).
"""

from __future__ import annotations

import math

from trainguard.detectors.fit import Points, least_squares

SEGMENTS = 6
STEP_MAX = 1.5  # a sixth's rate is within this factor of the one before: gradual growth, not a step
ERRORS = 3.0  # standard errors of the log-rate slope the growth must exceed
MIN_SPAN = 3 * 3600.0  # growth is judged over hours: minutes of a fill say nothing of it


def grown_eta(pts: Points, latest: float) -> float | None:
    """Seconds to full if the rate keeps growing as the window's sixths show; None where it does not grow
    steadily (or `latest` free bytes is no free space)."""
    t0, t1 = pts[0][0], pts[-1][0]
    width = (t1 - t0) / SEGMENTS
    if t1 - t0 < MIN_SPAN or latest <= 0:
        return None
    logs = []
    for k in range(SEGMENTS):
        part = [p for p in pts if t0 + k * width <= p[0] <= t0 + (k + 1) * width]
        fitted = least_squares(part) if len(part) >= 3 else None
        if fitted is None or fitted[0] <= 0:
            return None
        logs.append((t0 + (k + 0.5) * width, math.log(fitted[0])))
    if any(abs(b - a) > math.log(STEP_MAX) for (_, a), (_, b) in zip(logs, logs[1:])):
        return None
    mt = sum(t for t, _ in logs) / SEGMENTS
    ml = sum(v for _, v in logs) / SEGMENTS
    sxx = sum((t - mt) ** 2 for t, _ in logs)
    growth = sum((t - mt) * (v - ml) for t, v in logs) / sxx  # per second, of the log of the rate
    residual = math.sqrt(sum((v - ml - growth * (t - mt)) ** 2 for t, v in logs) / (SEGMENTS - 2))
    if growth <= ERRORS * residual / math.sqrt(sxx):
        return None
    rate_now = math.exp(ml + growth * (t1 - mt))
    # Free space left at the rate now, growing by e^(growth t): latest = rate_now (e^(growth T) - 1) / growth.
    return math.log1p(latest * growth / rate_now) / growth
