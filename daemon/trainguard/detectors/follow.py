"""Incremental fill trends: a mount's trend is refitted only when a point that can change it arrives.

A full fit (detectors.trend.fill_trend over the 6 h window) is the costliest step of a cycle. Between
two full fits the trend is carried forward in a `Fit`, plain data the caller keeps and passes back:
the rate holds, so the ETA shortens by the time that passed. A full fit is made again when
- a new sample leaves the fitted line by more than `tolerance` (a deletion, a checkpoint, a download
  that started or stopped: anything that can move the fit by more than about 1 % of the ETA), or falls
  under `floor` (the level at which a learned cleanup should have come);
- `refit_at` is reached: a cleanup leaves the window or falls due, or REFIT_EVERY has passed (the
  window slides and the history's averaging moves the fit a little; this bounds that drift);
- the clock went back, the mount's size changed, or there is no fit yet.
tests/test_forecast_follow.py replays traces and checks the carried trend against a full fit at every
cycle: the same alert decision, and ETAs within the bound this tolerance sets.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainguard.detectors import sawtooth, staircase
from trainguard.detectors.fit import Points, noise
from trainguard.detectors.steps import DROP_FRACTION, Step, steps
from trainguard.detectors.trend import GAP, Trend, fill_trend, window_writes

REFIT_EVERY = 600.0  # seconds a carried trend lives at most
SETTLE = 60.0  # after news (a write, a deletion in progress), fit once more this much later
ETA_SHARE = 0.01  # a sample off the line by this share of the free space moves the ETA ~1 %: refit
NOISE_FACTOR = 4.0  # samples within this many times the measured noise of the line are not news

Reader = Callable[[float], Points]  # since -> points (the mount's free-space history from `since` on)


@dataclass(frozen=True, slots=True)
class Fit:
    trend: Trend | None
    at: float  # `now` of the full fit
    last_ts: float  # the newest point it saw
    anchor: float  # the fitted line's free space at last_ts
    size: float
    tolerance: float
    floor: float  # a sample below this changes the fit (a learned cleanup is missed)
    refit_at: float
    cycles: tuple = ()  # sawtooth.Cycle learned so far, kept across fits
    steps: tuple[Step, ...] = ()  # checkpoint-sized steps of the window and the background rate
    background: float = 0.0
    line: float = 0.0  # bytes/s the free space falls between news: the trend's rate, or between steps
    checked_ts: float = float("-inf")  # the newest sample found on the line since the full fit
    writes: tuple = ()  # staircase.Write remembered so far, kept across fits


def _full(prev: Fit | None, pts: Points, size: float, now: float, cfg, news: bool) -> Fit:
    known = prev.cycles if prev is not None else ()
    known_writes = prev.writes if prev is not None else ()
    trend = fill_trend(pts, size, now, cfg.window, cfg.min_span, known, known_writes)
    writes = staircase.remember(known_writes, staircase.seen(pts, window_writes(pts, size)[0], GAP), now) \
        if len(pts) > 3 else known_writes
    found, background = steps(pts, size)
    last_ts = pts[-1][0] if pts else now
    slope = trend.slope if trend is not None else 0.0
    # After news, once more when it has settled: a fit made in the middle of a write sees part of it.
    refit = [now + (SETTLE if news else REFIT_EVERY)]
    if len(found) >= 2:
        slope = background  # a staircase is flat between its steps, and each step is news;
        # so is a step that does not come: a writer that stopped stays on the flat line, and a carried
        # ETA would count down to "full" on a disk that no longer fills.
        refit.append(_step_overdue(found, now))
    tail = pts[-9:]
    anchor = statistics.median(v + slope * (t - last_ts) for t, v in tail) if tail else 0.0
    floor = float("-inf")
    cycles = trend.cycles if trend is not None else known
    if trend is not None:
        if trend.learning:
            refit.append(pts[0][0] + cfg.window - GAP)  # the history covers the window: no longer learning
        if trend.bounded or trend.quiet:
            # Which of the rhythm's forecast and the plain fit alerts first changes as the window slides,
            # which no carried line follows, nor the end of a warm-up hold: such a trend is fitted again
            # each cycle (about 1 ms).
            refit.append(now + 1.0)
        # A cleanup that leaves the window, or that falls due, changes the fit.
        refit += [c.ts + cfg.window for c in cycles if c.ts + cfg.window > now]
        if trend.next_cleanup_in:
            refit.append(now + trend.next_cleanup_in)
        if len(cycles) >= 2:
            refit.append(max(sawtooth.missed_after(cycles), now + 1.0))
            floor = min(c.low for c in cycles)
        refit += [s.end + cfg.window for s in found if s.end + cfg.window > now]
    tolerance = min(DROP_FRACTION * size / 2,
                    max(NOISE_FACTOR * noise(pts), ETA_SHARE * max(anchor, 0.0), 1.0))
    return Fit(trend, now, last_ts, anchor, size, tolerance, floor, min(refit), cycles, tuple(found), background,
               slope, writes=writes)


def _step_overdue(found: Sequence[Step], now: float) -> float:
    """When the staircase's next step is half a period late (and, while it stays away, once a period)."""
    every = (found[-1].start - found[0].start) / (len(found) - 1)
    due = found[-1].start + 1.5 * every
    if every > 0 and due <= now:
        due += every * (1 + (now - due) // every)
    return max(due, now + 1.0)


def _holds(prev: Fit, new: Points, size: float, now: float) -> bool:
    if prev.trend is None or prev.size != size or not prev.at <= now < prev.refit_at:
        return False
    slope = prev.line
    for t, v in new:
        if t < prev.last_ts or v < prev.floor or abs(v - (prev.anchor - slope * (t - prev.last_ts))) > prev.tolerance:
            return False
    return True


def _carried(prev: Fit, now: float) -> Trend:
    """The trend of the last full fit, `now - prev.at` seconds on."""
    trend, dt = prev.trend, now - prev.at

    def later(x: float | None) -> float | None:
        return None if x is None else max(x - dt, 0.0)

    # Built field by field: dataclasses.replace costs twice as much, and this runs per mount per cycle.
    return Trend(slope=trend.slope, span=trend.span, points=trend.points, eta=later(trend.eta),
                 cleanup_every=trend.cleanup_every, cleanup_frees=trend.cleanup_frees, cleanup_low=trend.cleanup_low,
                 evidence=trend.evidence + dt, cycles=trend.cycles, next_cleanup_in=later(trend.next_cleanup_in),
                 eta_without_cleanup=later(trend.eta_without_cleanup), cleanup_missed=trend.cleanup_missed,
                 eta_error=trend.eta_error, eta_early=later(trend.eta_early), bounded=trend.bounded,
                 learning=trend.learning, quiet=trend.quiet)


def seeded(rows: Sequence[tuple[float, float, float]]) -> Fit:
    """A Fit with no trend yet that hands what earlier fits learned (`learned` rows: from the state database
    at start, or kept over a sample that could not be read) to the next full fit."""
    cycles = tuple(sawtooth.Cycle(*row) for row in rows if row[2] > 0)
    writes = tuple(staircase.Write(ts, -freed, after) for ts, after, freed in rows if freed < 0)
    return Fit(None, float("-inf"), float("-inf"), 0.0, 0.0, 0.0, float("-inf"), float("-inf"), cycles,
               writes=writes)


def learned(fit: Fit | None) -> tuple[tuple[float, float, float], ...]:
    """What a Fit learned, as plain rows for the state database: each cleanup cycle (ts, low, freed), and
    each write remembered as (start, after, -nbytes) (a cleanup frees bytes, a write takes them)."""
    if fit is None:
        return ()
    return tuple(sorted([*((c.ts, c.low, c.freed) for c in fit.cycles),
                         *((w.start, w.after, -w.nbytes) for w in fit.writes)]))


def follow_trend(prev: Fit | None, read: Reader, size: float, now: float, cfg) -> tuple[Trend | None, Fit]:
    """(the trend now, the Fit to pass next time). `read(since)` gives the history from `since` on;
    while the trend holds, only the samples since the last check are read (one or two a cycle)."""
    news = False
    if prev is not None and prev.trend is not None:
        since = max(prev.last_ts, prev.checked_ts)  # the samples before it were found on the line
        new = read(since)
        if new and new[-1][0] >= since and _holds(prev, new, size, now):
            return _carried(prev, now), dataclasses.replace(prev, checked_ts=new[-1][0])
        news = now < prev.refit_at  # a sample that left the line, not the end of the fit's time
    fit = _full(prev, read(now - cfg.window), size, now, cfg, news)
    return fit.trend, fit
