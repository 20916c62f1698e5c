"""The fill trend of a mount from its history of available bytes: rate, time to full, and how much
evidence backs them.

The rooms it draws on: the robust fit and the noise measure (detectors.fit), deletion-sized jumps
(detectors.jumps), checkpoint steps and the staircase (detectors.steps, detectors.staircase), the
saw-tooth (detectors.sawtooth), warm-up (detectors.warmup) and the one decision whether a learned rhythm
may postpone the alert (detectors.postpone).

Changes of regime:
- a single large write (a dataset download) followed by min_span of quiet is a change point: the trend
  is what happened after it. Two or more steps are a rhythm (checkpoints) and the whole window is fitted;
- a burst is not a trend until it has lasted (fit.regime); the detector alerts only on an ETA no longer
  than ``evidence_ratio`` times the evidence (``Trend.evidence``);
- drops (free space rising by a deletion-sized amount) are read by what they mean: one long enough ago
  is a change point; one recent drop means the writer's pace counts, with nothing assumed to be deleted
  again; repeated drops are a regime (a cron cleanup, a trainer keeping its last N checkpoints, a GC at
  a high-water mark), forecast as its next low by detectors.sawtooth from the cycles learned so far,
  but counted on only where postpone.may_postpone says so; otherwise the alert comes no later than the
  plain line through the window, nor than the window alone says;
- outliers are taken out first (detectors.despike), and a rise at the newest samples waits until it stays;
- until the history covers a window the trend is `learning` (detectors.warmup).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.detectors import sawtooth, staircase
from trainguard.detectors.despike import despiked
from trainguard.detectors.fit import (
    MIN_POINTS,
    Points,
    least_squares,
    noise,
    regime,
)
from trainguard.detectors.growth import grown_eta
from trainguard.detectors.jumps import burst, jumps, low_before, settled, timed, without_drops
from trainguard.detectors.postpone import (
    bounded_by_line,
    may_hold,
    may_postpone,
    no_later,
)
from trainguard.detectors.steps import steps
from trainguard.detectors.warmup import warming

GAP = 900.0  # seconds without a sample: the daemon was down (or the clock jumped); nothing was seen
# A cleanup whose rise spans a hole in the samples longer than two history buckets came at a time not
# seen (the daemon was down): the rhythm places it (sawtooth.placed).
UNTIMED = 150.0

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
    bounded: bool = False  # learned cleanups not known to keep up (postpone.may_postpone): no later than the plain fit
    learning: bool = False  # the history covers less than a window yet
    quiet: bool = False  # and shows a deletion whose rhythm is not known: shown, not alerted on

    def __post_init__(self) -> None:
        if not self.evidence:
            object.__setattr__(self, "evidence", self.span)


def _cleanup_regime(pts: Points, cycles: Sequence[sawtooth.Cycle], gross: float, evidence: float, size: float,
                    largest_write: float, now: float, arriving: float) -> Trend:
    # Checkpoint writes decide how far past its mark a GC triggers: lows anywhere within one checkpoint
    # below the mark are neither a decline nor a missed cleanup.
    nxt = sawtooth.next_low(cycles, pts[-1][1], gross, size, largest_write, now, arriving)
    return Trend(slope=gross, span=pts[-1][0] - pts[0][0], points=len(pts), eta=nxt.eta,
                 cleanup_every=nxt.every, cleanup_frees=nxt.frees,
                 cleanup_low=nxt.low if nxt.eta is None else None, evidence=evidence, cycles=tuple(cycles),
                 next_cleanup_in=nxt.next_in, eta_without_cleanup=nxt.eta_without, cleanup_missed=nxt.stopped,
                 eta_error=nxt.error, eta_early=nxt.early)


def _line(pts: Points, cycles: tuple) -> Trend | None:
    """The plain least-squares line through the points as they are (predict_linear's method); its evidence
    is the points from the last gap in them on."""
    fitted = least_squares(pts)
    if fitted is None:
        return None
    rate, level = fitted
    span, gap = pts[-1][0] - pts[0][0], _seen_since(pts)
    return Trend(slope=rate, span=span, points=len(pts), eta=max(level, 0.0) / rate if rate > 0 else None,
                 evidence=span if gap is None else max(pts[-1][0] - gap, 1.0), cycles=cycles)


def _seen_since(pts: Points) -> float | None:
    """The first time after the last gap in the points (GAP without a sample: the daemon was down, or
    the clock jumped), None without one."""
    return next((b[0] for a, b in zip(reversed(pts[:-1]), reversed(pts[1:])) if b[0] - a[0] > GAP), None)


def window_writes(pts: Points, size: float) -> tuple[list, float]:
    """(the window's checkpoint-sized writes, steps.Step, none the window cuts into; the background rate)."""
    # Writes smaller than a deletion-sized share of the disk are a rhythm too: counted by them, the disk
    # is full during the write that does not fit, up to a period before a line through them says.
    found, background = steps(pts, size, least=0.0)
    return [s for s in found if s.start > pts[min(3, len(pts) - 1)][0]], background


def _stepped(pts: Points, size: float, rate: float, now: float,
             remembered: Sequence[staircase.Write]) -> staircase.Stepped | None:
    """The staircase forecast (detectors.staircase) where the window shows a checkpoint rhythm."""
    found, background = window_writes(pts, size)
    if len(found) < (2 if remembered else 3):  # two and the day's writes: one interval, their rhythm
        return None
    return staircase.stepped_eta(pts, found, background, rate, now, remembered)


def fill_trend(avail: Points, size: float, now: float, window: float, min_span: float,
               known: Sequence[sawtooth.Cycle] = (), remembered: Sequence[staircase.Write] = ()) -> Trend | None:
    """Trend of available bytes over the window; None until min_span of data exists. `known`: the
    cleanup cycles learned by earlier fits (Trend.cycles), for saw-tooths slower than the window shows;
    `remembered`: the checkpoint-sized writes remembered (staircase.remember), for a writer's pace."""
    seen_pts = despiked([p for p in avail if now - window <= p[0] <= now])
    pts = whole = settled(seen_pts, size)
    # A rise at the newest samples not counted yet (bytes): a cleanup coming, or an outlier.
    arriving = max((v for _, v in seen_pts[len(whole):]), default=0.0) - whole[-1][1] if whole else 0.0
    if len(pts) < MIN_POINTS or pts[-1][0] - pts[0][0] < min_span:
        return None
    drops = seen = jumps(pts, size, rising=True)
    cleanups = [(timed(pts, d, UNTIMED), pts[d.start][0], sawtooth.Cycle(d.ts, low_before(pts, d), d.freed))
                for d in drops if d.start >= 3]
    cycles = sawtooth.merge(known, [c for ok, _, c in cleanups if ok], now,
                            [(since, c) for ok, since, c in cleanups if not ok])
    if len(drops) == 1 and len(cycles) < 2 and pts[-1][0] - drops[0].ts >= min_span:
        pts = pts[drops[0].index:]  # a change point with enough data after it
        drops = []
    if not drops:
        writes = jumps(pts, size, rising=False)
        if len(writes) == 1 and pts[-1][0] - writes[0].ts >= min_span and writes[0].index > 0 \
                and burst(pts, writes[0]) and len(steps(pts, size, least=0.0)[0]) < 3:
            # One large write (a dataset download, a single checkpoint) and quiet since: in the middle
            # of the window it would tilt the whole fit; what happened after it is the trend. Not the
            # one write of a rhythm that happened to pass the deletion-sized mark.
            pts = pts[writes[0].index:]
    fitted = regime(without_drops(pts, drops) if drops else pts, size, min_span)
    if fitted is None:
        return None
    rate, evidence = fitted
    # A rate holds only over time that was watched: after a gap in the history (a restart) the
    # evidence starts again, whatever the fit across the gap says.
    seen_since = _seen_since(pts)
    if seen_since is not None:
        evidence = max(min(evidence, pts[-1][0] - seen_since), 1.0)  # (0 would read as "all of the span")
    trend, proven = _forecast(pts, whole, bool(drops), cycles, rate, evidence, size, now, arriving, remembered)
    if trend.bounded and known:
        # Cycles learned before the window, in a rhythm not known to keep up, may not delay the alert past
        # what the window alone says either (a fit with nothing learned: its own cycles, or the plain line).
        alone = fill_trend(avail, size, now, window, min_span)
        if alone is not None:
            trend = dataclasses.replace(no_later(trend, alone), cycles=cycles)  # the learned ones go on
    if whole[0][0] > now - window + GAP:
        # A deletion in sight may be a churn not yet seen for one period; two cycles are a rhythm, which
        # may_postpone judged (`proven`: it keeps up).
        last = seen[-1] if seen and len(cycles) < 2 else None
        trend = may_hold(warming(trend, pts, size), _line(whole, cycles) if seen else None, proven,
                         last.freed if last else 0.0, pts[-1][0] - last.ts if last else 0.0)
    elif seen and len(cycles) < 2:
        # A deletion made the trend start after it: it may not delay what the line through it proves.
        trend = bounded_by_line(trend, _line(whole, cycles), whole[0][1] - whole[-1][1], sum(d.freed for d in seen))
    return trend


def _forecast(pts: Points, whole: Points, dropped: bool, cycles: tuple, rate: float, evidence: float, size: float,
              now: float, arriving: float, remembered: Sequence[staircase.Write]) -> tuple[Trend, bool]:
    """(the trend at `rate`, whether it counts on a rhythm that keeps up: postpone.may_postpone)."""
    span = pts[-1][0] - pts[0][0]
    if len(cycles) < 2 or rate <= 0:
        # No deletion, or one recent one: the writer's pace, without assuming someone deletes again.
        stepped = _stepped(pts, size, rate, now, remembered) if rate > 0 and not dropped else None
        if stepped is not None:
            return Trend(slope=rate, span=span, points=len(pts), eta=stepped.eta, evidence=evidence,
                         cycles=cycles, eta_error=stepped.error, eta_early=stepped.early), False
        eta = None if rate <= 0 else pts[-1][1] / rate
        grown = grown_eta(pts, pts[-1][1]) if eta is not None and not dropped else None
        return Trend(slope=rate, span=span, points=len(pts), eta=eta, evidence=evidence, cycles=cycles,
                     eta_early=None if grown is None else min(grown, eta)), False
    largest_write = max((s.nbytes for s in steps(pts, size)[0]), default=0.0)
    rhythm = _cleanup_regime(pts, cycles, rate, evidence, size, largest_write, now, arriving)
    late = now >= sawtooth.late_after(cycles) and not sawtooth.may_be_coming(cycles, arriving)
    # One called stopped counts on no cleanup: it postpones nothing, and is the earlier alert.
    if rhythm.cleanup_missed or may_postpone(cycles, rate, size, largest_write, noise(whole), pts[-1][1],
                                             rhythm.next_cleanup_in, late):
        return rhythm, True
    # Not counted on, the rhythm alerts no later than the plain line through the window, taken at now as
    # predict_linear takes it: at a saw-tooth's low the newest sample is a cleanup's depth under that line,
    # and a line through it put a GC at its mark "full in 4 h" at every low.
    line = _line(whole, cycles)
    return (dataclasses.replace(rhythm, bounded=True) if line is None else no_later(rhythm, line)), False
