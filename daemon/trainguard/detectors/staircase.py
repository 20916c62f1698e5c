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

A 6 h window holds three to five writes an hour or two apart, and a run of small or late ones moves their
mean by half: the disk read 9.5 h from full where 5 were left, and the warning went off. So the writes
are remembered for a day (`remember`: plain rows the caller passes back, kept in the state database like
the cleanup cycles), and where the window's pace is within LOW_ERRORS standard errors of theirs (as they
scatter) they are the same writer's: its rhythm, known from them all, forecasts too, and the alert comes
no later than either says. The window's own pace is then known as well as they all tell it: its earliest
ETA is not widened by the error of a mean of its few writes (four bursts +-40 % left it a fifth
uncertain, and a disk 10 h from full at the writer's pace read "earliest in 6 h"). A pace further off is
another writer (or the same one, saving less): the window alone decides. A fall across a gap in the
samples is not remembered: it is what was written while the daemon was down, not one write.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainguard.detectors.sawtooth import LOW_ERRORS, MEMORY

MAX_STEP_ERROR = 0.4  # a checkpoint rhythm whose mean is less certain than this is not one (bursts)
EARLY_FROM = 3  # the writes' scatter is known from this many intervals: two give one degree of freedom
STEP_SHARE = 0.5  # nor one whose writes make less than this share of the fill (noise on a steady writer)
MAX_WRITES = 96  # writes remembered at most (a day of saves every 15 min)

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


@dataclass(frozen=True, slots=True)
class Write:
    start: float  # when a checkpoint-sized write began
    nbytes: float  # what it wrote
    after: float  # seconds since the write before it, where both were watched (0: not known)


def seen(pts: Points, found: Sequence, gap: float) -> tuple[Write, ...]:
    """The window's writes (steps.Step, none the window cuts into) as remembered: each with the interval
    from the one before it, unless the samples between them have a gap (the daemon was down: a write
    may have come unseen). A fall across a gap is not one: it is all that was written while down (two
    bursts and an hour of background read as one 12.7 GB write among 5 GB ones)."""
    times = [t for t, _ in pts]

    def watched(since: float, until: float) -> bool:
        lo, hi = bisect.bisect_left(times, since), bisect.bisect_right(times, until)
        return all(b - a <= gap for a, b in zip(times[lo:hi], times[lo + 1:hi]))

    out = []
    for i, step in enumerate(found):
        if not watched(step.start, step.end):
            continue
        after = step.start - found[i - 1].start if i > 0 and watched(found[i - 1].start, step.start) else 0.0
        out.append(Write(step.start, step.nbytes, after))
    return tuple(out)


def remember(known: Sequence[Write], seen_now: Sequence[Write], now: float) -> tuple[Write, ...]:
    """The writes to judge the writer's pace by: those the window shows (a write's time moves by up to a
    history bucket as its samples are averaged: within 5 min it is the same one, and the interval known
    for it stays), and those remembered before it, for MEMORY and no later than now."""
    out = []
    for w in seen_now:
        same = next((k for k in known if abs(k.start - w.start) <= 300.0), None)
        out.append(w if w.after or same is None else Write(w.start, w.nbytes, same.after))
    older = [k for k in known if k.start <= now and all(abs(k.start - w.start) > 300.0 for w in seen_now)]
    return tuple(w for w in sorted([*older, *out], key=lambda w: w.start)[-MAX_WRITES:] if now - MEMORY <= w.start)


def stepped_eta(pts: Points, found: Sequence, background: float, rate: float, now: float,
                known: Sequence[Write] = ()) -> Stepped | None:
    """The forecast of a checkpoint rhythm (`found`: steps.Step, none the window cuts into; at least 3, or 2
    beside writes remembered) that explains the rate; None without such a rhythm. `known`: the writes
    remembered (`remember`); where they agree with the window's pace they are the writer's pace learned
    from more writes, and the alert comes no later than they say."""
    if found[-1].start <= found[0].start:
        return None
    # A write still going on at the end is seen in part: it is not a size, and the rest of it is to come.
    ongoing = _ongoing(pts, found)
    done = found[:-1] if ongoing and len(found) > 3 else found
    write = statistics.median(s.end - s.start for s in done)
    if ongoing:  # what it has written so far: since the sample before it, less the background
        before = next(v for t, v in reversed(pts) if t <= found[-1].start)
        seen_so_far = before - pts[-1][1] - background * (pts[-1][0] - found[-1].start)
    gaps = [b.start - a.start for a, b in zip(found, found[1:])]
    sizes = [s.nbytes for s in done]
    largest = 1.1 * max(sizes)  # of the window's writes: the writer as it is now

    def forecast(sizes: Sequence[float], gaps: Sequence[float], fill: float, known_from: int = 0) -> Stepped | None:
        """The rhythm of these writes run forward, where it is one and explains the `fill` (bytes/s: the
        regime's rate, within 30 %, and the writes half of it at least: not noise on a steady writer);
        their mean known as well as `known_from` writes tell it, where more than these say the same."""
        if len(gaps) < 2:
            return None
        spread = _spread(sizes, gaps)
        if spread / math.sqrt(len(gaps)) > MAX_STEP_ERROR:
            return None  # sizes or intervals all over the place: bursts, not a checkpoint rhythm
        # Means, not medians: saves jitter in size and time around a steady pace, and the mean of a few is
        # the closer estimate of it (the median of five was 5 % off where the mean was 3 %).
        nbytes, every = statistics.fmean(sizes), statistics.fmean(gaps)
        if abs(nbytes / every + background - fill) > 0.3 * fill or nbytes / every < STEP_SHARE * fill:
            return None
        avail = pts[-1][1] - (max(nbytes - seen_so_far, 0.0) if ongoing else 0.0)
        return _run(avail, _next_in(found[-1].start, every, now), every, background, nbytes, write, largest,
                    spread, len(gaps), max(min(len(sizes), len(gaps)), known_from))

    # The day's writes are the same writer's where they agree with the window's (`_same_writer`): their
    # pace is the fill, the window's rate a few writes' estimate of it.
    pooled = _same_writer(known, found[0].start, sizes, gaps)
    learned = forecast(*pooled, statistics.fmean(pooled[0]) / statistics.fmean(pooled[1]) + background) \
        if pooled is not None else None
    if learned is None:
        return forecast(sizes, gaps, rate)
    # Known from the day's writes, the window's pace is run forward too, with what they tell of its error
    # (its own few writes would widen the earliest ETA by an error the day's writes do not have): a pace
    # a little faster than the day's, within what the same writer scatters by, is warned as it is. A
    # rhythm the window's few call bursts is one by the day's; the alert comes no later than the window
    # alone says (its rate's line, where it sees no rhythm).
    mine = forecast(sizes, gaps, rate, min(len(pooled[0]), len(pooled[1])))
    eta = mine.eta if mine is not None else pts[-1][1] / rate
    early = mine.early if mine is not None else eta
    return Stepped(min(eta, learned.eta), learned.error if learned.eta <= eta or mine is None else mine.error,
                   min(early, learned.early))


def _same_writer(known: Sequence[Write], first: float, sizes: Sequence[float],
                 gaps: Sequence[float]) -> tuple[list[float], list[float]] | None:
    """(sizes, intervals) of the writes remembered from before the window (its first write at `first`) and
    the window's, where they are the same writer's: the window's pace within LOW_ERRORS standard errors of
    theirs, as they scatter (a few writes in a window move their mean by half, by chance). None where
    there are none, or the pace changed (another writer, or the same one saving less)."""
    older = [w for w in known if w.start < first - 300.0]
    all_sizes = [w.nbytes for w in older] + list(sizes)
    all_gaps = [w.after for w in older if w.after > 0] + list(gaps)
    if not older or len(all_gaps) < 2:
        return None
    pace = statistics.fmean(all_sizes) / statistics.fmean(all_gaps)
    if abs(statistics.fmean(sizes) / statistics.fmean(gaps) - pace) \
            > LOW_ERRORS * pace * _spread(all_sizes, all_gaps) / math.sqrt(len(gaps)):
        return None
    return all_sizes, all_gaps


def _spread(sizes: Sequence[float], gaps: Sequence[float]) -> float:
    """The relative scatter of a write in bytes: of its size and of its time (a write that comes a fraction
    of a period early brings that fraction of a mean write early)."""
    return math.hypot(statistics.stdev(sizes) / statistics.fmean(sizes), statistics.stdev(gaps) / statistics.fmean(gaps))


def _next_in(last: float, every: float, now: float) -> float:
    at = last + every
    while at < now:
        at += every
    return at - now


def _run(avail: float, first_in: float, every: float, background: float, nbytes: float, write: float,
         largest: float, spread: float, intervals: int, n: int) -> Stepped | None:
    """The staircase run forward from `avail`: the writes of `nbytes` (the largest seen `largest`) every
    `every`, their scatter `spread`, learned from `intervals` intervals and `n` writes."""
    # The write that will not fit: one of the largest size seen may come next, and the free space before
    # it is known only to a few per cent (the background, the jitter of the sizes): the earlier write.
    central = _first_short(avail, first_in, every, background, nbytes, write, largest, lambda k: 0.0)
    if central is None:
        return None
    k, eta = central
    # The ETA's error: that of the mean size and period learned from the steps, and the scatter of the
    # k + 1 writes still to come (their sizes and intervals add up as they come). Scatter measured on a
    # few steps is itself uncertain: widened by Student's t for their number.
    error = spread * math.sqrt(1 / intervals + 1 / (k + 1)) * _few(intervals - 1)
    # The earliest: the free space less LOW_ERRORS standard errors of what writes 0..k bring summed (their
    # scatter as a random walk, and k + 1 times the error of the learned mean), in bytes (nbytes * spread).
    if n < EARLY_FROM:
        return Stepped(eta, error, eta)
    early = _first_short(avail, first_in, every, background, nbytes, write, nbytes,
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
