"""The carried (incremental) fill trend against a full refit at every cycle, on replayed traces."""

from __future__ import annotations

import dataclasses

import pytest
from trainguard.config import Forecast
from trainguard.detectors.follow import Fit, _carried, follow_trend
from trainguard.detectors.forecast import level
from trainguard.detectors.trend import Trend, fill_trend
from trainguard.records import Severity
from trainguard.store.history import History

from tests.support import traces

H = 3600.0
CFG = Forecast()


def replay(process, hours: float = 12.0, seed: int = 3):
    """(carried trend, full refit, refitted this cycle) at every 10 s cycle after 7 h of history."""
    history, fit, out = History(None, window=CFG.window), None, []
    for t, v in process.sample(0.0, hours * H, seed=seed):
        history.record(t, {"a": v})
        before = fit
        trend, fit = follow_trend(fit, lambda since: history.points("a", since), process.size, t, CFG)
        if t >= 7 * H:
            full = fill_trend(history.points("a", t - CFG.window), process.size, t, CFG.window, CFG.min_span,
                              fit.cycles)
            out.append((t, trend, full, before is None or fit.at != before.at))  # a full fit is made at `now`
    return out


SMOOTH = {
    "steady": traces.steady(),
    "slow leak": traces.slow_leak(),
    "fill with cleanup": traces.fill_with_cleanup(),
    "keep last checkpoints": traces.keep_last_checkpoints(),
    "GC churn 85-97 %": traces.gc_churn(0.85, 0.97, 2),
}


@pytest.mark.parametrize("name", SMOOTH)
def test_the_carried_trend_equals_the_full_fit_within_its_tolerance(name):
    rows = replay(SMOOTH[name])
    for t, carried, full, _ in rows:
        assert (carried.eta is None) == (full.eta is None), (name, t / H)
        if full.eta is not None:
            # A sample off the line by 1 % of the free space is news: the ETAs agree to a few per cent.
            assert carried.eta == pytest.approx(full.eta, rel=0.04, abs=60), (name, t / H)
        assert level(carried, CFG) == level(full, CFG) or abs(full.eta - CFG.warning * 1.03) < 0.04 * full.eta


def test_checkpoint_steps_differ_by_at_most_the_full_fits_own_step():
    """The full fit of a staircase moves by up to two checkpoint periods between cycles as a write comes
    and goes (its stepped ETA or its line); the carried one stays within that of it, and most cycles
    are not refitted."""
    every = 1800.0
    rows = replay(traces.checkpoints(every_s=every))
    for t, carried, full, _ in rows:
        assert abs(carried.eta - full.eta) <= 2 * every + 60, t / H
    assert sum(r for *_, r in rows) / len(rows) < 0.3


def test_most_cycles_of_a_steady_disk_are_not_refitted():
    rows = replay(traces.steady())
    assert sum(r for *_, r in rows) / len(rows) < 0.05


def test_a_deletion_is_news_at_once():
    process = traces.from_events("deletion", 300 * traces.GiB, [(0, 20 * H, 200 * traces.GiB),
                                                                (9 * H, 30, -150 * traces.GiB)])
    rows = replay(process, hours=10)
    after = [(t, refit) for t, _, _, refit in rows if 9 * H <= t <= 9 * H + 60]
    assert any(refit for _, refit in after)
    for t, carried, full, _ in rows:
        assert (carried.eta is None) == (full.eta is None)
        if full.eta is not None:
            assert carried.eta == pytest.approx(full.eta, rel=0.04, abs=60), t / H


def test_a_staircase_that_stops_is_not_counted_down_to_full():
    """Scenario C's shape, on the pure detector: a 64 MiB disk sampled every second, a 4 MiB checkpoint
    every 2 s, a watermark cleanup at 75 % that frees 24 MiB, then the run ends at 75 % used. The
    steps are flat between them, so the writer that stopped never leaves the carried line: its ETA
    must not keep counting down to a critical "~2 s left"; a step that does not come is news."""
    cfg = Forecast(window=60.0, min_span=8.0, warning=60.0, critical=2.0, min_samples=5, evidence_ratio=3.0)
    mib = 2.0**20
    size, avail, pts, fit, stopped_at = 64 * mib, 53.4 * mib, [], None, None
    for t in range(60):
        if t in range(4, 32, 2):
            avail -= 4.13 * mib  # a checkpoint and its scratch file
        if t == 22:
            avail += 24 * mib  # the watermark cleanup: keep the last 3
        pts.append((float(t), avail))
        trend, fit = follow_trend(fit, lambda since: [p for p in pts if p[0] >= since], size, float(t), cfg)
        full = fill_trend(pts, size, float(t), cfg.window, cfg.min_span, fit.cycles)
        alert = level(trend, cfg)
        assert alert is None or alert[0] is Severity.WARNING, (t, trend)
        if stopped_at is None and t > 31 and (full is None or full.eta is None):
            stopped_at = t  # the full fit sees that the disk no longer fills
        if stopped_at is not None and t >= stopped_at + 2:  # the carried trend within a period of it
            assert trend is None or trend.eta is None, (t, trend)
            assert alert is None, (t, trend)
    assert stopped_at is not None


def test_a_carried_trend_keeps_every_field_of_the_fit_and_moves_its_times_on():
    """Each field of the last full fit reaches the carried trend (a field added to Trend included):
    the times to an event shorten by the time passed, the evidence grows by it, the rest is kept."""
    names = [f.name for f in dataclasses.fields(Trend)]
    fitted = Trend(**{name: 100.0 + i for i, name in enumerate(names)})
    prev = Fit(fitted, at=1000.0, last_ts=1000.0, anchor=0.0, size=1.0, tolerance=1.0, floor=0.0, refit_at=2000.0)
    carried = _carried(prev, 1030.0)
    shortened = {"eta", "next_cleanup_in", "eta_without_cleanup", "eta_early"}
    for name in names:
        was, now = getattr(fitted, name), getattr(carried, name)
        expected = was - 30.0 if name in shortened else was + 30.0 if name == "evidence" else was
        assert now == expected, name
