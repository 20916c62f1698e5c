"""A cleanup saw-tooth (GC at a high-water mark, a cron job, a trainer keeping its last checkpoints),
learned from its cycles, and forecast as "the next low".

Each cleanup seen is a `Cycle`: when it came, the free space just before it (its low) and what it
freed. The cycles of the fit window are merged with those learned before (plain data the caller passes
back in, and the daemon keeps in its state database), kept for four of the longest periods (a day at
least, a week at most), so a saw-tooth whose period is a large part of the window, or longer than it,
still has enough cycles for its period, the scatter of its lows and their drift.

A rhythm is counted on only where it keeps the disk from filling (detectors.postpone.may_postpone: the rule,
stated there and in docs/forecast.md). What a GC that keeps up means for the forecast:
- the next cleanup is expected one period after the last (`next_in`); if it does not come, the disk is
  full after `latest / gross` (`eta_without`): both go into the alert text;
- the lows hold (within their own scatter): the disk is never forecast full while the next cleanup is
  still due, by its level (the disk is above the lowest low, less the lows' scatter) or by its time (no
  later than its periods scatter: `missed_after`); one missed by both is counted on no more;
- the lows go down across cycles by more than their scatter explains: the saw-tooth is run forward and
  the ETA is the moment the low before some cleanup reaches zero; it warns only when that low is
  within the warning lead. Where the lows are near zero the ETA is not smooth: a low that ends up a
  little under zero fills the disk just before its cleanup, one a little over it a whole period later.
  So the earliest credible ETA (`early`) is that of lows lower by a few times their own error (the scatter
  of the low-to-low steps, adding up over the cycles to come, and that of the learned loss), and the
  warning counts on that.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.detectors.fit import theil_sen

MEMORY = 24 * 3600.0  # cycles are remembered at least this long (a day of checkpoints or rotations) ...
PERIODS_KEPT = 4  # ... and at least this many of their longest period (two periods left as one is late) ...
MEMORY_MAX = 7 * 86400.0  # ... up to a week (a weekly cleanup is then known from its last two)
MAX_CYCLES = 16
SAME_CLEANUP = 300.0  # a cleanup's time moves by up to a history bucket when its samples are averaged:
# 5 min apart is another cleanup
LATE = 0.1  # a cleanup later than its periods scatter, and this share of a period at least, with the disk
# below its lows by their scatter, has stopped
# A few periods span less than the rhythm scatters (five of a timer +-25 % span two thirds of its range on
# average, and half of it or less one time in five), and the median deviation of a few is looser still: a
# cleanup is not late before the longest period seen, later by half again their range. Periods off their
# mean by up to j are then called late 4 j past it at most.
RANGES_LATE = 1.5
ONE_PERIOD_LATE = 1.0  # with one period seen its scatter is unknown (one timed off a first cleanup seen
# in warm-up, or a short one of a jittery GC): the next may come twice it later
JITTER_OF_FREED = 0.3  # lows scatter at least this share of what a cleanup frees (its trigger jitters)
# Standard errors a low to come may fall short of its forecast: a warning is due at every one of the
# few cycles that pass through the lead, each a new draw, and the scatter is learned from a few steps.
LOW_ERRORS = 2.5


@dataclass(frozen=True, slots=True)
class Cycle:
    ts: float  # when the cleanup came (its last rising sample)
    low: float  # free bytes just before it
    freed: float  # bytes it gave back


@dataclass(frozen=True, slots=True)
class NextLow:
    eta: float | None  # seconds to full with the cleanups coming as learned; None: they keep up
    next_in: float  # seconds until the next cleanup is expected (0: due now)
    eta_without: float  # seconds to full if it does not come
    every: float  # median period
    frees: float  # median bytes freed
    low: float  # the lowest low seen (keeping up), bytes free
    stopped: bool = False  # missed by level and time: counted on no more
    error: float = 0.0  # relative standard error of eta (the lows' slope)
    early: float | None = None  # seconds to full if the lows come in LOW_ERRORS of their errors lower


def merge(known: Sequence[Cycle], seen: Sequence[Cycle], now: float,
          untimed: Sequence[tuple[float, Cycle]] = ()) -> tuple[Cycle, ...]:
    """The cycles to judge by: those the window shows, and those learned before that it does not show
    (one the window has just cut into is no longer seen whole, but was), kept for `memory` of them and not
    later than now (after a clock step back they are forgotten). `untimed`: cleanups the window shows only
    after a hole in the samples (from when, the cycle at the hole's end), placed in it by `placed`."""
    # One seen before and not now is kept: averaged into minute means beside a checkpoint write, a
    # cleanup seen whole in the fine samples may no longer read as one.
    known = [c for c in known if c.ts <= now and all(abs(c.ts - s.ts) > SAME_CLEANUP for s in seen)
             and all(not since - SAME_CLEANUP <= c.ts <= s.ts + SAME_CLEANUP for since, s in untimed)]
    cycles = sorted([*known, *seen], key=lambda c: c.ts)
    for since, cycle in untimed:
        cycles = sorted([*cycles, placed(cycles, since, cycle)], key=lambda c: c.ts)
    cycles = cycles[-MAX_CYCLES:]
    keep = memory(cycles)
    return tuple(c for c in cycles if now - keep <= c.ts)


def placed(cycles: Sequence[Cycle], since: float, cycle: Cycle) -> Cycle:
    """A cleanup that came while no sample was taken, between `since` and `cycle.ts` (the daemon was
    down): where the rhythm of the cycles before it puts the last one in that hole (a median period on
    from the one before, or whole periods on in a longer hole), or at its end where no rhythm is known yet.
    At the hole's end, a timer every 75 min seen 9 min late would read as jittering by that much."""
    before = [c for c in cycles if c.ts < since]
    every = statistics.median(b.ts - a.ts for a, b in zip(before, before[1:])) if len(before) > 1 else 0.0
    if every <= 0:
        return cycle
    periods = max(math.floor((cycle.ts - before[-1].ts) / every), 1)
    return dataclasses.replace(cycle, ts=min(max(before[-1].ts + periods * every, since), cycle.ts))


def memory(cycles: Sequence[Cycle]) -> float:
    """How long cycles are remembered: PERIODS_KEPT of the longest period, so that a restart or a few
    unreadable samples between two daily cleanups do not forget the rhythm; a day at least, a week at most.
    A single cycle is kept the week: the next one of a daily or weekly cleanup is to come."""
    if len(cycles) < 2:
        return MEMORY_MAX
    longest = max(b.ts - a.ts for a, b in zip(cycles, cycles[1:]))
    return min(max(MEMORY, PERIODS_KEPT * longest), MEMORY_MAX)


def allowance(cycles: Sequence[Cycle], size: float, largest_write: float) -> float:
    """What a low may be off by whatever the rhythm: a deletion-sized share of the disk, a checkpoint
    written just before the cleanup, its trigger's jitter (a share of what it frees)."""
    return max(size * 0.005, largest_write, JITTER_OF_FREED * statistics.median(c.freed for c in cycles))


def missed_after(cycles: Sequence[Cycle]) -> float:
    """When the next cleanup is later than the rhythm's periods scatter (`late_after`; ONE_PERIOD_LATE where
    one period is all that was seen): then its time has passed."""
    if len(cycles) < 3:
        return cycles[-1].ts + (cycles[-1].ts - cycles[0].ts) * (1 + ONE_PERIOD_LATE)
    return late_after(cycles)


def late_after(cycles: Sequence[Cycle]) -> float:
    """When the next cleanup is later than the periods scatter: three robust widths of them past their
    median, or LATE of one where they hardly scatter (or where one period is all that was seen), and no
    sooner than the longest period seen by RANGES_LATE of their range. Robust: a cleanup seen only after a
    restart's downtime came "late" once without the rhythm being any looser, and an interval that hid
    cleanups while the daemon was down (twice the median or more) is not one period."""
    periods = [b.ts - a.ts for a, b in zip(cycles, cycles[1:])]
    every = statistics.median(periods)
    spread = 1.4826 * statistics.median(abs(p - every) for p in periods)
    single = [p for p in periods if p < 2 * every] or periods
    longest = max(single)
    by_range = longest + RANGES_LATE * (longest - min(single))
    return cycles[-1].ts + max(every + max(3 * spread, LATE * every), by_range)


def may_be_coming(cycles: Sequence[Cycle], arriving: float) -> bool:
    """Whether a rise at the newest samples not counted yet (`arriving` bytes) may be the next cleanup: half
    what one frees or more (less is an outlier's size)."""
    return arriving >= 0.5 * statistics.median(c.freed for c in cycles)


def level_floor(cycles: Sequence[Cycle], size: float, largest_write: float) -> float:
    """Free bytes below which the next cleanup is late by its level: the lowest low less what the lows
    scatter by (at least a deletion-sized share of the disk or a checkpoint; from two cycles, whose scatter
    says little, the allowance of a trigger's jitter)."""
    margin = max(size * 0.005, largest_write, drift(cycles)[1]) if len(cycles) > 2 \
        else allowance(cycles, size, largest_write)
    return min(c.low for c in cycles) - margin


def drift(cycles: Sequence[Cycle]) -> tuple[float, float]:
    """(slope of the lows in bytes/s, their scatter around it: max - min of the residuals)."""
    slope = (theil_sen([(c.ts, c.low) for c in cycles]) or 0.0) if len(cycles) >= 3 else 0.0
    residuals = [c.low - slope * (c.ts - cycles[0].ts) for c in cycles]
    return slope, max(residuals) - min(residuals)


def lows_scatter(cycles: Sequence[Cycle], spread: float, size: float, largest_write: float) -> float:
    """What the lows may scatter by: their own spread, and at least the allowance."""
    return max(allowance(cycles, size, largest_write), spread)


def loss_per_period(cycles: Sequence[Cycle], every: float, slope: float, scatter: float) -> float:
    """Bytes the lows lose per period when they go down by more than their scatter; 0 when they hold."""
    if len(cycles) < 3:
        return 0.0
    decline = -slope * (cycles[-1].ts - cycles[0].ts)
    return -slope * every if decline > 2 * scatter else 0.0


def run_forward(avail: float, gross: float, loss: float, first_in: float, period: float) -> float | None:
    """Seconds until free space reaches 0 filling at `gross` bytes/s, with cleanups `first_in` seconds
    from now and then every `period` seconds that leave the disk `loss` bytes lower each period;
    None when the cleanups keep up."""
    if avail <= gross * first_in:
        return avail / gross  # full before the next cleanup
    if loss <= 0:
        return None
    freed = gross * period - loss
    level = avail - gross * first_in + freed  # just after the next cleanup
    # The lowest point of each period is just before its cleanup: the first period whose low reaches 0.
    k = max(0, math.ceil((level - gross * period) / loss))
    return first_in + k * period + (level - k * loss) / gross


def next_low(cycles: Sequence[Cycle], latest: float, gross: float, size: float, largest_write: float,
             now: float, arriving: float = 0.0) -> NextLow:
    """The forecast of a saw-tooth with at least two cycles, filling at `gross` bytes/s between them.
    `arriving`: bytes the newest samples rise by that are not counted yet (fewer than three samples on);
    half what a cleanup frees or more may be the cleanup coming, which is not missed while it may be (less
    is an outlier's size)."""
    every = statistics.median(b.ts - a.ts for a, b in zip(cycles, cycles[1:]))
    frees = statistics.median(c.freed for c in cycles)
    slope, spread = drift(cycles)
    scatter = lows_scatter(cycles, spread, size, largest_write)
    last = cycles[-1].ts
    next_in = max(last + every - now, 0.0)
    eta_without = latest / gross
    # Below its level_floor the level that brings a cleanup is passed; later than the latest one has come
    # by more than the periods scatter, its time is.
    lowest = min(c.low for c in cycles)
    below = latest < level_floor(cycles, size, largest_write)
    # Its latest time: the longest period seen, but no later than its time is passed (an interval that
    # hid a cleanup come while the daemon was down is two periods, not a late one).
    missed = missed_after(cycles)
    latest_time = min(last + max(b.ts - a.ts for a, b in zip(cycles, cycles[1:])), missed)
    if below and not may_be_coming(cycles, arriving) and (now >= missed or now + eta_without < latest_time):
        # Neither its level nor its time brought the cleanup (or the disk is full before even its
        # latest time): it may have stopped, so count on none.
        return NextLow(eta_without, next_in, eta_without, every, frees, lowest, stopped=True)
    loss = loss_per_period(cycles, every, slope, scatter)
    if loss > 0:
        # Run forward at the pace the cycles balance to (what each frees, and what the lows lose, over
        # the mean period): over many cycles it is closer than the fit of the window between cleanups.
        mean_every = (cycles[-1].ts - cycles[0].ts) / (len(cycles) - 1)
        gross = statistics.fmean(c.freed for c in cycles[1:]) / mean_every - slope
    eta = run_forward(latest, gross, loss, next_in, every) if loss > 0 else None
    return NextLow(eta, next_in, eta_without, every, frees, lowest,
                   error=_eta_error(cycles, slope, loss, eta / every) if eta is not None else 0.0,
                   early=_earliest(cycles, slope, latest, gross, loss, next_in, every, eta))


def _earliest(cycles: Sequence[Cycle], slope: float, latest: float, gross: float, loss: float, first_in: float,
              period: float, eta: float | None) -> float | None:
    """Seconds to full if each low to come is LOW_ERRORS of its standard errors under its forecast: the first
    low that may reach zero fills the disk before its cleanup. A low k cleanups ahead is off by the
    scatter of the low-to-low steps (they add up as a random walk: each cleanup frees and comes a
    little apart) over k + 1 steps, and by k + 1 times the error of the mean loss per period."""
    if eta is None or len(cycles) < 3:
        return eta
    steps = [b.low - a.low - slope * (b.ts - a.ts) for a, b in zip(cycles, cycles[1:])]
    sd = math.sqrt(sum(r * r for r in steps) / max(len(steps) - 1, 1))
    of_loss = sd / math.sqrt(len(steps))
    k = 0
    while first_in + k * period < eta:
        at = first_in + k * period
        low = latest - gross * first_in - k * loss  # just before cleanup k (0: the next)
        margin = LOW_ERRORS * math.hypot(sd * math.sqrt(k + 1), of_loss * (k + 1))
        if low < margin:
            return max(min(at - (margin - low) / gross, eta), 0.0)
        k += 1
    return eta


def _eta_error(cycles: Sequence[Cycle], slope: float, loss: float, periods: float) -> float:
    """Relative standard error of an ETA run forward on the lows: that of their slope (their scatter
    around the line, over how far apart in time they are), and that of the cycles still to come (each
    low scatters as much again, and the one that reaches zero is `periods` cycles away)."""
    n = len(cycles)
    if n < 3 or slope >= 0 or loss <= 0:
        return 0.0
    t0 = cycles[0].ts
    residuals = [c.low - cycles[0].low - slope * (c.ts - t0) for c in cycles]
    mid = statistics.fmean(residuals)
    sd = math.sqrt(sum((r - mid) ** 2 for r in residuals) / (n - 2))
    times = [c.ts for c in cycles]
    spread = math.sqrt(sum((t - statistics.fmean(times)) ** 2 for t in times))
    of_slope = sd / spread / -slope if spread > 0 else 0.0
    to_come = sd / (loss * math.sqrt(max(periods, 1.0)))
    return min(math.hypot(of_slope, to_come), 0.5)
