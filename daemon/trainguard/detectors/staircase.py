"""A checkpoint staircase forecast by its writes: the disk is full during the write that does not fit.

The steps (detectors.steps.steps: when each write came and what it wrote, and the background rate
between them) give the rhythm's mean size and period. Run forward, the disk is full during the first
write that does not fit in what is left: its time, not where a line through the staircase reaches zero
(up to one period later). The ETA states its relative standard error, from how much the sizes and the
intervals scatter.

Near full that ETA is not smooth: one write fewer fits when the writes still to come are a little
larger than the mean, and the ETA is a whole period earlier, a jump no relative error can say. So the
earliest credible ETA (`early`) is that of the free space lowered by a few standard errors of what the
writes still to come bring (their scatter in size and in time adds up as a random walk, and the error of
the learned mean as many times over as there are writes), and the warning counts on that. Writes that
scatter by half their size and period (saves at evaluations, epochs of uneven length) are a rhythm too:
their early ETA is well before the central one, as far as their scatter says.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainguard.detectors.sawtooth import LOW_ERRORS

MAX_STEP_ERROR = 0.4  # a checkpoint rhythm whose mean is less certain than this is not one (bursts)
EARLY_FROM = 3  # the writes' scatter is known from this many intervals: two give one degree of freedom
STEP_SHARE = 0.5  # nor one whose writes make less than this share of the fill (noise on a steady writer)

Points = Sequence[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Stepped:
    eta: float  # seconds to full: during the write that does not fit
    error: float  # its relative standard error
    early: float  # seconds to full should the writes to come be LOW_ERRORS of their errors larger


def _ongoing(pts: Points, found: Sequence) -> bool:
    """The last step is a write seen in part: it ends at the newest samples, or it is much smaller than
    the others and began less than twice their usual length ago (noise as large as a sample's share of
    a slow write hides its tail from the step's edge)."""
    dt = pts[-1][0] - pts[-2][0] if len(pts) > 1 else 0.0
    if found[-1].end >= pts[-1][0] - 3 * dt:
        return True
    usual = statistics.median(s.end - s.start for s in found[:-1])
    return found[-1].start >= pts[-1][0] - 2 * max(usual, 3 * dt) \
        and found[-1].nbytes < 0.7 * statistics.fmean(s.nbytes for s in found[:-1])


def stepped_eta(pts: Points, found: Sequence, background: float, rate: float, now: float) -> Stepped | None:
    """The forecast of a checkpoint rhythm (`found`: steps.Step, at least 3, none the window cuts into)
    that explains the rate; None without such a rhythm."""
    # Means over the window, not medians: saves jitter in size and time around a steady pace, and the
    # mean of a few is the closer estimate of it (the median of five was 5 % off where the mean was 3 %).
    every = (found[-1].start - found[0].start) / (len(found) - 1)
    # A write still going on at the end is seen in part: it is not a size, and the rest of it is to come.
    ongoing = _ongoing(pts, found)
    done = found[:-1] if ongoing and len(found) > 3 else found
    nbytes = statistics.fmean(s.nbytes for s in done)
    if every <= 0 or abs(nbytes / every + background - rate) > 0.3 * rate or nbytes / every < STEP_SHARE * rate:
        return None
    write = statistics.median(s.end - s.start for s in done)
    if ongoing:  # what it has written so far: since the sample before it, less the background
        before = next(v for t, v in reversed(pts) if t <= found[-1].start)
        seen = before - pts[-1][1] - background * (pts[-1][0] - found[-1].start)
    avail = pts[-1][1] - (max(nbytes - seen, 0.0) if ongoing else 0.0)
    at = found[-1].start + every
    while at < now:
        at += every
    gaps = [b.start - a.start for a, b in zip(found, found[1:])]
    of_size = statistics.stdev(s.nbytes for s in done)
    spread = math.hypot(of_size / nbytes, statistics.stdev(gaps) / every)
    if spread / math.sqrt(len(gaps)) > MAX_STEP_ERROR:
        return None  # sizes or intervals all over the place: bursts, not a checkpoint rhythm
    # The write that will not fit: one of the largest size seen may come next, and the free space before
    # it is known only to a few per cent (the background, the jitter of the sizes): the earlier write.
    largest = 1.1 * max(s.nbytes for s in done)
    central = _first_short(avail, at - now, every, background, nbytes, write, largest, lambda k: 0.0)
    if central is None:
        return None
    k, eta = central
    # The ETA's error: that of the mean size and period learned from the window's steps, and the
    # scatter of the k + 1 writes still to come (their sizes and intervals add up as they come).
    # Scatter measured on a few steps is itself uncertain: widened by Student's t for their number.
    error = spread * math.sqrt(1 / len(gaps) + 1 / (k + 1)) * _few(len(gaps) - 1)
    # The earliest: the free space less LOW_ERRORS standard errors of what writes 0..k bring summed (their
    # scatter as a random walk, and k + 1 times the error of the learned mean). A write's scatter counts
    # its size and its time: one that comes a fraction of a period early brings that fraction of a mean
    # write early, so both are bytes (nbytes * spread).
    n = min(len(done), len(gaps))
    if n < EARLY_FROM:
        return Stepped(eta, error, eta)
    early = _first_short(avail, at - now, every, background, nbytes, write, nbytes,
                         lambda k: LOW_ERRORS * nbytes * spread * math.sqrt((k + 1) + (k + 1) ** 2 / n))
    return Stepped(eta, error, eta if early is None else min(early[1], eta))


def _first_short(avail: float, first_in: float, every: float, background: float, nbytes: float, write: float,
                 room: float, margin: Callable[[int], float]) -> tuple[int, float] | None:
    """(k, seconds to full) for the first write k (0: the next, `first_in` from now) for which less than
    `room` is left, the free space lowered by `margin(k)`; None if the free space outlasts the writes."""
    at = first_in
    for k in range(int(avail / nbytes) + 2):
        free = avail - background * at - k * nbytes - margin(k)  # just before write k
        if free <= 0:
            # Full between the writes: by the background since the last write that fitted, not before
            # it (the margin grows by a step each write, which the background does not explain).
            after = at - every + write if k > 0 else 0.0
            return k, (max(at + free / background, after) if background > 0 else at)
        if free < room:
            return k, at + write * min(free / nbytes, 1.0)
        at += every
    return None


def _few(dof: int) -> float:
    """Student's t over the normal quantile at 97.5 % for dof degrees of freedom (Cornish-Fisher): how
    much wider an error estimated from a few samples is to be taken (3 intervals: 1.6x, 10: 1.1x)."""
    z, v = 1.96, max(dof, 1)
    return 1.0 + (z**3 + z) / (4 * v * z) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v * v * z)
