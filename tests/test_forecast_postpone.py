"""A learned rhythm may postpone an alert only when it is measured to keep up, and warm-up may hold an alert
for a churn it has not seen, never for a fill the plain fit proves (detectors.postpone).

The reference is the plain least-squares line through the samples (predict_linear's method), written in
tests/support/plain_fit.py.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from trainguard.config import Forecast
from trainguard.detectors.forecast import fill_trend, follow_trend, level
from trainguard.detectors.postpone import may_postpone
from trainguard.detectors.sawtooth import Cycle, late_after
from trainguard.store.history import History

from tests.support import fill_props as fp
from tests.support.plain_fit import plain_eta

GB = 1e9
H = 3600.0
DAY = 24 * H
CFG = Forecast()


def plain_warns(points) -> bool:
    """The plain fit warns: its ETA under the warning horizon, and no further ahead than it has watched."""
    eta = plain_eta(points)
    return eta is not None and eta < CFG.warning and eta <= CFG.evidence_ratio * (points[-1][0] - points[0][0])


def from_a_fresh_start(avail, size: float, end: float) -> tuple[list, list]:
    """(when the daemon alerts, when the plain fit warns): `avail(t)` sampled every 10 s from a fresh
    start until `end` or full, the daemon's path evaluated every minute."""
    history, fit, active = History(None, window=CFG.window), None, None
    seen, alerted, plain = [], [], []
    for k in range(int(end // 10)):
        t = 10.0 * k
        if avail(t) <= 0:
            break
        history.record(t, {"a": avail(t)})
        seen.append((t, avail(t)))
        if k % 6:
            continue  # evaluated every minute
        trend, fit = follow_trend(fit, lambda since: history.points("a", since), size, t, CFG)
        alert = level(trend, CFG, active)
        active = alert[0] if alert else None
        alerted += [t] if alert else []
        plain += [t] if len(seen) > 2 and plain_warns(seen) else []
    return alerted, plain


# ---- a rhythm that loses ground ------------------------------------------------------------------------

SIZE = 10_000 * GB
GROSS = 1290 * GB / DAY  # written per second
LOWS = (800 * GB, 510 * GB, 220 * GB)  # a daily cleanup freeing 1 TB, at 24, 48 and 72 h
FULL_AT = 3 * DAY + (LOWS[-1] + 1000 * GB) / GROSS  # 1.3 h before the next cleanup would come


def losing_rhythm(t: float) -> float:
    """Free bytes at t seconds: filling at GROSS, 1 TB given back at each of the three cleanups."""
    freed = sum(1000 * GB for k in range(1, 4) if t >= k * DAY)
    return LOWS[0] + GROSS * DAY - GROSS * t + freed


def test_a_rhythm_whose_lows_decline_to_full_does_not_postpone_the_alert():
    cycles = tuple(Cycle(k * DAY, low, 1000 * GB) for k, low in zip((1, 2, 3), LOWS))
    warned = []
    for hours_left in (5.9, 5.7, 5.5, 5.3):
        now = FULL_AT - hours_left * H
        pts = [(t, losing_rhythm(t)) for t in range(int(now - CFG.window), int(now) + 1, 60)]
        assert plain_warns(pts), hours_left  # the plain line says full in under 6 h, and has watched 6 h
        trend = fill_trend(pts, SIZE, now, CFG.window, CFG.min_span, cycles)
        assert trend.eta is not None and trend.eta <= plain_eta(pts) * 1.01, (hours_left, trend.eta)
        warned.append(level(trend, CFG) is not None)
    assert all(warned), warned  # at least as early as the plain fit


# ---- warm-up and a small deletion in a real fill -------------------------------------------------------

def test_warm_up_does_not_hold_a_fill_that_the_plain_fit_proves():
    # A fresh start on a 1 TB disk filling at 100 GB/h from 400 GB free, one 10 GB rm at 1.5 h: full at 4.1 h.
    size, rate = 1000 * GB, 100 * GB / H
    full_at = (400 * GB + 10 * GB) / rate

    def avail(t: float) -> float:
        return 400 * GB - rate * t + (10 * GB if t >= 1.5 * H else 0.0)

    alerted, plain = from_a_fresh_start(avail, size, full_at)
    assert plain and alerted and alerted[0] <= plain[0] + 60.0, (alerted[:1], plain[:1])


# ---- lows that seem to decline while the cleanups keep up ------------------------------------------------

def test_lows_that_seem_to_decline_while_what_is_freed_keeps_up_still_postpone():
    # A GC every 15 min freeing 9 GB on average (between 6 and 12) of the 8.4 GB written, on a 50 GB disk: its
    # lows, read off noisy samples, go 8 -> 4 GB across 16 cycles, a decline past their spread by chance. Run
    # forward at it the disk would fill in 4 h; what the cleanups free says they keep up.
    gross, every = 8.4 * GB / (0.25 * H), 0.25 * H
    lows = (8, 6, 8, 9, 8, 6, 9, 8, 7, 6, 4, 4, 3, 5, 5, 4)
    freed = (8, 8, 8, 6, 10, 11, 7, 11, 7, 8, 12, 11, 12, 12, 9, 9)
    cycles = tuple(Cycle(k * every, low * GB, f * GB) for k, (low, f) in enumerate(zip(lows, freed)))
    assert sum(freed) / len(freed) * GB >= gross * every  # they keep up
    assert may_postpone(cycles, gross, 50 * GB, 0.0, 0.02 * GB, 4 * GB, 0.1 * every)
    # The same lows where each cleanup frees a steady 7.6 GB of the 8.4 GB written: a measured loss.
    lossy = tuple(dataclasses.replace(c, freed=7.6 * GB) for c in cycles)
    assert not may_postpone(lossy, gross, 50 * GB, 0.0, 0.02 * GB, 4 * GB, 0.1 * every)


def test_a_gc_at_its_mark_whose_writer_runs_faster_this_period_is_not_full_before_its_next_cleanup():
    # A GC at 97 % used of a 1.46 TB disk, freeing ~170 GB about every 1.5 h: its lows 32-54 GB. This period
    # the writer runs at 112 GB/h, and at 32 GB free the cleanup due by its mean period is 20 min away,
    # after the disk would be full at this pace. It comes by its level, as every one before it did: the
    # rhythm keeps up. Below the level that brought them by more than their scatter, only its time counts.
    size, every, gross = 1460 * GB, 1.54 * H, 112.5 * GB / H
    lows = (46.7, 31.9, 52.4, 42.0, 41.2, 41.5, 54.3, 39.1)
    freed = (183.2, 189.9, 162.3, 149.0, 182.1, 194.8, 177.0, 126.9)
    cycles = tuple(Cycle(k * every, low * GB, f * GB) for k, (low, f) in enumerate(zip(lows, freed)))
    next_in = 0.32 * H
    assert 31.8 * GB < gross * next_in  # by its time alone, full before it comes
    assert may_postpone(cycles, gross, size, 0.0, 0.05 * GB, 31.8 * GB, next_in)
    # The lows scatter by about 25 GB around their line: at 5 GB free the level is passed.
    assert not may_postpone(cycles, gross, size, 0.0, 0.05 * GB, 5 * GB, next_in)


def mark_gc(lows, freed, paces, now_low: float) -> tuple[list, list, float]:
    """(samples every minute, cycles, now): a GC at its mark, cleanup k coming when the disk is at lows[k]
    and freeing freed[k], the writer at paces[k] bytes/s before it; then at paces[-1] down to `now_low`."""
    pts, cycles, t, free = [], [], 0.0, lows[0] + 30 * GB
    for k, low in enumerate([*lows, now_low]):
        rate = paces[k]
        while free - rate * 60 > low:
            pts.append((t, free))
            t, free = t + 60, free - rate * 60
        t, free = t + (free - low) / rate, low
        if k < len(lows):
            pts.append((t, free))
            cycles.append(Cycle(t, low, freed[k]))
            t, free = t + 1, free + freed[k]
    pts.append((t, free))
    return pts, cycles, t


@pytest.mark.parametrize("lowest", [False, True])
def test_a_rhythm_not_counted_on_alerts_by_the_plain_line_taken_at_now_not_at_a_low(lowest):
    # A GC at 94 % used of a 160 GB disk, 16 cleanups of 20-44 GB at lows of 7-16.5 GB: it keeps up, but
    # lows that scatter by most of their level cannot prove it, and this period the writer runs at
    # 95 GB/h. At a low, predict_linear's line through the window, taken at now, is days from full; a line
    # through the newest sample said 4 h at the lowest low seen, and a warning came at every low that
    # deep. Where the lows go down, the plain line warns and so does the daemon.
    lows = [x * GB for x in (10.1, 15.9, 11.9, 7.1, 11.0, 14.3, 10.1, 16.5, 7.6, 13.6, 10.7, 9.9, 9.3, 13.3, 14.3, 8.4)]
    freed = [x * GB for x in (39.4, 20.3, 36.9, 40.3, 30.7, 42.6, 40.4, 29.2, 43.8, 34.8, 40.9, 33.9, 41.2, 35.7,
                              33.8, 30.6)]
    paces = [x * GB / H for x in (75, 88, 71, 93, 80, 84, 72, 90, 78, 86, 74, 82, 91, 70, 85, 79, 95)]
    for now_low in (7.1 * GB, 6 * GB) if lowest else (8.4 * GB, 12 * GB):
        pts, cycles, now = mark_gc(lows, freed, paces, now_low)
        window = [p for p in pts if p[0] >= now - CFG.window]
        assert not plain_warns(window)
        trend = fill_trend(window, 160 * GB, now, CFG.window, CFG.min_span, tuple(cycles))
        assert trend.bounded and level(trend, CFG) is None, (now_low / GB, trend.eta)  # refused, and quiet
    # Each low 4 GB under the one before (36 GB freed of the 40 GB a period writes): the plain line warns,
    # and so does the daemon.
    sinking = [80 * GB - 4 * GB * k for k in range(16)]
    pts, cycles, now = mark_gc(sinking, [36 * GB] * 16, [80 * GB / H] * 17, 14 * GB)
    window = [p for p in pts if p[0] >= now - CFG.window]
    trend = fill_trend(window, 160 * GB, now, CFG.window, CFG.min_span, tuple(cycles))
    assert plain_warns(window) and level(trend, CFG) is not None


def test_a_cleanup_past_its_time_and_past_the_level_that_brings_it_does_not_postpone():
    # A timer every 7 h on a 193 GB disk frees 79 GB back to 112 GB free, twice, and stops. With one period
    # seen its next may come twice later, and an overdue one counted as due now kept the rhythm "keeping
    # up" until the disk was full: no warning at all. Past its time and under its lows by their
    # allowance, neither time nor level brought it, and the plain line decides.
    size, period, top, freed = 193 * GB, 7.04 * H, 112 * GB, 79 * GB
    rate, first = freed / period, 1.7 * H
    cleanups = (first, first + period)
    full_at = cleanups[-1] + top / rate

    def avail(t: float) -> float:
        since = t - max((c for c in cleanups if c <= t), default=first - period)
        return top - rate * since

    cycles = tuple(Cycle(c, top - freed, freed) for c in cleanups)
    due = cleanups[-1] + period
    # Late past a tenth of its one period and at 5 GB free, or at 30 GB (above its lows less their allowance
    # of 30 % of what they free, 9.3 GB), or 5 % of a period late.
    for free, late, postpones in ((5 * GB, 0.11, False), (30 * GB, 0.11, True), (5 * GB, 0.05, True)):
        is_late = due + late * period >= late_after(cycles)
        assert may_postpone(cycles, rate, size, 0.0, 0.01 * GB, free, 0.0, is_late) is postpones
    alerted, _ = from_a_fresh_start(avail, size, full_at)
    after = [t for t in alerted if t > cleanups[-1] + period]  # from the missed cleanup on
    assert after and full_at - after[0] > 0.4 * H and full_at - after[-1] < 120.0, (after[:1], full_at)
    assert len(after) == int((after[-1] - after[0]) // 60) + 1  # one episode, on until full


@pytest.mark.parametrize("seed", [0, 1])
def test_a_rhythm_called_stopped_warns_from_then_until_full(seed):
    # A timer every 2.75 h (+-5 %) on a 160 GB disk, eight cleanups back to 77 GB free, then none. Called
    # stopped, it counts on no cleanup, and its warning stays on until the disk is full. Refused by the
    # rule above as well (past its time and its lows' level), it was set against the plain line: the two
    # near-equal forecasts took turns, the line's resting on less evidence, and the warning went off and
    # on 2-8 times.
    p = {"size": 160 * GB, "period": 2.748 * H, "jitter": 0.05, "low": 0.3245, "depth": 0.1587, "timer": True,
         "first": 0.5, "start": 0.5, "rng": seed, "cycles": 8}
    trace = fp.trace("stopping", p, fp.Noise(sigma=160 * GB * 1e-4), seed)
    run = fp.replay(trace)
    since = run.warned_since()
    assert since is not None and since <= trace.missed_at + trace.late
    after = [on for t, on in zip(run.times, run.alerting) if t >= trace.missed_at]
    turned_off = sum(1 for a, b in itertools.pairwise(after) if a and not b)
    assert turned_off == 0, turned_off


# ---- warm-up: a rhythm seen for a period or two ----------------------------------------------------------

@pytest.mark.parametrize("stops", [False, True])
def test_a_rhythm_not_measured_to_keep_up_in_warm_up_alerts_when_the_plain_line_does(stops):
    # A fresh start on a 1 TB disk at 85 % used, a GC on a 20 min timer, 60 GB written per period. Its first
    # cleanup frees half of that and the next period runs 30 % long: the second low is 48 GB under the first,
    # a decline the rhythm cannot be measured to keep up with. Every cleanup after frees what its period
    # wrote and the disk never fills, or (`stops`) none comes after the second and it is full 1 h later.
    size, rate, period = 1000 * GB, 60 * GB / (20 * 60), 20 * 60.0
    cleanups = [(600.0, 30 * GB), (600.0 + 1.3 * period, 90 * GB)]
    cleanups += [] if stops else [(cleanups[-1][0] + k * period, 60 * GB) for k in range(1, 30)]

    def avail(t: float) -> float:
        return 150 * GB - rate * t + sum(freed for at, freed in cleanups if at <= t)

    alerted, plain = from_a_fresh_start(avail, size, CFG.window)
    if not stops:
        assert plain == [] and min(avail(10.0 * k) for k in range(int(CFG.window // 10))) > 60 * GB
        assert alerted == []
    else:  # the line through everything seen decides: no later than the plain fit
        assert plain and alerted and alerted[0] <= plain[0] + 60.0, (alerted[:1], plain[:1])


def test_three_downloads_one_after_another_from_a_fresh_start_raise_no_episode():
    # A 456 GB disk with 128 GB free as the daemon starts: downloads of 20.6, 16.3 and 14.6 GB at 0.14,
    # 2.05 and 3.3 h, then only logs. The three read as a checkpoint staircase whose scatter two
    # intervals measured: its earliest ETA, built on that, warned from 4 h to 5.7 h of a disk that then
    # stayed flat.
    size, logs = 456 * GB, 0.017 * GB / H
    downloads = [(0.144 * H, 0.156 * H, 20.6 * GB), (2.047 * H, 0.064 * H, 16.3 * GB), (3.3 * H, 0.175 * H, 14.6 * GB)]

    def avail(t: float) -> float:
        got = sum(nbytes * min(max(t - start, 0.0) / took, 1.0) for start, took, nbytes in downloads)
        return 127.8 * GB - logs * t - got

    alerted, _ = from_a_fresh_start(avail, size, 12 * H)
    assert alerted == []
