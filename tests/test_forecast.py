"""Time-to-full forecasts on synthetic histories: right ETA for steady, bursty and cleaned-up disks,
no alarm for disks that never fill."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from trainguard import config as configmod
from trainguard.detectors import DetectorInput, forecast
from trainguard.detectors.fit import least_squares
from trainguard.detectors.forecast import fill_trend
from trainguard.detectors.jumps import jumps
from trainguard.records import FsSample, FsUsage, Severity
from trainguard.store.history import History

from tests.support import traces
from tests.support.plain_fit import plain_eta
from tests.support.snapshots import GiB, mount, snapshot

H = 3600.0
WINDOW = 6 * H
T0 = 1_700_000_000.0


def trend_at(process: traces.Process, ttf: float, seed: int = 1, window: float = WINDOW, min_span: float = 1800):
    """The forecast made at the moment the process is really `ttf` seconds from full."""
    now = process.moment_with_time_to_full(ttf)
    pts = process.sample(max(0.0, now - window), now, seed=seed)
    return fill_trend(pts, process.size, now, window, min_span), process.time_to_full(now)


@pytest.mark.parametrize("ttf_h", [6, 3, 1])
def test_steady_fill(ttf_h):
    trend, real = trend_at(traces.steady(), ttf_h * H)
    assert trend.eta == pytest.approx(real, rel=0.02)
    assert trend.slope * H == pytest.approx(30 * GiB, rel=0.02)


@pytest.mark.parametrize("ttf_h", [6, 3, 1])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_checkpoint_steps_do_not_swing_the_forecast(ttf_h, seed):
    # 20 GiB every 30 min: a line fitted through the last step would say 600 GiB/h.
    process = traces.checkpoints(start_free=(600 + 3.3 * seed) * GiB)
    trend, real = trend_at(process, ttf_h * H, seed)
    assert trend.slope * H == pytest.approx(40 * GiB, rel=0.1)
    assert trend.eta == pytest.approx(real, rel=0.1)


def test_forecast_between_checkpoints_is_stable():
    """Evaluated every 5 minutes across two checkpoint periods, the rate holds still and the ETA stays
    within one checkpoint of the truth."""
    process = traces.checkpoints()
    base = process.moment_with_time_to_full(4 * H)
    for k in range(13):
        now = base + 300 * k
        trend = fill_trend(process.sample(now - WINDOW, now, seed=k), process.size, now, WINDOW, 1800)
        assert trend.slope * H == pytest.approx(40 * GiB, rel=0.1)
        assert abs(trend.eta - process.time_to_full(now)) <= 1800


@pytest.mark.parametrize("ttf_h", [3, 1])
@pytest.mark.parametrize("phase", [7, 17, 33])  # GiB; not 0, whose saw-tooth grazes zero exactly
def test_fill_with_periodic_cleanup_is_judged_before_the_next_cleanup(ttf_h, phase):
    # 40 GiB/h written, a cron job frees 60 GiB every 2 h: net 10 GiB/h, but the disk fills at 40 GiB/h
    # between cleanups, so with 30 GiB free and the next cleanup 1.5 h away it is full in 45 minutes.
    process = traces.fill_with_cleanup(start_free=(600 + phase) * GiB)
    trend, real = trend_at(process, ttf_h * H, phase)
    assert trend.eta == pytest.approx(real, rel=0.05)
    assert trend.cleanup_every == pytest.approx(2 * H, rel=0.01)
    assert trend.cleanup_frees == pytest.approx(60 * GiB, rel=0.02)


@pytest.mark.parametrize("phase", [7, 17, 33])
def test_a_cleanup_that_frees_less_than_is_written_warns_no_later_than_the_plain_fit(phase):
    # The same cron job frees 60 of the 80 GiB written between two runs: it does not keep up, so it may
    # not delay the warning past the plain fit through the window (predict_linear's line, taken at now).
    # Here its own forecast, the lows run forward, is the earlier of the two, and within 1 % of the truth.
    process = traces.fill_with_cleanup(start_free=(600 + phase) * GiB)
    trend, real = trend_at(process, 6 * H, phase)
    now = process.moment_with_time_to_full(6 * H)
    pts = process.sample(now - WINDOW, now, seed=phase)
    assert trend.bounded and trend.eta == pytest.approx(real, rel=0.01) and trend.eta <= plain_eta(pts)
    assert forecast.level(trend, configmod.parse({}, "test").forecast) is not None


def test_a_disk_that_keeps_its_last_checkpoints_never_alerts():
    """A trainer saving 20 GiB every 30 min and deleting the oldest: a saw-tooth that never fills."""
    process = traces.keep_last_checkpoints()
    config = configmod.parse({}, "test")
    alerts = 0
    for k in range(60):  # one evaluation every ~10 minutes over 10 hours, after a 7 h warm-up
        now = 7 * H + 613 * k
        pts = process.sample(now - WINDOW, now, seed=k)
        findings = detect_on(pts, process.size, now, config)
        alerts += len(findings)
    assert alerts == 0


@pytest.mark.parametrize("process", [traces.one_download(), traces.rotated_logs()], ids=lambda p: p.name)
def test_disks_that_stop_filling_or_are_rotated_never_alert(process):
    # A 100 GiB download in the middle of the window tilted a fit over the whole window to ~28 GiB/h
    # (a warning for a disk that had stopped filling); an hourly rotation keeps a fast writer in check.
    config = configmod.parse({}, "test")
    for k in range(60):
        now = 7 * H + 613 * k
        assert detect_on(process.sample(now - WINDOW, now, seed=k), process.size, now, config) == [], k


def test_a_single_write_followed_by_writing_keeps_the_later_rate():
    # 100 GiB at once, then a steady 10 GiB/h: the trend is the 10 GiB/h, not the burst spread over 6 h.
    def avail(t):
        return 300 * GiB - (100 * GiB if t >= 3 * H else 0) - 10 * GiB * max(t - 3 * H, 0) / H

    process = traces.Process("burst then steady", avail, noise=0.1 * GiB)
    now = 6 * H
    trend = fill_trend(process.sample(0, now), process.size, now, WINDOW, 1800)
    assert trend.slope * H == pytest.approx(10 * GiB, rel=0.1)


def test_noise_on_a_full_but_idle_disk_never_alerts():
    process = traces.Process("idle", lambda t: 20 * GiB, noise=0.5 * GiB)
    config = configmod.parse({}, "test")
    for k in range(30):
        now = 7 * H + 977 * k
        assert detect_on(process.sample(now - WINDOW, now, seed=k), process.size, now, config) == []


def test_one_recent_deletion_keeps_the_writers_pace():
    # Filling at 30 GiB/h; 200 GiB deleted 10 minutes ago. The forecast keeps 30 GiB/h and counts from
    # the new free space, without assuming another deletion.
    def avail(t):
        return 300 * GiB - 30 * GiB * t / H + (200 * GiB if t >= 5 * H else 0)

    process = traces.Process("one deletion", avail, noise=0.2 * GiB)
    now = 5 * H + 600
    trend = fill_trend(process.sample(now - WINDOW, now), process.size, now, WINDOW, 1800)
    assert trend.slope * H == pytest.approx(30 * GiB, rel=0.05)
    assert trend.eta == pytest.approx(avail(now) / (30 * GiB) * H, rel=0.05)
    assert trend.cleanup_every is None


def test_an_older_deletion_is_a_change_point():
    # Before the deletion the disk filled at 50 GiB/h; since then (2 h ago) at 10 GiB/h.
    def avail(t):
        return 400 * GiB - 50 * GiB * t / H if t < 4 * H else 600 * GiB - 10 * GiB * (t - 4 * H) / H

    process = traces.Process("change point", avail, noise=0.1 * GiB)
    now = 6 * H
    trend = fill_trend(process.sample(0, now), process.size, now, WINDOW, 1800)
    assert trend.slope * H == pytest.approx(10 * GiB, rel=0.05)
    assert trend.span == pytest.approx(2 * H, abs=20)


def test_a_slow_rm_over_several_samples_is_one_deletion():
    # 60 GiB freed over 2 minutes (12 samples), every 2 h, on top of a 40 GiB/h writer.
    def avail(t):
        done, into = divmod(t, 2 * H)
        return 600 * GiB - 40 * GiB * t / H + 60 * GiB * (done + min(into / 120, 1.0)) - 60 * GiB

    process = traces.Process("slow rm", avail)
    now = 7 * H
    trend = fill_trend(process.sample(now - WINDOW, now), process.size, now, WINDOW, 1800)
    assert trend.cleanup_every == pytest.approx(2 * H, rel=0.02)
    assert trend.cleanup_frees == pytest.approx(60 * GiB, rel=0.05)


def test_a_cleanup_between_a_fast_writers_checkpoints_is_one_deletion():
    # Minute points of a disk written 2.4 GB at a time every 4 min, a GC freeing 5.4 GB a minute after a write
    # (spread over two minute means), the level then rising by noise for two points until the next write.
    # The median of the five points before the GC still had the level of two writes back, and the five after
    # it reached into the next write: neither says where the GC took the level, and it went uncounted.
    gb = 1e9
    levels = [12.56, 10.13, 10.12, 10.12, 9.73, 7.80, 7.79, 7.80, 9.18, 10.76, 10.76, 10.77, 8.37, 8.36, 8.36]
    pts = [(60.0 * k, v * gb) for k, v in enumerate(levels)]
    [gc] = jumps(pts, 52 * gb, rising=True)
    assert gc.index == 9 and gc.start == 6  # it ends where it got to, not at the noise after it
    assert gc.freed == pytest.approx(2.97 * gb, rel=0.02)


def test_the_plain_line_through_history_is_the_line_through_its_samples():
    # History keeps the samples older than 15 min as minute means: a line through its points, each counted
    # once, leans toward the fine recent ones (a saw-tooth's last cleanup, here: its ETA 2.7 h where the
    # samples' line says 1.2 h). Weighed by the time each stands for, it is the samples' line.
    history = History(None, window=WINDOW)
    period, gross, freed = H, 12.5 * GiB / H, 8.8 * GiB
    raw = []
    for k in range(int(2.33 * H / 10)):
        t = 10.0 * k
        v = 9 * GiB - gross * t + freed * math.floor(t / period + 0.9)
        history.record(T0 + t, {"a": v})
        raw.append((T0 + t, v))
    n = len(raw)
    mt, mv = sum(t for t, _ in raw) / n, sum(v for _, v in raw) / n
    slope = sum((t - mt) * (v - mv) for t, v in raw) / sum((t - mt) ** 2 for t, _ in raw)
    points = history.points("a", 0)
    assert len(points) < n / 3  # averaged
    rate, level = least_squares(points)
    assert rate == pytest.approx(-slope, rel=0.01)
    assert level == pytest.approx(mv + slope * (raw[-1][0] - mt), rel=0.01)


def test_a_cleanup_that_stopped_coming_is_not_counted_on():
    # Cleanups every hour until 3.5 h ago; now only the 40 GiB/h writer.
    def avail(t):
        return 500 * GiB - 40 * GiB * t / H + 35 * GiB * math.floor(min(t, 3 * H) / H)

    process = traces.Process("stopped cleanup", avail)
    now = 6.5 * H
    trend = fill_trend(process.sample(now - WINDOW, now), process.size, now, WINDOW, 1800)
    assert trend.eta == pytest.approx(avail(now) / (40 * GiB) * H, rel=0.05)


def test_no_forecast_before_min_span_or_with_too_few_points():
    process = traces.steady()
    assert fill_trend(process.sample(0, 1700), process.size, 1700, WINDOW, 1800) is None
    assert fill_trend(process.sample(0, 3600, interval=1800), process.size, 3600, WINDOW, 1800) is None
    assert fill_trend(process.sample(0, 1800), process.size, 1800, WINDOW, 1800) is not None


def test_a_disk_getting_emptier_has_no_eta():
    process = traces.Process("draining", lambda t: 100 * GiB + 10 * GiB * t / H)
    trend = fill_trend(process.sample(0, 3 * H), process.size, 3 * H, WINDOW, 1800)
    assert trend.eta is None and trend.slope < 0


def detect_on(pts, size, now, config, active=None):
    h = History(None, window=config.forecast.window)
    for ts, value in pts:
        h.record(T0 + ts, {"fs.avail_bytes:/data": value})
    avail = int(pts[-1][1])
    usage = FsUsage(size_bytes=int(size), used_bytes=int(size) - avail, avail_bytes=avail, inodes_total=0,
                    inodes_used=0, inodes_free=0)
    snap = snapshot(FsSample(mount("/data"), T0 + now, usage), ts=T0 + now)
    return forecast.detect(DetectorInput(config, h, snap, T0 + now, active or {}))


@pytest.mark.parametrize("ttf_h, severity", [(8, None), (5, Severity.WARNING), (0.75, Severity.CRITICAL)])
def test_alert_levels(ttf_h, severity):
    process = traces.steady()
    now = process.moment_with_time_to_full(ttf_h * H)
    config = configmod.parse({}, "test")
    found = detect_on(process.sample(now - WINDOW, now), process.size, now, config)
    assert (found[0].severity if found else None) is severity
    if found:
        f = found[0]
        assert f.key == "fs.forecast:/data" and f.threshold == (H if severity is Severity.CRITICAL else 6 * H)
        assert f"~{'45m' if ttf_h < 1 else '5h'}" in f.summary and "30.0 GiB/h" in f.summary
        assert f.details["eta_seconds"] == pytest.approx(ttf_h * H, rel=0.02)


def test_an_active_forecast_alert_clears_only_well_past_its_limit():
    process = traces.steady()
    now = process.moment_with_time_to_full(6.5 * H)
    config = configmod.parse({}, "test")
    pts = process.sample(now - WINDOW, now)
    assert detect_on(pts, process.size, now, config) == []
    (f,) = detect_on(pts, process.size, now, config, active={"fs.forecast:/data": Severity.WARNING})
    assert f.severity is Severity.WARNING


def test_cleanup_regime_is_named_in_the_summary():
    process = traces.fill_with_cleanup()
    now = process.moment_with_time_to_full(1 * H)
    (f,) = detect_on(process.sample(now - WINDOW, now), process.size, now, configmod.parse({}, "test"))
    assert re.search(r"~1h(0\dm)? left at (39|40)\.\d GiB/h, counting the cleanup that frees (5[89]|60)\.\d GiB every 2h",
                     f.summary), f.summary


def test_a_sawtooth_alert_says_when_the_next_cleanup_is_due_and_what_if_it_does_not_come():
    from trainguard.i18n import tr
    from trainguard.notify.texts import texts_for

    process = traces.fill_with_cleanup()
    now = process.moment_with_time_to_full(5 * H)
    (f,) = detect_on(process.sample(now - WINDOW, now), process.size, now, configmod.parse({}, "test"))
    d = f.details
    assert d["cleanup_every_seconds"] == pytest.approx(2 * H, abs=60) and not d["cleanup_missed"]
    next_due = 2 * H - now % (2 * H)  # the cron runs every 2 h from the start
    assert d["next_cleanup_in_seconds"] == pytest.approx(next_due, abs=120)
    # Without the next cleanup, only the free space at the writer's pace is left.
    assert d["eta_without_cleanup_seconds"] == pytest.approx(process.avail(now) / (40 * GiB / H), rel=0.05)
    en, zh = texts_for(f, tr("en")), texts_for(f, tr("zh"))
    assert "The next is expected in about" in en.why and "if it does not come" in en.why
    assert "下一次预计" in zh.why and "如果它没有来" in zh.why


def test_disabled_or_unresponsive_means_no_forecast():
    process = traces.steady()
    now = process.moment_with_time_to_full(H / 2)
    pts = process.sample(now - WINDOW, now)
    assert detect_on(pts, process.size, now, configmod.parse({"forecast": {"enabled": False}}, "test")) == []
    h = History(None)
    for ts, value in pts:
        h.record(T0 + ts, {"fs.avail_bytes:/data": value})
    snap = snapshot(FsSample(mount("/data"), T0 + now, None, responsive=False, unresponsive_since=T0))
    assert forecast.detect(DetectorInput(configmod.parse({}, "test"), h, snap, T0 + now, {})) == []


def test_the_metrics_reuse_the_detectors_fit():
    from trainguard.service.daemon import fill_etas

    process = traces.steady()
    now = process.moment_with_time_to_full(5 * H)
    config = configmod.parse({}, "test")
    h = History(None, window=config.forecast.window)
    for ts, value in process.sample(now - WINDOW, now):
        h.record(T0 + ts, {"fs.avail_bytes:/data": value})
    usage = FsUsage(size_bytes=int(process.size), used_bytes=0, avail_bytes=int(value), inodes_total=0,
                    inodes_used=0, inodes_free=0)
    inp = DetectorInput(config, h, snapshot(FsSample(mount("/data"), T0 + now, usage), ts=T0 + now), T0 + now)
    (finding,) = forecast.detect(inp)
    fitted = inp.trends["/data"]
    assert finding.details["eta_seconds"] == round(fitted.eta)
    assert fill_etas(inp) == {"/data": fitted.eta}
    # What the metrics read is the memo itself, not a second fit of the same points.
    inp.trends["/data"] = dataclasses.replace(fitted, eta=123.0)
    assert fill_etas(inp) == {"/data": 123.0}


def alert_episodes(process, start, end, every=900.0, seed=1):
    """Forecast alert episodes of a daemon that has sampled the process since t=0, evaluated every
    `every` seconds from `start` to `end` (the detector's own decision, hysteresis included)."""
    cfg = configmod.parse({}, "test").forecast
    pts = process.sample(0.0, end, seed=seed)
    count, active, first = 0, None, None
    t = start
    while t <= end:
        window = [p for p in pts if t - WINDOW <= p[0] <= t]
        alert = forecast.level(fill_trend(window, process.size, t, WINDOW, cfg.min_span), cfg, active)
        if alert and active is None:
            count += 1
            first = t
        active = alert[0] if alert else None
        t += every
    return count, first


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("family", ["churn 60-72", "churn 85-97", "download", "bursty logs"])
def test_never_filling_families_raise_no_alert(family, seed):
    process = {"churn 60-72": lambda: traces.gc_churn(0.60, 0.72, seed),
               "churn 85-97": lambda: traces.gc_churn(0.85, 0.97, seed),
               "download": lambda: traces.download_then_flat(seed),
               "bursty logs": lambda: traces.bursty_logs(seed)}[family]()
    assert alert_episodes(process, WINDOW, 30 * H, seed=seed)[0] == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_alert_in_warm_up(seed):
    """The daemon starts with the run: installs and a dataset extraction in the first hour of history
    must not be extrapolated into an alarm."""
    assert alert_episodes(traces.warm_up(seed), 600.0, 10 * H, every=300.0, seed=seed)[0] == 0


def test_a_download_in_progress_is_not_yet_a_trend():
    process = traces.download_then_flat(1)
    trend = fill_trend(process.sample(0, 4.5 * H), process.size, 4.5 * H, WINDOW, 1800)
    assert trend.evidence < 2 * H  # the download's own span, not the quiet hours before it
    assert forecast.level(trend, configmod.parse({}, "test").forecast) is None


@pytest.mark.parametrize("make", [traces.steady, traces.slow_leak, traces.checkpoints], ids=lambda m: m.__name__)
def test_filling_families_warn_six_hours_ahead_once(make):
    process = make()
    full_at = process.time_to_full(0.0, step=60.0)
    count, first = alert_episodes(process, WINDOW, full_at - 600, every=120.0)
    assert count == 1 and full_at - first >= 5.9 * H


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_slow_leak_eta(seed):
    process = traces.slow_leak(rate_per_h=(1 + seed / 2) * GiB)
    trend, real = trend_at(process, 6 * H, seed)
    assert trend.eta == pytest.approx(real, rel=0.05)
