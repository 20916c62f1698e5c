"""Deletion-sized jumps of free space: deletions (rises) and single large writes (falls), read as
whole runs of samples, and the points as if nothing had been deleted.

A large rm takes several samples; counting each sample as its own drop would make one deletion look
like a fast periodic cleanup. A rise at the newest samples is not counted until it stays (`settled`).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.detectors.fit import CONSISTENT, Points, consumption
from trainguard.detectors.steps import DROP_FRACTION

TRAILING = 0.1  # a jump ends at its last step of more than this share of its largest: the rest is noise


@dataclass(frozen=True, slots=True)
class Drop:
    ts: float  # time of the last sample of the jump
    index: int  # its index in the points
    freed: float  # bytes the deletion gave back (a write: minus the bytes written)
    start: int = 0  # index of the sample just before the jump


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
            end = i
            while end + 1 < len(points) and sign * (points[end + 1][1] - points[end][1]) > 0:
                end += 1
            # The jump ends where it reached its height: rises of noise after it, which a run may go on
            # through on a flat stretch, would put its end, and the level it is judged by, minutes late
            # (into the next checkpoint write of a fast writer).
            j = _jump_end(points, i, end, sign)
            moved = sign * (points[j][1] - points[i - 1][1])
            # A level that stays where the run took it (the median of three to five samples after it, of
            # up to three before: a fast writer's earlier level is no part of it), not a run of noise or
            # outliers that the next samples take back.
            before = statistics.median(v for _, v in points[max(i - 3, 0):i])
            after = [v for _, v in points[j:j + 5]]
            if moved >= limit and len(after) >= 3 and sign * (statistics.median(after) - before) >= moved / 2:
                # What it freed (a write: minus what it wrote) is what the run moved plus what the writer
                # wrote meanwhile at the pace around it: a run of averaged history spans minutes, and
                # cleanups seen short by them leave that much of the fill in the line between them.
                took = points[j][0] - points[i - 1][0]
                pace = _pace(points[max(i - 5, 0):i], points[j:j + 5])
                found.append(Drop(points[j][0], j, points[j][1] - points[i - 1][1] + pace * took, i - 1))
            i = end + 1
        else:
            i += 1
    return found


def _jump_end(points: Points, start: int, end: int, sign: float) -> int:
    """The last point of a run (`start` .. `end`) that moved by more than TRAILING of the run's largest step."""
    largest = max(sign * (points[k][1] - points[k - 1][1]) for k in range(start, end + 1))
    while end > start and sign * (points[end][1] - points[end - 1][1]) < TRAILING * largest:
        end -= 1
    return end


def _pace(*parts: Points) -> float:
    """Bytes/s the free space falls between consecutive points of each part (the median: robust to noise)."""
    rates = [(a[1] - b[1]) / (b[0] - a[0]) for part in parts for a, b in itertools.pairwise(part) if b[0] > a[0]]
    return statistics.median(rates) if rates else 0.0


def without_drops(points: Points, drops: Sequence[Drop]) -> list[tuple[float, float]]:
    """The points as if nothing had been deleted: each deletion's bytes taken back out from then on."""
    out = list(points[:drops[0].index])
    given_back = 0.0
    for k, drop in enumerate(drops):
        given_back += drop.freed
        end = drops[k + 1].index if k + 1 < len(drops) else len(points)
        out.extend((ts, value - given_back) for ts, value in points[drop.index:end])
    return out


def low_before(points: Points, drop: Drop) -> float:
    """The saw-tooth's low before a cleanup: the least free space in the few samples before it (with
    averaged history a save just before the cleanup is spread over them)."""
    return min(v for _, v in points[max(drop.start - 3, 0):drop.start + 1])


def timed(points: Points, drop: Drop, hole: float) -> bool:
    """Whether the samples show when the jump came: none of its steps spans more than `hole` seconds."""
    run = points[drop.start:drop.index + 1]
    return all(b[0] - a[0] <= hole for a, b in zip(run, run[1:]))


def burst(pts: Points, write: Drop) -> bool:
    """A run of falls that was much faster than what came after it (a download, one checkpoint), not a
    steady fill whose averaged points happen to fall sample after sample."""
    took = max(pts[write.index][0] - pts[write.start][0], 1.0)
    after = consumption(pts[write.index:])
    return after is None or after < CONSISTENT * (-write.freed / took)


def settled(pts: Points, size: float) -> list[tuple[float, float]]:
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
