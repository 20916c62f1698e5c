"""The one decision that may postpone a fill alert: whether a learned cleanup rhythm keeps the disk from
filling (`may_postpone`), what the alert counts on where it does not (`no_later`), and whether warm-up may
hold it for a churn not yet seen (`may_hold`).

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
    loss_per_period,
    lows_scatter,
    run_forward,
)

if TYPE_CHECKING:
    from trainguard.detectors.trend import Trend

NOISE_WIDTHS = 6.0  # a cleanup frees more than this many widths of the sample-to-sample jitter
HOLDS = MEMORY  # a rhythm run forward at the decline of its lows keeps the disk from filling this long
HOLD_SHARE = 0.25  # warm-up holds no fill whose deletions in sight gave back less than this share
MAX_ERROR = 0.1  # relative ETA error beyond which an alert counts on no earlier ETA (forecast.level)


def may_postpone(cycles: Sequence[Cycle], gross: float, size: float, largest_write: float, noise: float,
                 latest: float, next_in: float) -> bool:
    """Whether the learned rhythm may postpone a forecast: the rhythm it implies keeps the disk from filling.
    - every cleanup freed more than NOISE_WIDTHS of the samples' jitter: a dip of a few noise widths is noise;
    - what they free covers what the writer fills (`gross` bytes/s) in their mean period, short by no more
      than a low scatters anyway (sawtooth.allowance): a "cleanup" smaller than the fill between two of
      them leaves the disk to fill;
    - the low has held: two cycles' lows within that allowance; more, no lower across them than twice
      their scatter (their own around their line, and at least that allowance): no loss per period;
    - run forward from `latest` free bytes (the next cleanup `next_in` seconds away, then one a period) at
      the decline its lows show, however small beside their scatter, the disk holds for HOLDS at least:
      lows 800, 510, 220 GB of a daily cleanup are a disk full before the next one, whatever they scatter."""
    if len(cycles) < 2 or gross <= 0 or min(c.freed for c in cycles) < NOISE_WIDTHS * noise:
        return False
    share = allowance(cycles, size, largest_write)
    every = (cycles[-1].ts - cycles[0].ts) / (len(cycles) - 1)
    if gross * every - statistics.fmean(c.freed for c in cycles) > share:
        return False
    if len(cycles) == 2:
        slope, held = (cycles[1].low - cycles[0].low) / (cycles[1].ts - cycles[0].ts), cycles[1].low >= cycles[0].low - share
    else:
        slope, spread = drift(cycles)
        held = loss_per_period(cycles, every, slope, lows_scatter(cycles, spread, size, largest_write)) == 0
    forward = run_forward(latest, gross, max(-slope * every, 0.0), next_in, every)
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
    """The ETA forecast.level may alert on: the earliest credible one where its error is known well enough."""
    if trend.eta is None or trend.eta_early is None or trend.eta_error > MAX_ERROR:
        return trend.eta
    return min(trend.eta, trend.eta_early)


def may_hold(trend: Trend, line: Trend | None, written: float, freed: float) -> Trend:
    """Warm-up (the history covers less than a window) may hold an alert: for a churn not yet seen for one
    period where a deletion is in sight (`trend.quiet`), for a rate that has held only since a change
    (`trend.evidence`). Never for a fill the plain line through everything seen (`line`) proves: one where
    the deletions in sight gave back less than HOLD_SHARE of what was written meanwhile (`freed` of
    `written` bytes; a rhythm that keeps up has given back about half at least from its first cleanup on,
    whatever its phase, and a third with its depth and pace off by a third). That alert comes no later
    than the line's."""
    if line is None or trend.slope <= 0 or freed >= HOLD_SHARE * written:
        return trend
    return dataclasses.replace(no_later(dataclasses.replace(trend, quiet=False), line), learning=True)
