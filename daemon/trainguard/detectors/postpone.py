"""The one decision that may postpone a fill alert: whether a learned cleanup rhythm keeps the disk from
filling (`may_postpone`), what the alert counts on where it does not (`no_later`), whether warm-up may hold
it for a churn not yet seen (`may_hold`), and whether a deletion may delay it (`bounded_by_line`).

A rhythm that is not measured to keep up may still make the forecast earlier, never later: the trend
then alerts no later than the plain full-window fit. The rule is stated here only (and in docs/forecast.md).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trainguard.detectors.sawtooth import (
    MEMORY,
    Cycle,
    allowance,
    drift,
    level_floor,
    loss_per_period,
    lows_scatter,
    run_forward,
)

if TYPE_CHECKING:
    from trainguard.detectors.trend import Trend

NOISE_WIDTHS = 6.0  # a cleanup frees more than this many widths of the sample-to-sample jitter
HOLDS = MEMORY  # a rhythm run forward at the decline of its lows keeps the disk from filling this long
SMALL = 0.25  # deletions that gave back less than this share of what was written hold no fill
CHURN_SLACK = 2.0  # a churn's next cleanup comes within this many of the periods its last one implies
ERRORS = 2.0  # standard errors of the mean freed a shortfall must exceed to be measured
MAX_ERROR = 0.1  # relative ETA error beyond which an alert counts on no earlier ETA (forecast.level)


def may_postpone(cycles: Sequence[Cycle], gross: float, size: float, largest_write: float, noise: float,
                 latest: float, next_in: float, late: bool = False) -> bool:
    """Whether the learned rhythm may postpone a forecast: the rhythm it implies keeps the disk from filling.
    - every cleanup freed more than NOISE_WIDTHS of the samples' jitter: a dip of a few noise widths is noise;
    - what they free covers what the writer fills (`gross` bytes/s) in their mean period, short by no more
      than a low scatters anyway (sawtooth.allowance): a "cleanup" smaller than the fill between two of
      them leaves the disk to fill;
    - the low has held: two cycles' lows within that allowance; more, no lower across them than twice
      their scatter (their own around their line, and at least that allowance): no loss per period;
    - run forward from `latest` free bytes (the next cleanup `next_in` seconds away, or sooner where lows
      that hold are reached, then one a period) at the decline its lows show where it exceeds their
      scatter once (the rule above asks twice before it counts as a loss) and the cleanups free less
      than is written, by more than ERRORS standard errors of their mean (no faster than that
      shortfall), the disk holds for HOLDS at least: lows 800, 510, 220 GB of a daily cleanup that
      frees 1 TB are a disk full before the next one;
    - a cleanup that is `late` (past its periods scatter, sawtooth.late_after, and not seen coming) is
      counted on as due now only while the disk is above the level that brings it: past both, neither
      brought it."""
    if len(cycles) < 2 or gross <= 0 or min(c.freed for c in cycles) < NOISE_WIDTHS * noise:
        return False
    share = allowance(cycles, size, largest_write)
    every = (cycles[-1].ts - cycles[0].ts) / (len(cycles) - 1)
    shortfall = gross * every - statistics.fmean(c.freed for c in cycles)  # what a period leaves behind
    if shortfall > share:
        return False
    loss = 0.0
    if len(cycles) == 2:
        held = cycles[1].low >= cycles[0].low - share
    else:
        slope, spread = drift(cycles)
        scatter = lows_scatter(cycles, spread, size, largest_write)
        held = loss_per_period(cycles, every, slope, scatter) == 0
        freed_error = statistics.stdev(c.freed for c in cycles) / len(cycles) ** 0.5
        if -slope * (cycles[-1].ts - cycles[0].ts) > scatter and shortfall > ERRORS * freed_error:
            # A decline beyond one scatter is measured where the cleanups also free less than is written,
            # beyond what their mean is known to: lows read off noisy samples can seem to go down while
            # what is freed keeps up.
            loss = min(-slope, shortfall / every) * every
    # The next cleanup comes by its time or, where the lows hold and the disk is above their level_floor,
    # by its level (a GC at a mark whose writer runs faster this period triggers sooner, not later), as
    # next_low counts on.
    floor = level_floor(cycles, size, largest_write)
    if late and latest < floor:
        return False  # past its time and past the level that brings it: neither brought the cleanup
    first_in = min(next_in, (latest - floor) / gross) if latest > floor and loss == 0 else next_in
    forward = run_forward(latest, gross, loss, first_in, every)
    return held and (forward is None or forward >= HOLDS)


def no_later(rhythm: Trend, plain: Trend) -> Trend:
    """The trend of a rhythm that may not postpone: it alerts no later than the plain one. It is the
    rhythm's own forecast only where that alerts whenever the plain one would (its ETA as short, also where
    the alert counts on the earliest credible one, on as many samples, at least as well backed by its
    evidence; forecast.level is monotone in each), else the plain one."""
    mine, other = _alerted_eta(rhythm), _alerted_eta(plain)
    if mine is not None and (other is None or (
            mine <= other and rhythm.points >= plain.points and mine * plain.evidence <= other * rhythm.evidence)):
        return dataclasses.replace(rhythm, bounded=True)
    return dataclasses.replace(plain, bounded=True)


def _alerted_eta(trend: Trend) -> float | None:
    """The ETA forecast.level may alert on: the earliest credible one where it counts."""
    if trend.eta is None or not early_counts(trend):
        return trend.eta
    return min(trend.eta, trend.eta_early)


def early_counts(trend: Trend) -> bool:
    """Whether the alert may count on the trend's earliest credible ETA: a staircase's always (its error
    is widened for the few writes it was measured on), a saw-tooth's where its error is known well enough
    (a few cycles far apart say little of the lows' scatter)."""
    return trend.eta_early is not None and (not trend.cleanup_every or trend.eta_error <= MAX_ERROR)


def may_hold(trend: Trend, line: Trend | None, proven: bool, freed: float, since: float) -> Trend:
    """The trend in warm-up (the history covers less than a window), against the plain least-squares line
    through everything seen (`line`, deletions as they are). A rhythm measured to keep up (`proven`) is
    what it is. One deletion of `freed` bytes `since` seconds ago may be a churn not yet seen for one
    period: a churn that keeps up frees what is written in its period, so at the trend's pace its next
    cleanup is due within CHURN_SLACK times freed / pace; until then the alert is held (`quiet`: shown, not
    alerted on). After that, and where two cycles or more (`freed` 0) are a rhythm not measured to keep
    up, the line decides: a period or two says less than the line through all of it (a first cleanup that
    freed less than its period wrote, then a long period, reads as lows that decline, a fill the next
    cleanup undoes). A fill with no deletion in sight (no `line`) is what it seems, from when it began
    (`trend.evidence`: a download that started minutes after the daemon)."""
    if proven or trend.slope <= 0:
        return trend
    if freed > 0 and since < CHURN_SLACK * freed / trend.slope:
        return dataclasses.replace(trend, quiet=True)
    return trend if line is None else dataclasses.replace(line, learning=True, bounded=True)


def bounded_by_line(trend: Trend, line: Trend | None, fell: float, freed: float) -> Trend:
    """A trend that starts at a deletion (a change point: what happened after it) against the plain
    least-squares line through the window (`line`, the deletion as it is): where the deletions gave back
    less than SMALL of what was written meanwhile (`freed` beside `fell`, the net fall of free space), the
    disk fills whatever came after them, and the alert comes no later than the line's."""
    if line is None or trend.slope <= 0 or freed >= SMALL * (fell + freed):
        return trend
    return no_later(trend, line)
