"""A saw-tooth whose lows go down (detectors.sawtooth): near zero its ETA jumps by most of a period, so
the warning counts on the earliest credible low, not only on the central forecast."""

from __future__ import annotations

import pytest
from trainguard import config as configmod
from trainguard.detectors import forecast, sawtooth
from trainguard.detectors.trend import Trend
from trainguard.records import Severity

GB = 1e9
H = 3600.0
SIZE = 1000 * GB
FREED, LOSS = 30 * GB, 10 * GB  # each cleanup frees 30 GB of the 40 GB written in its hour
GROSS = (FREED + LOSS) / H
JITTER = [0.0, 0.4, -0.3, 0.5, -0.6, 0.2, -0.1, 0.6, -0.4, 0.3, -0.5, 0.1]  # GB, the low-to-low steps'


def cycles(last_low: float) -> list[sawtooth.Cycle]:
    """Twelve hourly cleanups whose lows fall by LOSS, each step off by up to 0.6 GB."""
    lows, low = [], last_low
    for k in reversed(range(len(JITTER))):
        lows.append(low)
        low += LOSS - JITTER[k] * GB
    return [sawtooth.Cycle(k * H, v, FREED) for k, v in enumerate(reversed(lows))]


def forecast_after_last(last_low: float) -> sawtooth.NextLow:
    seen = cycles(last_low)
    now = seen[-1].ts + 60.0
    return sawtooth.next_low(seen, last_low + FREED - GROSS * 60.0, GROSS, SIZE, 0.0, now)


def test_a_low_within_its_errors_of_zero_may_fill_the_disk_a_period_early():
    # The third low to come is forecast at 1 GB: as likely to be a little under zero (full just
    # before that cleanup) as over it (full most of a period later).
    nxt = forecast_after_last(31 * GB)
    third_cleanup = 3 * H - 60.0
    assert nxt.eta is not None and nxt.eta > third_cleanup + 0.5 * H
    assert nxt.early is not None and nxt.early < third_cleanup


def test_a_low_well_clear_of_zero_keeps_the_central_eta():
    nxt = forecast_after_last(36 * GB)  # that low at 6 GB, beyond its error
    assert nxt.eta is not None and nxt.early == pytest.approx(nxt.eta)


def test_the_warning_counts_on_the_earliest_credible_low():
    cfg = configmod.parse({}, "test").forecast
    trend = Trend(slope=GROSS, span=6 * H, points=2000, eta=7.2 * H, evidence=6 * H, eta_early=5.9 * H)
    assert forecast.level(trend, cfg) is not None
    assert forecast.level(Trend(slope=GROSS, span=6 * H, points=2000, eta=7.2 * H, evidence=6 * H), cfg) is None


def test_a_decline_not_yet_learned_does_not_bring_the_warning_forward():
    # Three rotations of bursty logs whose lows happened to fall: the central ETA is 21 h with a stated
    # error of 50 %, and lows "a few errors lower" would say anything.
    cfg = configmod.parse({}, "test").forecast
    trend = Trend(slope=GROSS, span=6 * H, points=2000, eta=21 * H, evidence=6 * H, eta_error=0.5,
                  eta_early=3.6 * H, cleanup_every=2 * H, cleanup_frees=20 * GB)
    assert forecast.level(trend, cfg) is None
    # A staircase's earliest ETA counts whatever its error: its error is of writes measured in the window,
    # widened for how few they are, and a disk without cleanups fills.
    stepped = Trend(slope=GROSS, span=6 * H, points=2000, eta=9 * H, evidence=6 * H, eta_error=0.5,
                    eta_early=5 * H)
    assert forecast.level(stepped, cfg) == (Severity.WARNING, cfg.warning)


def test_a_cleanup_whose_first_samples_are_in_is_not_missed():
    # Hourly cleanups from 20 GB back to 60 GB free on a 1 TB disk; the one due at 5 h comes at 5.35 h, when
    # the disk is below its lows and past its time. Its first two rising samples are not counted yet (they
    # may be an outlier), but neither may they leave the rhythm called stopped: a critical "full in 9
    # minutes" at the very moment the cleanup comes.
    gross, now = 40 * GB / H, 5.35 * H

    def avail(t: float) -> float:
        return 60 * GB - gross * (t - min(int(t / H), 4) * H)

    pts = [(t, avail(t)) for t in range(0, int(now) + 1, 10)]
    missed = forecast.fill_trend(pts, SIZE, now, 6 * H, 1800)
    assert missed.cleanup_missed and missed.eta < 0.2 * H
    coming = pts + [(now + 10, avail(now) + 20 * GB), (now + 20, avail(now) + 40 * GB)]
    trend = forecast.fill_trend(coming, SIZE, now + 20, 6 * H, 1800)
    assert not trend.cleanup_missed and trend.eta is None


def test_a_rhythm_seen_for_one_period_is_not_missed_before_twice_that_period():
    # Two cleanups 8 min apart of a GC on a timer every 12 min +-25 % (or whose writer's pace jitters): the
    # next came 15 min after the last. Below its lows by their allowance, it is not called stopped (a
    # critical "full in 15 min" as it came) until twice the one period seen, as a churn's next cleanup.
    every, gross = 8 * 60.0, 200 * GB / (8 * 60.0)
    cycles = (sawtooth.Cycle(0.0, 100 * GB, 200 * GB), sawtooth.Cycle(every, 100 * GB, 200 * GB))
    for late, stopped in ((0.3, False), (0.9, False), (1.1, True)):
        nxt = sawtooth.next_low(cycles, 30 * GB, gross, SIZE, 0.0, every + every * (1 + late))
        assert nxt.stopped is stopped, late


def test_a_cycle_learned_before_is_kept_where_the_window_no_longer_shows_it():
    # Cleanups at 0, 15 and 30 min learned from fine samples; the window now shows those at 0 and 30 min
    # only (the one at 15 averaged beside a checkpoint write), that at 30 min 2 min later than learned.
    known = (sawtooth.Cycle(0.0, 50 * GB, 80 * GB), sawtooth.Cycle(900.0, 52 * GB, 79 * GB),
             sawtooth.Cycle(1800.0, 49 * GB, 81 * GB))
    seen = [sawtooth.Cycle(0.0, 50 * GB, 80 * GB), sawtooth.Cycle(1920.0, 48 * GB, 82 * GB)]
    merged = sawtooth.merge(known, seen, 2000.0)
    assert [c.ts for c in merged] == [0.0, 900.0, 1920.0]  # the one seen again is the window's


def test_a_period_that_hid_cleanups_while_down_does_not_make_a_gc_late():
    # A GC at its mark about every 2 h (its period scatters with the writer's pace); the daemon was down
    # from 4.5 h to 9.5 h and two cleanups came unseen, so one interval reads 6 h. At 22.9 h, 0.3 periods
    # past the usual time, a 13 GB checkpoint takes the disk below its lows' floor: the GC runs a minute
    # later, as its mark says. Full in 2.2 h at this pace, but not before its time is passed (24.65 h: the
    # longest single period, 2.5 h, later by half again the range of those, 1.2-2.5 h).
    ts = [0.0, 2.5, 4.0, 10.0, 11.2, 13.7, 16.2, 18.2, 20.2]
    lows = [80.0, 81.0, 79.5, 80.5, 79.0, 80.0, 81.0, 79.5, 80.5]
    seen = [sawtooth.Cycle(t * H, v * GB, 50 * GB) for t, v in zip(ts, lows)]
    gross, size, checkpoint = 25 * GB / H, 300 * GB, 13 * GB
    assert sawtooth.late_after(seen) == pytest.approx(24.65 * H, abs=0.01 * H)
    assert not sawtooth.next_low(seen, 56 * GB, gross, size, checkpoint, 22.9 * H).stopped
    # Past its time, the same disk is counted on no cleanup; nor before it where it is full first.
    assert sawtooth.next_low(seen, 56 * GB, gross, size, checkpoint, 24.7 * H).stopped
    assert sawtooth.next_low(seen, 10 * GB, gross, size, checkpoint, 22.9 * H).stopped


@pytest.mark.parametrize(("periods", "lows", "late", "past"), [
    # A timer every 1.51 h +-25 % whose first five periods spanned 1.20-1.49 h: its lows follow its
    # periods (100 GB/h from 300 GB free). The sixth came 1.86 h after the fifth.
    ([1.20, 1.38, 1.30, 1.49, 1.35], [180.0, 162.0, 170.0, 151.0, 165.0, 180.0], 1.86, 1.95),
    # A GC at its mark, the mark jittering +-17 GB from cycle to cycle and the writer's pace +-20 %: five
    # lows within 5.8 GB, periods 1.12-1.81 h. The sixth came 2.59 h after the fifth, 10 GB under them.
    ([1.12, 1.61, 1.58, 1.81, 1.65], [100.0, 103.5, 98.2, 101.0, 103.9, 99.4], 2.59, 2.9),
])
def test_a_rhythm_seen_a_few_times_is_late_past_what_its_periods_span(periods, lows, late, past):
    # A few periods seen span less than the rhythm scatters: a cleanup later than any of them is not yet
    # missed. Later than the longest by half again their range it is, with the disk under its lows.
    ts = [0.0]
    for p in periods:
        ts.append(ts[-1] + p * H)
    seen = [sawtooth.Cycle(t, v * GB, 150 * GB) for t, v in zip(ts, lows)]
    gross, last = 100 * GB / H, ts[-1]
    below = sawtooth.level_floor(seen, SIZE, 0.0) - 5 * GB  # under its lows by more than they scatter
    for hours, stopped in ((late, False), (past, True)):
        assert sawtooth.next_low(seen, below, gross, SIZE, 0.0, last + hours * H).stopped is stopped
    assert sawtooth.late_after(seen) == pytest.approx(
        last + (max(periods) + sawtooth.RANGES_LATE * (max(periods) - min(periods))) * H)


def test_a_cleanup_that_came_while_the_daemon_was_down_is_placed_by_its_rhythm():
    # A timer every 75 min frees what 20 GB/h wrote since the last; the daemon was down 4.39-4.54 h and the
    # cleanup at 4.40 h shows only in the first sample after it, 8.4 min late. Taken as it shows, its two
    # periods (83.4 and 66.6 min) would read as a rhythm that jitters by that much. Placed where the
    # rhythm puts it within the hole, it is as regular as it is; and whatever an earlier fit learned of it.
    rate, top, size = 20 * GB / H, 100 * GB, 1000 * GB
    ticks = [0.65 * H, 1.90 * H, 3.15 * H, 4.40 * H, 5.65 * H]
    down, now = (4.39 * H, 4.54 * H), 6.0 * H

    def avail(t: float) -> float:
        return top - rate * (t - max((c for c in ticks if c <= t), default=0.0))

    pts = [(t, avail(t)) for t in (10.0 * k for k in range(int(now / 10) + 1)) if not down[0] < t < down[1]]
    for known in ((), (sawtooth.Cycle(4.54 * H, 75 * GB, 25 * GB),)):
        trend = forecast.fill_trend(pts, size, now, 6 * H, 1800, known=known)
        assert [round(c.ts / H, 3) for c in trend.cycles] == [0.65, 1.90, 3.15, 4.40, 5.65]
        assert sawtooth.late_after(trend.cycles) == pytest.approx((5.65 + 1.25 * (1 + sawtooth.LATE)) * H, abs=60)
    # With no rhythm before it to place it by, it is where it shows.
    trend = forecast.fill_trend([p for p in pts if p[0] > 3.5 * H], size, now, 6 * H, 1800)
    assert [round(c.ts / H, 2) for c in trend.cycles] == [4.54, 5.65]
