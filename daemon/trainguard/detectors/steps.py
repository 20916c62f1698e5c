"""Checkpoint-sized falls of free space: when each write came, what it wrote, and the rate between them.

A trainer saving a checkpoint every N minutes fills the disk in steps; the staircase forecast
(detectors.staircase), the line between the steps (detectors.follow) and "the next checkpoint will not
fit" (detectors.checkpoint) all start from these steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

Points = Sequence[tuple[float, float]]

DROP_FRACTION = 0.005  # a rise in free space of >= 0.5 % of the filesystem is a deletion, not noise
PACE_WOBBLE = 0.1  # a writer's pace varies this much from one stretch to the next


@dataclass(frozen=True, slots=True)
class Step:
    start: float  # time of the sample before the fall
    end: float  # time of its last falling sample
    nbytes: float


def steps(points: Points, size: float, least: float = DROP_FRACTION) -> tuple[list[Step], float]:
    """Checkpoint-sized falls of free space (beyond noise and the background rate, and at least `least`
    of the filesystem), and that background rate in bytes/s (positive: filling)."""
    if len(points) < 3:
        return [], 0.0
    diffs = [(points[i][1] - points[i - 1][1], points[i][0] - points[i - 1][0]) for i in range(1, len(points))]
    base = statistics.median(d / max(dt, 1e-9) for d, dt in diffs)
    spread = 1.4826 * statistics.median(abs(d - base * dt) for d, dt in diffs)
    found: list[Step] = []
    i = 0
    while i < len(diffs):
        # Beyond 4x the noise, and beyond what a writer's pace wobbling by PACE_WOBBLE adds up to over
        # the interval: across a restart's gap a steady fill a few per cent faster is no checkpoint.
        if diffs[i][0] - base * diffs[i][1] < -4 * spread - PACE_WOBBLE * abs(base) * diffs[i][1] - 1.0:
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
            # A write stays written: the level after it (the median of up to five samples) is down by
            # most of the fall, where a burst of heavy-tailed noise comes back.
            stays = statistics.median(v for _, v in points[max(first - 4, 0):first + 1]) \
                - statistics.median(v for _, v in points[last:last + 5]) >= fell / 2
            if fell >= max(size * least, 8 * spread) and stays:
                found.append(Step(points[i][0], points[j + 1][0], fell))  # timed by its clear part
            i = j + 1
        else:
            i += 1
    found = _joined(points, found)
    # The background: what fell outside the steps, over the span (the median of the per-sample changes
    # leans toward the steps when they take several samples each).
    span = points[-1][0] - points[0][0]
    outside = points[0][1] - points[-1][1] - sum(s.nbytes for s in found)
    return found, max(outside / span if span > 0 else -base, 0.0)


def _joined(points: Points, found: list[Step]) -> list[Step]:
    """Steps much closer together than the rhythm's interval are one write that noise cut in two."""
    if len(found) < 3:
        return found
    every = statistics.median(b.start - a.start for a, b in zip(found, found[1:]))
    value = dict(points)
    out = [found[0]]
    for step in found[1:]:
        prev = out[-1]
        if step.start - prev.end < 0.1 * every:
            between = value.get(prev.end, 0.0) - value.get(step.start, 0.0)
            out[-1] = Step(prev.start, step.end, prev.nbytes + max(between, 0.0) + step.nbytes)
        else:
            out.append(step)
    return out
