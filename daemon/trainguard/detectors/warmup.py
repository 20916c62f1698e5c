"""Warm-up: while the history covers less than a window, how long the rate has held, and whether a
deletion in sight holds the alert.

A fill with no deletion in sight is what it seems, from when it began (a download that started minutes
after the daemon has held only since); with a deletion in sight it may be a churn not yet seen for one
period (postpone.may_hold).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import TYPE_CHECKING

from trainguard.detectors.fit import Points, noise
from trainguard.detectors.steps import steps

PACE_KEPT = 0.9  # a fill has held over a span where it fell by this share of its rate at least

if TYPE_CHECKING:
    from trainguard.detectors.trend import Trend


def warming(trend: Trend, pts: Points, size: float) -> Trend:
    """The trend in warm-up: learning, its evidence no longer than its rate has held (whether a deletion in
    sight holds the alert: postpone.may_hold)."""
    if trend.slope > 0:
        largest = max((s.nbytes for s in steps(pts, size, least=0.0)[0]), default=0.0)
        tolerance = max(6 * noise(pts), largest)
        held = max(_held(pts, trend.slope, tolerance), _kept_pace(pts, trend.slope, tolerance))
    else:
        held = trend.evidence
    return dataclasses.replace(trend, learning=True, evidence=max(min(trend.evidence, held), 1.0))


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


def _kept_pace(pts: Points, rate: float, tolerance: float) -> float:
    """The longest span back from the newest point over which the free space fell by PACE_KEPT of `rate`
    at least (within `tolerance`): a fill that kept its pace through a small deletion, or through averaged
    history that bends the line near its newest points, has held all that while; flat minutes before a
    download are no part of it."""
    t_last, v_last = pts[-1]
    return max((t_last - t for t, v in pts if v - v_last + tolerance >= PACE_KEPT * rate * (t_last - t)), default=0.0)

